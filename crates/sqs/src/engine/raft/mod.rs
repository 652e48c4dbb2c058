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
pub mod state_machine;

use std::sync::Arc;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, Config, Raft, SnapshotPolicy};
use serde::{Deserialize, Serialize};

use super::command::{Command, Reply};
use crate::error::SqsError;

/// A replica's id within its queue service (1, 2, 3…).
pub type NodeId = u64;

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Command,
        R = Outcome,
        NodeId = NodeId,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

/// What applying a log entry gave: a command's reply, `None` for Raft's
/// own entries. It stays on the replica that applied it: the leader hands
/// it to the request that proposed the command, and it never crosses the
/// network (openraft only asks that it could), so it encodes as nothing.
#[derive(Debug, Default)]
pub struct Outcome(pub Option<Result<Reply, SqsError>>);

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for Outcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <()>::deserialize(deserializer)?;
        Ok(Self(None))
    }
}

/// The timing every replica of a queue service runs with: a leader lost is
/// noticed within the election timeout; an append (a follower's write and
/// sync included) must answer within the heartbeat.
pub fn config() -> Result<Arc<Config>, SqsError> {
    let config = Config {
        cluster_name: "sless-queues".into(),
        heartbeat_interval: 250,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        install_snapshot_timeout: 5000,
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

/// Proposes `command` through `raft` and waits until the leader applied it:
/// its reply. A replica that is not the leader answers a retryable error
/// naming the leader, if it knows one.
pub async fn propose(raft: &Raft<TypeConfig>, command: Command) -> Result<Reply, SqsError> {
    match raft.client_write(command).await {
        Ok(written) => written
            .data
            .0
            .unwrap_or_else(|| Err(SqsError::internal("a command was applied without a reply"))),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => Err(not_leader(forward.leader_id)),
        Err(e) => {
            tracing::error!(error = %e, "replicating a command failed");
            Err(SqsError::unavailable(
                "the queue service's replicas cannot commit now; retry",
            ))
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
