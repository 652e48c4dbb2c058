//! Replication of an engine's commands by Raft, with openraft: the
//! replicated log holds [`Command`]s, and each replica's state machine is
//! a [`Machine`] that applies them in log order, so every replica ends in
//! the same queues. A command is acknowledged once a majority holds it
//! (see [`log_store`] for what "holds" means under each durability) and the
//! leader applied it; its reply is the leader's. Snapshots are the same
//! files the single journal compacts into (see [`state_machine`]).

// openraft's traits fix their error types (`StorageError`, `RPCError`), which are large.
#[allow(clippy::result_large_err)]
pub mod log_store;
#[cfg(test)]
#[allow(clippy::result_large_err)]
pub mod memory_network;
#[allow(clippy::result_large_err)]
pub mod network;
pub mod peers;
#[allow(clippy::result_large_err)]
pub mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use openraft::error::{ClientWriteError, RaftError};
use openraft::{
    BasicNode, CommittedLeaderId, Config, LogId, Membership, Raft, SnapshotMeta, SnapshotPolicy, StoredMembership,
};
use serde::{Deserialize, Serialize};
use sless_model::queue_service::Durability;
use tokio::sync::{mpsc, oneshot, watch};

use super::command::{Command, Reply};
use super::journal::journal_error;
use super::journal::log::write_snapshot_file;
use super::machine::{Identity, Machine};
use crate::error::SqsError;
use log_store::{LogStore, Probe};
use state_machine::StateMachine;

/// A replica's id within its queue service (1, 2, 3…).
pub type NodeId = u64;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Commands,
        R = Outcome,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// The commands of concurrent requests, committed as one log entry: the
/// replica appends and syncs once for all of them (group commit).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Commands(pub Vec<Command>);

/// What applying a log entry gave: each command's reply, in order (none
/// for Raft's own entries). It stays on the replica that applied it: the
/// leader hands the replies to the requests that made the commands, and
/// they never cross the network (openraft only asks that they could), so
/// it encodes as nothing.
#[derive(Debug, Default)]
pub struct Outcome(pub Vec<Result<Reply, SqsError>>);

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <()>::deserialize(deserializer)?;
        Ok(Self(Vec::new()))
    }
}

/// The timing every replica of a queue service runs with: an append (a
/// follower's write and sync included) must answer within the heartbeat.
/// A follower that heard nothing from its leader for the leader's lease
/// (openraft takes the longest election timeout) and then its own
/// election timeout stands for election: a leader lost is replaced after
/// 1.5–2 s.
pub fn config() -> Result<Arc<Config>, SqsError> {
    let config = Config {
        cluster_name: "sless-queues".into(),
        heartbeat_interval: 250,
        election_timeout_min: 500,
        election_timeout_max: LEASE.as_millis() as u64,
        install_snapshot_timeout: 5000,
        // An append's RPC, the follower's sync included, must answer within
        // the heartbeat (openraft 0.9 times it out then); the network sends
        // about 512 KiB of these entries at a time (network::APPEND_BUDGET).
        max_payload_entries: 64,
        // The state machine's log store triggers snapshots by size.
        snapshot_policy: SnapshotPolicy::Never,
        max_in_snapshot_log_to_keep: 0,
        ..Default::default()
    };
    config
        .validate()
        .map(Arc::new)
        .map_err(|e| SqsError::internal(format!("replication settings: {e}")))
}

/// The longest election timeout, which openraft also takes for the leader's
/// lease: a replica that heard from its leader, or became the leader,
/// within it grants no vote to another.
const LEASE: Duration = Duration::from_secs(1);

/// Commits `commands` through `raft` as one entry and waits until the
/// leader applied them: their replies. A replica that is not the leader
/// answers a retryable error naming the leader, if it knows one.
pub async fn write(raft: &Raft<TypeConfig>, commands: Commands) -> Result<Vec<Result<Reply, SqsError>>, SqsError> {
    let Ok(written) = tokio::time::timeout(COMMIT_WAIT, raft.client_write(commands)).await else {
        return Err(SqsError::unavailable(
            "the queue service's replicas did not commit the change in time; retry",
        ));
    };
    match written {
        Ok(written) => Ok(written.data.0),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => Err(not_leader(forward.leader_id)),
        Err(e) => {
            tracing::error!(error = %e, "replicating a command failed");
            Err(SqsError::unavailable(
                "the queue service's replicas cannot commit now; retry",
            ))
        }
    }
}

/// Commits one command through `raft`: its reply.
pub async fn propose(raft: &Raft<TypeConfig>, command: Command) -> Result<Reply, SqsError> {
    write(raft, Commands(vec![command]))
        .await?
        .pop()
        .unwrap_or_else(|| Err(SqsError::internal("a command was applied without a reply")))
}

