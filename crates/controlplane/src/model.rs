//! Transport-free types of the worker control plane (seed 002 §3–5).

use sha2::{Digest, Sha256};

/// The only protocol version this controller speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// SHA-256 of a snapshot payload.
pub type Checksum = [u8; 32];

pub fn checksum(payload: &[u8]) -> Checksum {
    Sha256::digest(payload).into()
}

/// A worker's session as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub worker_id: String,
    pub session_id: String,
    pub instance_id: String,
    pub zone: String,
    pub labels: Vec<(String, String)>,
    /// Zero until the first positive ACK.
    pub acked_version: u64,
    pub acked_epoch: u64,
    /// Version of the last negative ACK; zero if none.
    pub nacked_version: u64,
}

/// (version, ownership epoch, checksum) of one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotId {
    pub version: u64,
    pub ownership_epoch: u64,
    pub checksum: Checksum,
}

/// The snapshot last issued to one worker, with the nonce of its delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedSnapshot {
    pub worker_id: String,
    pub session_id: String,
    pub snapshot: SnapshotId,
    pub nonce: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    pub worker_id: String,
    pub session_id: String,
    pub snapshot: SnapshotId,
    pub applied: bool,
    /// Empty: do not check the delivery nonce.
    pub nonce: String,
}

/// Counters of one proxy; all non-negative.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProxyCounters {
    pub proxy_id: String,
    pub requests: i64,
    pub errors: i64,
    pub in_flight: i64,
    pub bytes_in: i64,
    pub bytes_out: i64,
}

/// A full, sparse runtime report, counters sorted by proxy id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeReport {
    pub worker_id: String,
    pub session_id: String,
    pub sequence: u64,
    pub snapshot_version: u64,
    pub ownership_epoch: u64,
    pub counters: Vec<ProxyCounters>,
}

impl RuntimeReport {
    /// Canonical encoding of the report's content (not of its sequence),
    /// to tell an idempotent replay from a conflicting one.
    pub fn canonical_body(&self) -> String {
        let mut out = format!("{}:{}", self.snapshot_version, self.ownership_epoch);
        for c in &self.counters {
            out.push_str(&format!(
                "|{}:{}:{}:{}:{}:{}",
                c.proxy_id, c.requests, c.errors, c.in_flight, c.bytes_in, c.bytes_out
            ));
        }
        out
    }

    pub fn digest(&self) -> String {
        sless_runtime::hex::encode(&checksum(self.canonical_body().as_bytes()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    Ok,
    ClientError,
    AuthFailed,
    BackendError,
}

impl OutcomeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::ClientError => "client_error",
            Self::AuthFailed => "auth_failed",
            Self::BackendError => "backend_error",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeCount {
    pub proxy_id: String,
    pub kind: OutcomeKind,
    pub count: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutcomeBatch {
    pub worker_id: String,
    pub session_id: String,
    pub batch_id: String,
    pub outcomes: Vec<OutcomeCount>,
}
