//! An SQS-compatible queue engine: one tenant's queues, in memory, made
//! durable by a replicated log (see [`raft`]). A request is parsed into a
//! typed [`requests::Request`]; a request that changes anything becomes one
//! [`command::Command`], which the log commits before the
//! [`machine::Machine`] applies it, so what a reply says is durable, and a
//! command whose commit failed changed nothing. Each queue's rules are the
//! pure state machine in [`queue`]; [`super::protocol`] adapts the wire
//! protocols.

pub mod attributes;
pub mod command;
mod ids;
pub mod journal;
pub mod machine;
pub mod message;
mod message_actions;
mod move_tasks;
mod params;
mod permissions;
pub mod queue;
mod queue_actions;
pub mod raft;
pub use queue_actions::MAX_QUEUES;
pub mod records;
pub mod requests;

/// The URL of queue `name` of an engine (or a queue service) reached at
/// `base_url` for `account_id`.
pub fn queue_url(base_url: &str, account_id: &str, name: &str) -> String {
    format!("{}/{account_id}/{name}", base_url.trim_end_matches('/'))
}
pub mod responses;
pub mod server;

use crate::now_ms;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use sless_model::queue_service::Durability;

use crate::error::SqsError;
use command::{Command, Op, Reply};
use machine::{Identity, Machine};
use queue::Queue;
use raft::state_machine::Applied;
use requests::{QueueRequest, Request};
use sless_runtime::sync::Unpoisoned;

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Account id in queue URLs and ARNs (the tenant, as seed 000 has it).
    pub account_id: String,
    pub region: String,
    /// Public base of queue URLs, e.g. `http://127.0.0.1:9324/sqs/acme`.
    pub base_url: String,
}

/// Where an engine keeps its store, and when a change counts as kept. The
/// replica's files are in the directory `journal` names with the extension
/// `raft`; a journal of an earlier version at `journal` is read into it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub journal: std::path::PathBuf,
    pub durability: Durability,
}

pub struct Engine {
    config: EngineConfig,
    identity: Identity,
    /// The queues, as the commands applied so far left them (shared with
    /// the replica's state machine, which applies them).
    machine: Arc<Mutex<Applied>>,
    /// The replica that commits commands; none for an engine in memory.
    replica: Option<raft::Replica>,
    /// Where the other replicas reach this one, if there are others.
    peer_server: Option<raft::peers::PeerServer>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Its files' lock is released once the replica has stopped.
        if let Some(replica) = self.replica.take()
            && !raft::stopped(&replica.raft.metrics().borrow())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { replica.raft.shutdown().await });
        }
    }
}

/// The time a command is made at: this clock, or the state's when that is
/// ahead (the clock of another replica that led, or before a step back):
/// delays, visibility and retention then count from the same time that
/// applying will.
fn clock(machine: &Machine) -> u64 {
    now_ms().max(machine.clock_ms)
}

fn reply(result: impl Serialize) -> Result<Value, SqsError> {
    serde_json::to_value(result).map_err(|e| SqsError::internal(format!("encoding a result: {e}")))
}

impl Engine {
    /// An engine whose queues live in memory only.
    pub fn in_memory(config: EngineConfig) -> Arc<Self> {
        let identity = Identity {
            account_id: config.account_id.clone(),
            region: config.region.clone(),
        };
        Arc::new(Self {
            machine: Arc::new(Mutex::new(Applied::new(Machine::new(identity.clone())))),
            config,
            identity,
            replica: None,
            peer_server: None,
        })
    }

    /// An engine with its store's state, in memory only without
    /// `persistence`. A replica without files starts from a journal of an
    /// earlier version, if there is one.
    pub async fn open(config: EngineConfig, persistence: Option<&Persistence>) -> Result<Arc<Self>, SqsError> {
        Self::open_replica(config, persistence, None).await
    }