/// A command waiting to be committed, since when, and who waits for its reply.
type Waiting = (Command, Instant, oneshot::Sender<Result<Reply, SqsError>>);

/// Most commands in one log entry…
const MAX_GROUP: usize = 512;
/// …and about the most bytes (one command may be larger alone).
const MAX_GROUP_BYTES: usize = 256 << 10;
/// Most commands waiting to be committed; more are answered 503.
const MAX_WAITING: usize = 8192;

/// What a leader handing over answers the commands it did not commit: the
/// request may go to its successor as if never made (see [`unrun`]).
const UNRUN: &str = "this replica is handing the queue service's leadership over and did not make the change; retry";

/// Whether `e` says a change was not made, because the replica, handing
/// its leadership over, commits no more: the request may be run elsewhere.
pub fn unrun(e: &SqsError) -> bool {
    e.message == UNRUN
}

/// Commits the commands of concurrent requests together: while one entry
/// is being committed, the next gathers every command that arrives. Once
/// `closed` holds true (taken while an entry is committed), it commits
/// no more and answers [`UNRUN`].
async fn group_commit(
    raft: Raft<TypeConfig>,
    mut waiting: mpsc::Receiver<Waiting>,
    closed: Arc<tokio::sync::Mutex<bool>>,
) {
    let mut next = None;
    loop {
        let Some(first) = next.take().or(waiting.recv().await) else {
            return;
        };
        let mut bytes = first.0.weight();
        let mut group = vec![first];
        while group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            match waiting.try_recv() {
                Ok(more) if bytes + more.0.weight() > MAX_GROUP_BYTES => {
                    next = Some(more);
                    break;
                }
                Ok(more) => {
                    bytes += more.0.weight();
                    group.push(more);
                }
                Err(_) => break,
            }
        }
        // A command that waited its whole time is answered, not committed.
        let (late, group): (Vec<Waiting>, Vec<Waiting>) = group
            .into_iter()
            .partition(|(_, since, _)| since.elapsed() >= COMMIT_WAIT);
        for (_, _, answer) in late {
            let _ = answer.send(Err(SqsError::unavailable(
                "the change waited too long to be committed; retry",
            )));
        }
        if group.is_empty() {
            continue;
        }
        let (commands, answers): (Vec<Command>, Vec<_>) = group.into_iter().map(|(c, _, a)| (c, a)).unzip();
        let closed = closed.lock().await;
        if *closed {
            for answer in answers {
                let _ = answer.send(Err(SqsError::unavailable(UNRUN)));
            }
            continue;
        }
        match write(&raft, Commands(commands)).await {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                for answer in answers {
                    let reply = replies
                        .next()
                        .unwrap_or_else(|| Err(SqsError::internal("a command was applied without a reply")));
                    let _ = answer.send(reply);
                }
            }
            Err(e) => {
                for answer in answers {
                    let _ = answer.send(Err(e.clone()));
                }
            }
        }
    }
}

/// How long a starting replica waits to lead (a single replica elects itself at once).
const LEAD_WAIT: Duration = Duration::from_secs(10);
/// A log below this size is never compacted into a snapshot…
const COMPACT_MIN: u64 = 16 << 20;
/// …and above it, once it outweighs the snapshot, checked this often: so
/// the files stay within about twice the live data.
const COMPACT_CHECK: Duration = Duration::from_secs(1);

/// How long a change waits to be committed before it is answered 503
/// (a leader cut off from its majority never commits it).
const COMMIT_WAIT: Duration = Duration::from_secs(10);
/// How long a follower waits for the leader to answer a forwarded request
/// (a long poll takes up to 20 s).
const FORWARD_WAIT: Duration = Duration::from_secs(30);
/// How long a follower still waits for the answer of a leader that was
/// replaced meanwhile: one that handed its leadership over answers within
/// a round trip of learning its successor (as the follower does), one cut
/// off from the majority never does (a fault test measured its failover
/// 1 s longer with a wait of 1 s).
const REPLACED_GRACE: Duration = Duration::from_millis(250);
/// How long a request whose leader could not be reached waits before it
/// is tried again.
const RESEND_AFTER: Duration = Duration::from_millis(200);
/// How long a request waits for a leader that can serve it (one elected,
/// and having applied its term's first entry) before it is answered a
/// retryable error: replacing a lost leader takes 1.5–2 s, about what the
/// AWS SDKs' default retries span, so a request held through the election
/// spares the client its retries.
const ELECTION_WAIT: Duration = Duration::from_secs(4);
/// A leader that heard from no majority for this long refuses changes:
/// the followers may be electing another (after the lease and an election
/// timeout, at least 1.5 s), and openraft reports the silence about every
/// heartbeat.
const QUORUM_SILENCE_MS: u64 = 1250;
/// The shortest token the replicas may share.
pub const MIN_TOKEN: usize = 16;
/// How often the leader checks that the members are the replicas configured.
const MEMBERS_CHECK: Duration = Duration::from_secs(1);
/// How long a replica that starts beside others waits to hear from their
/// leader before it may stand for election. openraft 0.9 has no pre-vote:
/// a replica restarted and not yet reached by the leader (on Kubernetes,
/// until the new pod's address is in DNS) would stand at a higher term and
/// depose a leader that serves (a cluster test measured a 1.15 s pause in
/// a rolling update so).
const STARTUP_QUIET: Duration = Duration::from_secs(5);
/// How long a stopping leader tries to hand its leadership over: a replica
/// that caught up stands for election at once and wins within a round trip.
const HANDOVER_WAIT: Duration = Duration::from_secs(3);
/// How long the leader waits for the election it asked for before asking again.
const HANDOVER_ROUND: Duration = Duration::from_millis(500);

