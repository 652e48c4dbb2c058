//! An SQS-compatible queue engine: one tenant's queues, in memory, made
//! durable by an optional journal (see [`journal`]). A request is parsed
//! into a typed [`requests::Request`], each queue's rules are the pure state
//! machine in [`queue`], and this module journals what they decide;
//! [`super::protocol`] adapts the wire protocols.
//!
//! Durability before visibility: an action submits its changes to the
//! journal while it holds the state lock (so the journal commits in the
//! order the engine decided), and a change that adds (a message, a queue, an
//! attribute, a deletion) reaches memory only once committed. Changes that
//! hide (a receive taking messages, a queue being deleted) apply at once and
//! are undone when the commit fails, so a failed write leaves the engine as
//! it was. Queue-level actions are serialised by `meta`.

pub mod attributes;
mod ids;
pub mod journal;
pub mod message;
mod message_actions;
mod move_tasks;
mod params;
mod permissions;
pub mod queue;
mod queue_actions;
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
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use sless_model::queue_service::Durability;

use crate::error::SqsError;
use journal::{Change, Journal, Pending};
use queue::{Message, Put, Queue};
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

/// Where an engine keeps its journal, and when a change counts as kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub journal: std::path::PathBuf,
    pub durability: Durability,
}

struct State {
    queues: BTreeMap<String, Queue>,
    next_seq: u64,
    /// When each queue was last deleted (ms): its name is not taken again
    /// for 60 s, as in SQS. In memory: a restart forgets it.
    deleted: HashMap<String, u64>,
    /// Finished message move tasks, for ListMessageMoveTasks (in memory).
    tasks: Vec<move_tasks::MoveTask>,
}

fn no_such_queue() -> SqsError {
    SqsError::queue_does_not_exist("The specified queue does not exist.")
}

impl State {
    fn queue(&self, name: &str) -> Result<&Queue, SqsError> {
        self.queues.get(name).filter(|q| !q.deleting).ok_or_else(no_such_queue)
    }

    fn queue_mut(&mut self, name: &str) -> Result<&mut Queue, SqsError> {
        self.queues
            .get_mut(name)
            .filter(|q| !q.deleting)
            .ok_or_else(no_such_queue)
    }

    /// The queue `name` if it is still the creation `incarnation`.
    fn incarnation_mut(&mut self, name: &str, incarnation: u64) -> Option<&mut Queue> {
        self.queue_mut(name).ok().filter(|q| q.incarnation == incarnation)
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}

pub struct Engine {
    config: EngineConfig,
    state: Mutex<State>,
    journal: Option<Journal>,
    /// Serialises queue-level actions (create, delete, purge, attributes, tags).
    meta: tokio::sync::Mutex<()>,
}

fn reply(result: impl Serialize) -> Result<Value, SqsError> {
    serde_json::to_value(result).map_err(|e| SqsError::internal(format!("encoding a result: {e}")))
}

impl Engine {
    /// An engine with its journal replayed, or in memory only without
    /// `persistence`.
    pub fn open(config: EngineConfig, persistence: Option<&Persistence>) -> Result<Arc<Self>, SqsError> {
        let mut state = State {
            queues: BTreeMap::new(),
            next_seq: 1,
            deleted: HashMap::new(),
            tasks: Vec::new(),
        };
        let journal = match persistence {
            None => None,
            Some(Persistence { journal, durability }) => {
                let (journal, queues, messages) = Journal::open(journal, *durability)?;
                for q in queues {
                    let incarnation = state.take_seq();
                    state.queues.insert(q.name.clone(), Queue::new(q, incarnation));
                }
                for (queue, seq, stored) in messages {
                    if let Some(q) = state.queues.get_mut(&queue) {
                        state.next_seq = state.next_seq.max(seq + 1);
                        q.messages.insert(seq, Message::new(stored));
                    }
                }
                Some(journal)
            }
        };
        Ok(Arc::new(Self {
            config,
            state: Mutex::new(state),
            journal,
            meta: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Runs one action of the JSON protocol's shape.
    pub async fn handle(&self, action: &str, input: &Value) -> Result<Value, SqsError> {
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
                QueueRequest::ChangeMessageVisibility(r) => reply(self.change_visibility(&name, &r)?),
                QueueRequest::ChangeMessageVisibilityBatch(r) => reply(self.change_visibility_batch(&name, r)?),
                QueueRequest::AddPermission(r) => reply(self.add_permission(&name, r).await?),
                QueueRequest::RemovePermission(r) => reply(self.remove_permission(&name, &r).await?),
            },
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Submits `changes` to the journal; call it under the state lock.
    fn submit(&self, changes: Vec<Change>) -> Option<Pending> {
        match &self.journal {
            Some(journal) if !changes.is_empty() => Some(journal.submit(changes)),
            _ => None,
        }
    }

    async fn committed(pending: Option<Pending>) -> Result<(), SqsError> {
        match pending {
            Some(p) => p.committed().await,
            None => Ok(()),
        }
    }

    /// Makes committed messages visible in queue `name` (unless it was
    /// deleted meanwhile).
    fn deliver(&self, name: &str, incarnation: u64, puts: Vec<Put>) {
        if let Some(q) = self.lock().incarnation_mut(name, incarnation) {
            q.deliver(puts);
        }
    }

    fn with_queue<R>(&self, name: &str, f: impl FnOnce(&mut Queue, u64) -> Result<R, SqsError>) -> Result<R, SqsError> {
        let mut state = self.lock();
        f(state.queue_mut(name)?, now_ms())
    }

    fn queue_url(&self, name: &str) -> String {
        queue_url(&self.config.base_url, &self.config.account_id, name)
    }

    /// The name of this engine's existing queue whose ARN is `arn`.
    fn queue_named_by<'a>(&self, state: &State, arn: &'a str) -> Option<&'a str> {
        let name = arn.rsplit(':').next()?;
        (arn == self.queue_arn(name) && state.queue(name).is_ok()).then_some(name)
    }

    fn queue_arn(&self, name: &str) -> String {
        format!("arn:aws:sqs:{}:{}:{name}", self.config.region, self.config.account_id)
    }
}

#[cfg(test)]
mod tests;
