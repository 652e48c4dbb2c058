//! Authoritative control-plane state (seed 002 §3.2–3.3): sessions, issued
//! snapshot references, runtime reports, outcome totals and the ownership
//! epoch. Every method is one atomic check-and-write: it validates first and
//! writes last, so a refused call changes nothing.

pub mod memory;
pub mod redis;

#[cfg(test)]
pub mod contract;

use std::time::Duration;

use async_trait::async_trait;

use super::model::{Acknowledgement, IssuedSnapshot, OutcomeBatch, RuntimeReport, Session};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The session expired or a newer registration replaced it.
    #[error("session is stale or was replaced")]
    StaleSession,
    /// An ACK that does not match the snapshot issued to the worker.
    #[error("acknowledgement does not match the issued snapshot")]
    AckMismatch,
    /// A runtime report before the session's first positive ACK.
    #[error("no snapshot acknowledged in this session")]
    NotAcknowledged,
    /// A runtime report for another snapshot than the acknowledged one.
    #[error("report does not match the acknowledged snapshot")]
    SnapshotMismatch,
    /// A report sequence below the stored one.
    #[error("report sequence is stale")]
    StaleReport,
    /// The stored sequence, with other content.
    #[error("report conflicts with the stored report of the same sequence")]
    ConflictingReport,
    /// A controller whose ownership epoch is no longer current.
    #[error("ownership epoch is stale")]
    StaleEpoch,
    /// The backend failed or timed out; the text is for logs only.
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[async_trait]
pub trait ControlStore: Send + Sync + 'static {
    /// The current ownership epoch, initialised to 1 if unset.
    async fn current_ownership_epoch(&self) -> Result<u64>;
    /// Takes ownership: increments the epoch, fencing off older owners.
    async fn claim_ownership(&self) -> Result<u64>;
    /// Next snapshot version, strictly increasing across owners.
    async fn next_snapshot_version(&self) -> Result<u64>;

    /// Replaces the worker's session (unacknowledged) and deletes its runtime
    /// report and issued snapshot. Returns the ownership epoch.
    async fn open_session(&self, session: &Session, ttl: Duration) -> Result<u64>;
    /// The worker's live session.
    async fn session(&self, worker_id: &str) -> Result<Option<Session>>;
    /// Records the snapshot issued to a worker's live session; its epoch must
    /// be the current one.
    async fn record_issued_snapshot(&self, issued: &IssuedSnapshot, ttl: Duration) -> Result<()>;
    /// Applies a positive or negative ACK and renews the session.
    async fn acknowledge_snapshot(&self, ack: &Acknowledgement, session_ttl: Duration) -> Result<()>;
    /// Replaces the worker's runtime report (or accepts an identical replay),
    /// renews the session and returns the current ownership epoch.
    async fn replace_runtime(&self, report: &RuntimeReport, session_ttl: Duration, report_ttl: Duration)
    -> Result<u64>;
    /// Adds a batch of outcomes to the totals unless (worker, session, batch)
    /// was seen within `dedup_ttl`. Returns false for a duplicate.
    async fn record_outcomes(&self, batch: &OutcomeBatch, session_ttl: Duration, dedup_ttl: Duration) -> Result<bool>;
    /// Totals of one proxy's outcomes by kind name.
    async fn outcome_totals(&self, proxy_id: &str) -> Result<Vec<(String, i64)>>;
    /// Whether the store answers.
    async fn ping(&self) -> Result<()>;
}