/// Where an engine's replicas are.
#[derive(Debug, Clone)]
pub struct Replication {
    /// This replica's id.
    pub me: NodeId,
    /// Every replica's peer address (`host:port`), by id.
    pub peers: BTreeMap<NodeId, String>,
    /// The replicas' shared token.
    pub token: String,
}

/// A running replica of an engine: its Raft and its state machine.
pub struct Replica {
    pub raft: Raft<TypeConfig>,
    pub state: StateMachine,
    pub probe: Arc<Probe>,
    me: NodeId,
    /// How it reaches its peers; none for an engine of one replica.
    http: Option<network::Http>,
    /// Where commands wait to be committed together.
    proposals: mpsc::Sender<Waiting>,
    /// Every replica's peer address, as configured here.
    peers: BTreeMap<NodeId, String>,
    /// The replicas that should be the voters, while this one leads: the
    /// configured ones, or fewer once an operator lowered them (kept in
    /// [`VOTERS_FILE`], so that a replica restarted meanwhile does not add
    /// back the replicas that left).
    voters: watch::Sender<BTreeSet<NodeId>>,
    /// Where the replica's files are.
    dir: PathBuf,
    /// How far this replica must have applied its log, as the leader of
    /// its current term, before it serves.
    leading: std::sync::Mutex<Leading>,
    /// Set once this replica stops: as the leader, it takes no more
    /// requests and hands its leadership over.
    handing_over: Arc<AtomicBool>,
    /// Set by a leader handing over, once the entry being committed is:
    /// no change is committed after it.
    commits_closed: Arc<tokio::sync::Mutex<bool>>,
    /// Told of each append a leader made here (by the peer port).
    pub heard_leader: Arc<tokio::sync::Notify>,
}

/// A leader's catching up with its own log. A replica that led before it
/// stopped leads again at its start, in the same term, if no other was
/// elected meanwhile (openraft's startup), with entries of that term in
/// its log that it has not applied yet: it serves once it applied the log
/// as it stood when it found itself leading (a cluster test caught a
/// restored leader answering QueueDoesNotExist for a queue just made).
#[derive(Default)]
struct Leading {
    term: u64,
    until: u64,
    caught_up: bool,
    /// When it was first seen leading in `term`.
    since: Option<Instant>,
}

impl Leading {
    /// Whether a leader of `term` whose log ends at `last_log` and which
    /// applied up to `applied` serves: once it applied the log it had when
    /// first seen leading in that term, and from then on in that term
    /// (later entries wait for their commit anyway).
    fn serves(&mut self, term: u64, last_log: u64, applied: Option<u64>) -> bool {
        if self.term != term {
            *self = Self {
                term,
                until: last_log,
                caught_up: false,
                since: Some(Instant::now()),
            };
        }
        self.caught_up = self.caught_up || applied.is_some_and(|a| a >= self.until);
        self.caught_up
    }

    /// How long a leader of `term` is known to have led (none: not seen leading).
    fn led_for(&self, term: u64) -> Option<Duration> {
        self.since.filter(|_| self.term == term).map(|since| since.elapsed())
    }
}

/// The file in a replica's directory that names the voters an operator
/// wants, when fewer than the replicas configured.
const VOTERS_FILE: &str = "voters.json";

/// The voters a replica of `replication` starts wanting: those kept in
/// `file` when it names some of the replicas configured, else all of them.
fn wanted_voters(file: &Path, replication: &Replication) -> BTreeSet<NodeId> {
    let kept: Option<BTreeSet<NodeId>> = std::fs::read(file).ok().and_then(|b| serde_json::from_slice(&b).ok());
    match kept {
        Some(kept) if !kept.is_empty() && kept.iter().all(|id| replication.peers.contains_key(id)) => kept,
        _ => replication.peers.keys().copied().collect(),
    }
}

/// Whether the replica directory `dir` holds nothing yet.
pub fn is_new(dir: &Path) -> bool {
    !dir.join("raft.log").exists() && !dir.join("raft.snapshot").exists()
}