    /// An engine that is one of `replication`'s replicas, served to the
    /// others on `peer_listen` (or, without `replication`, the only one).
    pub async fn open_replica(
        config: EngineConfig,
        persistence: Option<&Persistence>,
        replication: Option<(raft::Replication, std::net::SocketAddr)>,
    ) -> Result<Arc<Self>, SqsError> {
        let Some(Persistence { journal, durability }) = persistence.cloned() else {
            return Ok(Self::in_memory(config));
        };
        let identity = Identity {
            account_id: config.account_id.clone(),
            region: config.region.clone(),
        };
        let dir = journal.with_extension("raft");
        // The first replica starts the queue service; the others join it.
        let first = match &replication {
            None => Some(openraft::BasicNode::default()),
            Some((r, _)) => (r.me == 1).then(|| openraft::BasicNode::new(r.peers.get(&1).map_or("", String::as_str))),
        };
        if let Some((r, _)) = &replication
            && first.is_some()
            && raft::is_new(&dir)
        {
            raft::refuse_a_second_start(r).await?;
        }
        // Reading an earlier store reads the disk: off the async runtime.
        let lock = tokio::task::spawn_blocking({
            let (dir, identity) = (dir.clone(), identity.clone());
            move || {
                std::fs::create_dir_all(&dir).map_err(journal::journal_error)?;
                let lock = journal::lock(&dir.join("raft"))?;
                // Only the first replica reads (and then removes) a store
                // of an earlier version: the others join it.
                if let Some(node) = first {
                    if raft::is_new(&dir) {
                        let earlier = journal::read_earlier(&journal, &identity)?;
                        let machine = earlier.unwrap_or_else(|| Machine::new(identity.clone()));
                        raft::bootstrap(&dir, &machine, node)?;
                    }
                    // Also after a crash between the bootstrap and this.
                    journal::remove_earlier(&journal)?;
                }
                Ok::<_, SqsError>(lock)
            }
        })
        .await
        .map_err(journal::journal_error)??;
        let peers = replication.as_ref().map(|(r, _)| r);
        let replica = raft::Replica::start(dir, durability, identity.clone(), lock, peers).await?;
        let listener = match &replication {
            Some((_, listen)) => {
                let cannot = |e: std::io::Error| {
                    SqsError::internal(format!("cannot listen for the other replicas on {listen}: {e}"))
                };
                let listener = tokio::net::TcpListener::bind(listen).await.map_err(cannot)?;
                let addr = listener.local_addr().map_err(cannot)?;
                Some((listener, addr))
            }
            None => None,
        };
        let (raft, heard) = (replica.raft.clone(), replica.heard_leader.clone());
        let token = replication.map(|(r, _)| r.token).unwrap_or_default();
        let engine = Arc::new_cyclic(|weak| Self {
            machine: replica.state.shared(),
            peer_server: listener.map(|(l, addr)| raft::peers::serve(l, addr, raft, weak.clone(), &token, heard)),
            config,
            identity,
            replica: Some(replica),
        });
        Ok(engine)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Stops the replica at once rather than when the last reference goes;
    /// its files are free for another process shortly after.
    pub async fn stop(&self) {
        if let Some(replica) = &self.replica
            && let Err(e) = replica.raft.shutdown().await
        {
            tracing::debug!(error = %e, "stopping a stopped replica");
        }
    }

    /// Runs one action of the JSON protocol's shape: here, or at the
    /// leader when another replica leads.
    pub async fn handle(&self, action: &str, input: &Value) -> Result<Value, SqsError> {
        let Some(replica) = &self.replica else {
            return self.handle_here(action, input).await;
        };
        loop {
            if let Some(answer) = replica.at_leader(action, input).await? {
                return Ok(answer);
            }
            match self.handle_here(action, input).await {
                // This replica, handing its leadership over, made no change:
                // the request goes where the leadership went.
                Err(e) if raft::unrun(&e) => {}
                answer => return answer,
            }
        }
    }

    /// Hands this replica's leadership over before it stops (see
    /// [`raft::Replica::hand_over`]): the replica that leads then.
    pub async fn hand_over(&self) -> Option<raft::NodeId> {
        self.replica.as_ref()?.hand_over().await
    }

    /// Why this engine cannot take its share of requests yet, if it
    /// cannot: a replica of several serves once it is a voter that knows
    /// its leader (a readiness probe's answer).
    pub fn unready(&self) -> Option<String> {
        self.replica.as_ref().and_then(raft::Replica::unready)
    }

    /// Whether this engine is a replica that another one leads (it passes
    /// requests on): its answers say so to the gateway (see
    /// [`crate::link::FOLLOWER`]).
    pub fn follows(&self) -> bool {
        self.replica.as_ref().is_some_and(raft::Replica::follows)
    }

    /// The address of this replica's peer port, if it has peers.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.peer_server.as_ref().map(|p| p.addr)
    }