/// Makes `dir` the files of an engine's first replica (1, at `node`)
/// holding `machine`: a snapshot at the log's start whose membership is
/// that replica alone. The others join it.
pub fn bootstrap(dir: &Path, machine: &Machine, node: BasicNode) -> Result<(), SqsError> {
    std::fs::create_dir_all(dir).map_err(journal_error)?;
    let start = LogId::new(CommittedLeaderId::new(0, 0), 0);
    let members: BTreeMap<NodeId, BasicNode> = [(1, node)].into();
    let meta = SnapshotMeta {
        last_log_id: Some(start),
        last_membership: StoredMembership::new(Some(start), Membership::from(members)),
        snapshot_id: "bootstrap".into(),
    };
    let meta = serde_json::to_vec(&meta).map_err(journal_error)?;
    write_snapshot_file(&dir.join("raft.snapshot"), &meta, machine).map_err(journal_error)?;
    Ok(())
}

impl Replica {
    /// Starts a replica of an engine from its files in `dir` (see
    /// [`bootstrap`]), holding its `lock`. The only replica of an engine
    /// elects itself and is returned once it leads; one of several joins
    /// the others, and the leader among them keeps the membership equal to
    /// `replication`'s replicas.
    pub async fn start(
        dir: PathBuf,
        durability: Durability,
        identity: Identity,
        lock: File,
        replication: Option<&Replication>,
    ) -> Result<Self, SqsError> {
        let probe = Arc::new(Probe::default());
        let voters_file = dir.join(VOTERS_FILE);
        let home = dir.clone();
        let (log, state) = tokio::task::spawn_blocking({
            let probe = probe.clone();
            move || {
                let log = LogStore::open(&dir, durability, lock, probe).map_err(journal_error)?;
                let state = StateMachine::open(&dir, identity).map_err(journal_error)?;
                Ok::<_, SqsError>((log, state))
            }
        })
        .await
        .map_err(journal_error)??;
        let log_reader = log.clone();
        let (voters, _) = watch::channel(match replication {
            Some(r) => wanted_voters(&voters_file, r),
            // A single replica: the replicas it was lowered from are gone.
            None => {
                let _ = std::fs::remove_file(&voters_file);
                BTreeSet::new()
            }
        });
        let heard_leader = Arc::new(tokio::sync::Notify::new());
        let handing_over = Arc::new(AtomicBool::new(false));
        let (raft, me, http) = match replication {
            None => {
                let raft = Raft::new(1, config()?, network::NoPeers, log, state.clone())
                    .await
                    .map_err(journal_error)?;
                raft.trigger().elect().await.map_err(journal_error)?;
                raft.wait(Some(LEAD_WAIT))
                    .state(openraft::ServerState::Leader, "a single replica leads")
                    .await
                    .map_err(journal_error)?;
                // Everything the log holds is applied before the first request.
                raft.ensure_linearizable().await.map_err(journal_error)?;
                (raft, 1, None)
            }
            Some(r) => {
                if r.token.len() < MIN_TOKEN {
                    return Err(SqsError::internal(format!(
                        "the replicas' token must be at least {MIN_TOKEN} characters"
                    )));
                }
                let http = network::Http::new(&r.token, r.peers.clone()).map_err(journal_error)?;
                let quiet = Config {
                    enable_elect: false,
                    ..(*config()?).clone()
                };
                let raft = Raft::new(r.me, Arc::new(quiet), http.clone(), log, state.clone())
                    .await
                    .map_err(journal_error)?;
                tokio::spawn(stand_after_quiet(raft.clone(), heard_leader.clone()));
                let peers = r.peers.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
                tokio::spawn(keep_members(
                    raft.clone(),
                    peers,
                    voters.subscribe(),
                    handing_over.clone(),
                ));
                (raft, r.me, Some(http))
            }
        };
        tokio::spawn(compact_when_due(raft.clone(), log_reader, state.snapshot_path()));
        let (proposals, waiting) = mpsc::channel(MAX_WAITING);
        let commits_closed = Arc::new(tokio::sync::Mutex::new(false));
        tokio::spawn(group_commit(raft.clone(), waiting, commits_closed.clone()));
        Ok(Self {
            raft,
            state,
            probe,
            me,
            http,
            proposals,
            peers: replication.map(|r| r.peers.clone()).unwrap_or_default(),
            voters,
            dir: home,
            leading: Default::default(),
            handing_over,
            commits_closed,
            heard_leader,
        })
    }

    /// Commits `command` (with the commands of other requests meanwhile)
    /// and waits until this replica, the leader, applied it: its reply.
    pub async fn propose(&self, command: Command) -> Result<Reply, SqsError> {
        let (answer, reply) = oneshot::channel();
        match self.proposals.try_send((command, Instant::now(), answer)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                return Err(SqsError::unavailable(
                    "too many changes are waiting to be committed; retry",
                ));
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(SqsError::unavailable("the queue service's replica is stopping; retry"));
            }
        }
        reply
            .await
            .unwrap_or_else(|_| Err(SqsError::unavailable("the queue service's replica is stopping; retry")))
    }

    /// Has the queue service keep only `voters` (configured replicas) as
    /// its voters, once this replica leads; the others leave.
    pub fn want_voters(&self, voters: BTreeSet<NodeId>) -> Result<(), String> {
        if voters.is_empty() || !voters.iter().all(|id| self.peers.contains_key(id)) {
            return Err(format!(
                "the voters must be some of the configured replicas {:?} (got {voters:?})",
                self.peers.keys().collect::<Vec<_>>()
            ));
        }
        let kept = serde_json::to_vec(&voters).map_err(|e| e.to_string())?;
        let (file, staged) = (self.dir.join(VOTERS_FILE), self.dir.join(format!("{VOTERS_FILE}.new")));
        std::fs::write(&staged, kept)
            .and_then(|()| std::fs::rename(&staged, &file))
            .map_err(|e| format!("cannot keep the voters wanted in {}: {e}", file.display()))?;
        self.voters.send_replace(voters);
        Ok(())
    }

    /// Why this replica cannot take its share of requests yet, if it
    /// cannot: before it is a voter (a replica still joining, or one the
    /// others removed) or while it knows no leader. A single replica
    /// always can.
    pub fn unready(&self) -> Option<String> {
        self.http.as_ref()?;
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if !m.membership_config.membership().voter_ids().any(|id| id == self.me) {
            return Some(format!("replica {} is not yet a voter of the queue service", self.me));
        }
        m.current_leader
            .is_none()
            .then(|| "the queue service is electing a leader".to_owned())
    }

    /// Whether another replica leads, as far as this one knows: it then
    /// passes requests on.
    pub fn follows(&self) -> bool {
        self.http.is_some() && self.raft.metrics().borrow().current_leader != Some(self.me)
    }

    /// The peer address of the leader, when another replica leads; an
    /// error while none does, while this one leads without having heard
    /// from a majority lately, or before it applied its term's first entry.
    pub fn leader_elsewhere(&self) -> Result<Option<String>, SqsError> {
        if self.http.is_none() {
            return Ok(None);
        }
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        match m.current_leader {
            // A stopping leader's requests wait for its successor.
            Some(id) if id == self.me && self.handing_over.load(Ordering::Relaxed) => Err(SqsError::unavailable(
                "this replica is handing the queue service's leadership over; retry",
            )),
            // A leader cut off from the majority may have been replaced:
            // what it takes now would wait for a commit that never comes.
            Some(id) if id == self.me && m.millis_since_quorum_ack.is_some_and(|ms| ms > QUORUM_SILENCE_MS) => {
                Err(SqsError::unavailable(
                    "this replica led the queue service but has not heard from most replicas in a while; retry",
                ))
            }
            // A new leader applies what the others committed only once
            // the first entry of its term is committed: until then its
            // queues may be of before (a queue created since is missing).
            Some(id) if id == self.me && m.last_applied.is_none_or(|l| l.leader_id.term < m.current_term) => {
                Err(SqsError::unavailable(
                    "this replica has just become the queue service's leader and is applying the log; retry",
                ))
            }
            Some(id) if id == self.me => self.caught_up(&m),
            // The address configured here first: the membership's may be of
            // before (a replica that grew from one has none).
            Some(id) => match self.peers.get(&id).cloned() {
                Some(addr) => Ok(Some(addr)),
                None => match m.membership_config.membership().get_node(&id) {
                    Some(node) if !node.addr.is_empty() => Ok(Some(node.addr.clone())),
                    _ => Err(not_leader(Some(id))),
                },
            },
            None => Err(not_leader(None)),
        }
    }

    /// Whether this replica, which leads, applied its log as it stood when
    /// it found itself leading in this term (see [`Leading`]).
    fn caught_up(&self, m: &openraft::RaftMetrics<NodeId, BasicNode>) -> Result<Option<String>, SqsError> {
        let mut leading = self.leading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let applied = m.last_applied.map(|l| l.index);
        if leading.serves(m.current_term, m.last_log_index.unwrap_or(0), applied) {
            Ok(None)
        } else {
            Err(SqsError::unavailable(
                "this replica leads the queue service again and is applying its log; retry",
            ))
        }
    }

    /// Hands the leadership over before this replica stops, so that the
    /// others need not wait out an election timeout: it takes no more
    /// requests (they wait for its successor, then go there), waits until a
    /// voter holds its whole log applied here, and has that voter stand for
    /// election at once. This replica grants the vote, since a leader's own
    /// vote is under no lease, and steps down. The replica that leads then,
    /// or none when this one did not lead or none took over within
    /// [`HANDOVER_WAIT`] (the others then elect one as after a crash).
    pub async fn hand_over(&self) -> Option<NodeId> {
        let http = self.http.as_ref()?;
        let (leader, others) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let others = m.membership_config.membership().voter_ids().any(|id| id != self.me);
            (m.current_leader, others)
        };
        // A follower has nothing to hand over, and the only voter no one to.
        if leader != Some(self.me) || !others {
            return leader.filter(|id| *id != self.me);
        }
        self.handing_over.store(true, Ordering::Relaxed);
        // A successor asked while an entry is still being appended here
        // would have a shorter log, and lose its election.
        *self.commits_closed.lock().await = true;
        let handed = self.ask_a_successor(http).await;
        if handed.is_none() && self.raft.metrics().borrow().current_leader == Some(self.me) {
            // Still the leader: it serves on until it stops, as a leader
            // that never tried to hand over would.
            tracing::warn!("no replica took the leadership over in time; serving on until stopped");
            *self.commits_closed.lock().await = false;
            self.handing_over.store(false, Ordering::Relaxed);
        }
        handed
    }

    /// The rounds of [`Self::hand_over`]: asks the voter that caught up to
    /// stand, until another replica leads or [`HANDOVER_WAIT`] is over.
    async fn ask_a_successor(&self, http: &network::Http) -> Option<NodeId> {
        let deadline = tokio::time::Instant::now() + HANDOVER_WAIT;
        let mut metrics = self.raft.metrics();
        let mut asked = false;
        // When this replica was first seen leading, if no request saw it.
        let mut seen: Option<(u64, Instant)> = None;
        while tokio::time::Instant::now() < deadline {
            let (leader, term, successor) = {
                let m = metrics.borrow_and_update();
                (m.current_leader, m.current_term, successor(&m))
            };
            match leader {
                Some(id) if id == self.me => {}
                Some(id) => return Some(id),
                // The successor asked is being elected.
                None if asked => {
                    let _ = tokio::time::timeout(Duration::from_millis(20), metrics.changed()).await;
                    continue;
                }
                None => return None,
            }
            let Some((id, addr)) = successor.and_then(|id| self.peers.get(&id).map(|addr| (id, addr))) else {
                // Changes still committing, or no voter caught up yet.
                let _ = tokio::time::timeout(Duration::from_millis(20), metrics.changed()).await;
                continue;
            };
            // A leader elected within its lease refuses to vote for its
            // successor; one that served no request yet is taken to have
            // been elected now.
            seen = seen.filter(|(t, _)| *t == term);
            let led = self
                .leading
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .led_for(term)
                .unwrap_or_else(|| {
                    let (_, since) = *seen.get_or_insert((term, Instant::now()));
                    since.elapsed()
                });
            // A little over the lease: openraft refuses until it is past.
            if let Some(young) = (LEASE + Duration::from_millis(50))
                .checked_sub(led)
                .filter(|d| !d.is_zero())
            {
                tokio::time::sleep(young.min(deadline - tokio::time::Instant::now())).await;
                continue;
            }
            asked = true;
            if let Err(e) = http.post::<_, bool>(addr, "/raft/elect", &(), HANDOVER_ROUND).await {
                tracing::warn!(replica = id, error = %network::causes(&e), "asking a replica to take over failed");
            }
            let me = self.me;
            let round = metrics.wait_for(|m| m.current_leader != Some(me));
            let _ = tokio::time::timeout(HANDOVER_ROUND, round).await;
        }
        None
    }

    /// Runs a request where it can be served: `None` when that is here
    /// (this replica leads), else the leader's answer. While no replica
    /// can serve (an election, a new leader applying the log) it waits,
    /// and a leader that could not be reached (so was sent nothing) is
    /// tried again, up to [`ELECTION_WAIT`] in all.
    pub async fn at_leader(
        &self,
        action: &str,
        input: &serde_json::Value,
    ) -> Result<Option<serde_json::Value>, SqsError> {
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        loop {
            let Some(leader) = self.leader_to_serve(deadline).await? else {
                return Ok(None);
            };
            match self.forward(&leader, action, input).await {
                Ok(answer) => return Ok(Some(answer)),
                Err(Forward::NotSent(e)) if tokio::time::Instant::now() + RESEND_AFTER < deadline => {
                    tracing::debug!(leader, error = %e.message, "the leader could not be reached; trying again");
                    tokio::time::sleep(RESEND_AFTER).await;
                }
                Err(Forward::NotSent(e) | Forward::Failed(e)) => return Err(e),
            }
        }
    }

    /// Waits, as [`Self::at_leader`] does, until this replica is the
    /// leader that can serve; an error when another leads.
    pub async fn serving_here(&self) -> Result<(), SqsError> {
        let deadline = tokio::time::Instant::now() + ELECTION_WAIT;
        match self.leader_to_serve(deadline).await? {
            None => Ok(()),
            Some(_) => Err(not_leader(self.raft.metrics().borrow().current_leader)),
        }
    }

    /// [`Self::leader_elsewhere`], waiting until `deadline` while no
    /// replica can serve.
    async fn leader_to_serve(&self, deadline: tokio::time::Instant) -> Result<Option<String>, SqsError> {
        let mut metrics = self.raft.metrics();
        loop {
            // Marked seen before it is judged: a change meanwhile wakes the wait.
            let gone = stopped(&metrics.borrow_and_update());
            match self.leader_elsewhere() {
                Err(e) if !gone => {
                    match tokio::time::timeout_at(deadline, metrics.changed()).await {
                        Ok(Ok(())) => {}
                        // Waited long enough, or the replica stopped.
                        Ok(Err(_)) | Err(_) => return Err(e),
                    }
                }
                other => return other,
            }
        }
    }

    /// Has the leader at `addr` run an SQS request: its answer.
    async fn forward(&self, addr: &str, action: &str, input: &serde_json::Value) -> Result<serde_json::Value, Forward> {
        let Some(http) = &self.http else {
            return Err(Forward::Failed(not_leader(None)));
        };
        let forwarded = peers::Forwarded {
            action: action.to_owned(),
            input: input.clone(),
        };
        // A leader that is replaced meanwhile (a new one was elected
        // because the majority cannot reach it) may never answer; one that
        // handed over answers at once that it did not run the request.
        let mut metrics = self.raft.metrics();
        let leader = metrics.borrow().current_leader;
        let replaced = async {
            let _ = metrics.wait_for(|m| m.current_leader != leader).await;
            tokio::time::sleep(REPLACED_GRACE).await;
        };
        let answer: Result<serde_json::Value, crate::error::Wire> = tokio::select! {
            answer = http.post(addr, "/request", &forwarded, FORWARD_WAIT) => answer.map_err(|e| {
                let unreachable = SqsError::unavailable(format!(
                    "the queue service's leader cannot be reached ({}); retry",
                    network::causes(&e)
                ));
                // Refused unrun: it does not lead (any more), or it is stopping.
                if e.is_connect() || e.status() == Some(peers::NOT_RUN) {
                    Forward::NotSent(unreachable)
                } else {
                    Forward::Failed(unreachable)
                }
            })?,
            _ = replaced => {
                return Err(Forward::Failed(SqsError::unavailable(
                    "the queue service's leader changed while it had the request; retry",
                )));
            }
        };
        answer.map_err(|e| Forward::Failed(SqsError::from_wire(e)))
    }
}