    /// Runs one action of the JSON protocol's shape on this replica.
    pub async fn handle_here(&self, action: &str, input: &Value) -> Result<Value, SqsError> {
        match Request::parse(action, input)? {
            Request::CreateQueue(r) => reply(self.create_queue(r).await?),
            Request::GetQueueUrl(r) => reply(self.get_queue_url(&r)?),
            Request::ListQueues(r) => reply(self.list_queues(&r)?),
            Request::StartMessageMoveTask(r) => reply(self.start_message_move_task(r).await?),
            Request::ListMessageMoveTasks(r) => reply(self.list_message_move_tasks(&r)?),
            Request::CancelMessageMoveTask(r) => reply(self.cancel_message_move_task(&r)?),
            Request::OnQueue(name, request) => match request {
                QueueRequest::DeleteQueue => reply(self.delete_queue(&name).await?),
                QueueRequest::PurgeQueue => reply(self.purge_queue(&name).await?),
                QueueRequest::GetQueueAttributes(r) => reply(self.get_queue_attributes(&name, &r)?),
                QueueRequest::SetQueueAttributes(r) => reply(self.set_queue_attributes(&name, r).await?),
                QueueRequest::TagQueue(r) => reply(self.tag_queue(&name, r).await?),
                QueueRequest::UntagQueue(r) => reply(self.untag_queue(&name, r).await?),
                QueueRequest::ListQueueTags => reply(self.list_queue_tags(&name)?),
                QueueRequest::ListDeadLetterSourceQueues => reply(self.list_dead_letter_sources(&name)?),
                QueueRequest::SendMessage(r) => reply(self.send_message(&name, r).await?),
                QueueRequest::SendMessageBatch(r) => reply(self.send_message_batch(&name, r).await?),
                QueueRequest::ReceiveMessage(r) => reply(self.receive_message(&name, r).await?),
                QueueRequest::Peek(r) => reply(self.peek_messages(&name, &r)?),
                QueueRequest::DeleteMessage(r) => reply(self.delete_message(&name, r).await?),
                QueueRequest::DeleteMessageBatch(r) => reply(self.delete_message_batch(&name, r).await?),
                QueueRequest::ChangeMessageVisibility(r) => reply(self.change_visibility(&name, r).await?),
                QueueRequest::ChangeMessageVisibilityBatch(r) => reply(self.change_visibility_batch(&name, r).await?),
                QueueRequest::AddPermission(r) => reply(self.add_permission(&name, r).await?),
                QueueRequest::RemovePermission(r) => reply(self.remove_permission(&name, &r).await?),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Applied> {
        self.machine.lock_unpoisoned()
    }

    /// Commits `op`, made now, and applies it: its reply.
    async fn execute(&self, op: Op) -> Result<Reply, SqsError> {
        let now = clock(&self.lock());
        self.execute_at(now, op).await
    }

    /// Commits `op`, made at `now_ms`, and applies it.
    async fn execute_at(&self, now_ms: u64, op: Op) -> Result<Reply, SqsError> {
        let command = Command { now_ms, op };
        match &self.replica {
            Some(replica) => replica.propose(command).await,
            None => self.lock().apply(command),
        }
    }

    fn with_queue<R>(&self, name: &str, f: impl FnOnce(&Queue, u64) -> Result<R, SqsError>) -> Result<R, SqsError> {
        let machine = self.lock();
        f(machine.queue(name)?, clock(&machine))
    }

    fn queue_url(&self, name: &str) -> String {
        queue_url(&self.config.base_url, &self.config.account_id, name)
    }

    fn queue_arn(&self, name: &str) -> String {
        self.identity.queue_arn(name)
    }
}

#[cfg(test)]
mod tests;