/// Why a request passed on to the leader got no answer from it.
enum Forward {
    /// No connection was made: the leader was sent nothing.
    NotSent(SqsError),
    /// Sent, or refused for another reason: it may have been done.
    Failed(SqsError),
}

/// Refuses to start the queue service anew as replica 1 (which has no
/// files) when another replica already holds it: replica 1's files were
/// lost, and starting anew would make a second queue service of one. Peers
/// that cannot be reached are taken to be starting too.
pub async fn refuse_a_second_start(replication: &Replication) -> Result<(), SqsError> {
    let http = network::Http::new(&replication.token, replication.peers.clone()).map_err(journal_error)?;
    for (id, addr) in replication.peers.iter().filter(|(id, _)| **id != replication.me) {
        let members: Result<Vec<NodeId>, _> = http.post(addr, "/raft/members", &(), Duration::from_secs(2)).await;
        if let Ok(members) = members
            && !members.is_empty()
        {
            return Err(SqsError::internal(format!(
                "replica {} has no files, but replica {id} holds the queue service (members {members:?}): \
                 restore replica {}'s files, or add a replica under a new id",
                replication.me, replication.me
            )));
        }
    }
    Ok(())
}

/// Lets a replica that started beside others stand for election once a
/// leader reached it (it then stands only when that leader goes silent),
/// after [`STARTUP_QUIET`] when none did, and at once when it is the only
/// voter (replica 1 starting the queue service).
async fn stand_after_quiet(raft: Raft<TypeConfig>, heard_leader: Arc<tokio::sync::Notify>) {
    let mut metrics = raft.metrics();
    // The metrics name the voters once the replica has read its files.
    let voters = tokio::time::timeout(
        STARTUP_QUIET,
        metrics.wait_for(|m| m.membership_config.membership().voter_ids().next().is_some()),
    )
    .await
    .map_or(0, |m| {
        m.map_or(0, |m| m.membership_config.membership().voter_ids().count())
    });
    if voters > 1 {
        let _ = tokio::time::timeout(STARTUP_QUIET, heard_leader.notified()).await;
    }
    raft.runtime_config().elect(true);
}

/// Keeps the voters of the queue service the replicas `wanted` names (at
/// first all of `peers`), while this replica leads: a replica wanted but
/// not yet a member joins as a learner, then becomes a voter (a single
/// replica grows to three in place); one no longer wanted leaves (three
/// shrink to one before the others stop).
async fn keep_members(
    raft: Raft<TypeConfig>,
    peers: BTreeMap<NodeId, BasicNode>,
    mut wanted: watch::Receiver<BTreeSet<NodeId>>,
    handing_over: Arc<AtomicBool>,
) {
    let metrics = raft.metrics();
    loop {
        tokio::time::sleep(MEMBERS_CHECK).await;
        let (gone, leads, membership) = {
            let m = metrics.borrow();
            (
                stopped(&m),
                m.state == openraft::ServerState::Leader,
                m.membership_config.membership().clone(),
            )
        };
        if gone {
            return;
        }
        // An entry appended now would make the successor's log shorter.
        if handing_over.load(Ordering::Relaxed) {
            continue;
        }
        let wanted = wanted.borrow_and_update().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        // A change a leader died in the middle of leaves a joint
        // membership: its voters are the wanted ones, but an election needs
        // a majority of the old ones too until the change is finished.
        let joint = membership.get_joint_config().len() > 1;
        let addressed = peers
            .iter()
            .all(|(id, node)| membership.get_node(id).is_none_or(|n| n.addr == node.addr));
        if !leads || (voters == wanted && addressed && !joint) {
            continue;
        }
        for (id, node) in peers.iter().filter(|(id, _)| wanted.contains(id)) {
            if membership.get_node(id).is_none()
                && let Err(e) = raft.add_learner(*id, node.clone(), false).await
            {
                tracing::warn!(replica = id, error = %e, "adding a replica failed; retrying");
            }
        }
        // A member's address as configured (the first replica of a queue
        // service that grew from one had none).
        let moved: BTreeMap<NodeId, BasicNode> = peers
            .iter()
            .filter(|(id, node)| membership.get_node(id).is_some_and(|n| n.addr != node.addr))
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        if !moved.is_empty()
            && let Err(e) = raft
                .change_membership(openraft::ChangeMembers::SetNodes(moved), true)
                .await
        {
            tracing::warn!(error = %e, "updating the replicas' addresses failed; retrying");
        }
        if voters != wanted || joint {
            // Replicas no longer wanted leave the membership altogether.
            match raft.change_membership(wanted.clone(), false).await {
                Ok(_) => tracing::info!(voters = ?wanted, "the queue service's voters are the replicas wanted"),
                Err(e) => tracing::warn!(error = %e, "changing the replicas failed; retrying"),
            }
        }
    }
}

/// The voter a leader with these metrics can hand over to: one that holds
/// its whole log, once the leader applied all of it (no change is still
/// committing). None while it is not the leader.
fn successor(m: &openraft::RaftMetrics<NodeId, BasicNode>) -> Option<NodeId> {
    if m.state != openraft::ServerState::Leader || m.last_applied.map(|l| l.index) != m.last_log_index {
        return None;
    }
    let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
    m.replication.as_ref()?.iter().find_map(|(id, matched)| {
        (*id != m.id && voters.contains(id) && matched.map(|l| l.index) == m.last_log_index).then_some(*id)
    })
}

/// Whether the replica these metrics are of has stopped (shut down, or
/// failed for good).
pub(crate) fn stopped(m: &openraft::RaftMetrics<NodeId, BasicNode>) -> bool {
    m.state == openraft::ServerState::Shutdown || m.running_state.is_err()
}

/// Snapshots the state (and so purges the log) whenever the log outweighs
/// the last snapshot, until the replica stops.
async fn compact_when_due(raft: Raft<TypeConfig>, log: LogStore, snapshot: PathBuf) {
    let metrics = raft.metrics();
    loop {
        tokio::time::sleep(COMPACT_CHECK).await;
        // A stopped replica's files are released once this lets go of its log.
        if stopped(&metrics.borrow()) || metrics.has_changed().is_err() {
            return;
        }
        // Counted from the last snapshot, not from the purge point: a
        // lagging follower may hold the purge back, and a snapshot again
        // of the same entries would only burn the CPU it needs.
        let snapshot_bytes = std::fs::metadata(&snapshot).map_or(0, |m| m.len());
        let since = metrics.borrow().snapshot.map(|s| s.index);
        if log.bytes_after(since) > COMPACT_MIN.max(snapshot_bytes) && raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

/// A failure that is only a message (what openraft's storage errors wrap).
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failure {}

/// The error of a replica that cannot take a change because it is not the
/// leader: the AWS SDKs retry it.
pub fn not_leader(leader: Option<NodeId>) -> SqsError {
    SqsError::unavailable(match leader {
        Some(id) => format!("this replica is not the queue service's leader (replica {id} is); retry"),
        None => "the queue service is electing a leader; retry".to_owned(),
    })
}

#[cfg(test)]
mod tests;
