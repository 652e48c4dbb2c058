//! The transport-free application service of the worker control plane
//! (seed 002 §3.2, §5). gRPC mapping and certificate identity live in
//! [`super::grpc`]; this layer validates, calls the store and decides.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use super::model::{Acknowledgement, OutcomeBatch, OutcomeCount, PROTOCOL_VERSION, RuntimeReport, Session, SnapshotId};
use super::publisher::PublishedSnapshot;
use super::store::{ControlStore, StoreError};
use super::validate::{self, Invalid};
use sless_runtime::sync::Unpoisoned;

/// Most outcomes one `ReportOutcomes` batch may carry.
pub const MAX_OUTCOMES_PER_BATCH: usize = 10_000;

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub heartbeat_interval: Duration,
    pub session_ttl: Duration,
    pub max_stale_age: Duration,
    pub max_runtime_counters: usize,
    /// How long a `ReportOutcomes` batch id is remembered for deduplication.
    pub outcome_dedup_ttl: Duration,
    /// How long a delivered snapshot may stay un-acknowledged before it is
    /// delivered again (with a new nonce).
    pub ack_timeout: Duration,
    /// Full snapshots being sent at once, across all streams.
    pub full_snapshot_concurrency: usize,
    /// How often a stream re-reads its session, to see ACKs taken by
    /// another controller replica and sessions that expired.
    pub stream_poll_interval: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            session_ttl: Duration::from_secs(35),
            max_stale_age: Duration::from_secs(30),
            max_runtime_counters: 100_000,
            outcome_dedup_ttl: Duration::from_secs(600),
            ack_timeout: Duration::from_secs(30),
            full_snapshot_concurrency: 16,
            stream_poll_interval: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(&'static str),
    #[error("{0}")]
    Aborted(&'static str),
    #[error("{0}")]
    AlreadyExists(&'static str),
    /// The store failed; what failed is logged, never returned.
    #[error("control plane state is unavailable; retry")]
    Unavailable,
}

impl From<Invalid> for ServiceError {
    fn from(e: Invalid) -> Self {
        Self::InvalidArgument(e.to_string())
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::StaleSession => Self::FailedPrecondition("session is stale or was replaced; register again"),
            StoreError::AckMismatch => {
                Self::FailedPrecondition("snapshot is not the one issued to this session; apply the next delivery")
            }
            StoreError::NotAcknowledged => {
                Self::FailedPrecondition("no snapshot acknowledged in this session; acknowledge one first")
            }
            StoreError::SnapshotMismatch => Self::FailedPrecondition("report does not match the acknowledged snapshot"),
            StoreError::StaleReport => Self::Aborted("report sequence is older than the stored one"),
            StoreError::ConflictingReport => {
                Self::AlreadyExists("a different report with this sequence was already accepted")
            }
            StoreError::StaleEpoch => Self::FailedPrecondition("controller ownership epoch is stale"),
            StoreError::Unavailable(detail) => {
                tracing::warn!(%detail, "control store call failed");
                Self::Unavailable
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct RegisterCommand {
    pub supported_protocol_version: u32,
    pub worker_id: String,
    pub instance_id: String,
    pub zone: String,
    pub labels: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub session_id: String,
    pub ownership_epoch: u64,
    pub heartbeat_interval: Duration,
    pub max_stale_age: Duration,
    pub protocol_version: u32,
}

#[derive(Debug, Clone)]
pub struct AckCommand {
    pub worker_id: String,
    pub session_id: String,
    pub version: u64,
    pub ownership_epoch: u64,
    pub checksum: Vec<u8>,
    pub applied: bool,
    pub error_code: String,
    /// Length-checked, then dropped: never stored or logged.
    pub error_message: String,
    pub nonce: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeDecision {
    /// The report did not match the acknowledged snapshot and was not stored.
    pub require_full_snapshot: bool,
    pub ownership_epoch: u64,
    pub revoke_proxy_ids: Vec<String>,
}

/// One full snapshot sent on a `WatchSnapshots` stream.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub nonce: String,
    pub snapshot: Arc<PublishedSnapshot>,
}

/// A worker's last applied snapshot, as it said.
struct Applied {
    epoch: u64,
    version: u64,
    seen: Instant,
}

pub struct Service {
    pub(super) store: Arc<dyn ControlStore>,
    pub(super) config: ServiceConfig,
    pub(super) snapshots: watch::Receiver<Option<Arc<PublishedSnapshot>>>,
    pub(super) full_snapshot_permits: Semaphore,
    /// Wakes a worker's stream when its ACK arrives here.
    pub(super) ack_signals: Mutex<HashMap<String, Arc<Notify>>>,
    /// The current stream of each worker, by a token; an older one ends.
    pub(super) streams: Mutex<HashMap<String, u64>>,
    /// The snapshot each worker last said it applied, and when it said so.
    applied: Mutex<HashMap<String, Applied>>,
    pub(super) shutdown: watch::Sender<bool>,
}

impl Service {
    pub fn new(
        store: Arc<dyn ControlStore>,
        config: ServiceConfig,
        snapshots: watch::Receiver<Option<Arc<PublishedSnapshot>>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            full_snapshot_permits: Semaphore::new(config.full_snapshot_concurrency.max(1)),
            config,
            snapshots,
            ack_signals: Mutex::default(),
            streams: Mutex::default(),
            applied: Mutex::default(),
            shutdown: watch::Sender::new(false),
        })
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// The control-plane state, for platform code that reads sessions.
    pub fn store(&self) -> Arc<dyn ControlStore> {
        self.store.clone()
    }

    /// Snapshots as they are published.
    pub fn published(&self) -> watch::Receiver<Option<Arc<PublishedSnapshot>>> {
        self.snapshots.clone()
    }

    /// Ends every open stream; called on graceful shutdown.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// The newest snapshot version that every worker heard from within a
    /// session's TTL has applied under `ownership_epoch`, or `None` when no
    /// worker is live here. A worker that just registered has applied
    /// nothing (version 0), and so has one whose snapshot is of another
    /// epoch: versions start again when the store loses its state.
    pub fn applied_everywhere(&self, ownership_epoch: u64) -> Option<u64> {
        let now = Instant::now();
        let mut applied = self.applied.lock_unpoisoned();
        applied.retain(|_, a| now.duration_since(a.seen) < self.config.session_ttl);
        applied
            .values()
            .map(|a| if a.epoch == ownership_epoch { a.version } else { 0 })
            .min()
    }

    fn note_applied(&self, worker_id: &str, epoch: u64, version: u64) {
        let applied = Applied {
            epoch,
            version,
            seen: Instant::now(),
        };
        self.applied.lock_unpoisoned().insert(worker_id.to_owned(), applied);
    }

    pub(super) fn ack_signal(&self, worker_id: &str) -> Arc<Notify> {
        let mut signals = self.ack_signals.lock_unpoisoned();
        signals.entry(worker_id.to_owned()).or_default().clone()
    }

    pub async fn ready(&self) -> Result<(), ServiceError> {
        Ok(self.store.ping().await?)
    }

    pub async fn register(&self, cmd: RegisterCommand) -> Result<Registration, ServiceError> {
        if cmd.supported_protocol_version != PROTOCOL_VERSION {
            return Err(ServiceError::InvalidArgument(format!(
                "supported_protocol_version: only version {PROTOCOL_VERSION} is supported"
            )));
        }
        validate::id(&cmd.worker_id, "worker_id")?;
        validate::id(&cmd.instance_id, "instance_id")?;
        validate::zone(&cmd.zone)?;
        validate::labels(&cmd.labels)?;
        let session = Session {
            worker_id: cmd.worker_id,
            session_id: sless_runtime::random::id(),
            instance_id: cmd.instance_id,
            zone: cmd.zone,
            labels: cmd.labels,
            acked_version: 0,
            acked_epoch: 0,
            nacked_version: 0,
        };
        let ownership_epoch = self.store.open_session(&session, self.config.session_ttl).await?;
        self.note_applied(&session.worker_id, 0, 0);
        // A stream of the replaced session must notice at once.
        self.ack_signal(&session.worker_id).notify_waiters();
        tracing::info!(worker_id = %session.worker_id, "worker registered");
        Ok(Registration {
            session_id: session.session_id,
            ownership_epoch,
            heartbeat_interval: self.config.heartbeat_interval,
            max_stale_age: self.config.max_stale_age,
            protocol_version: PROTOCOL_VERSION,
        })
    }

    pub async fn acknowledge(&self, cmd: AckCommand) -> Result<(), ServiceError> {
        validate::id(&cmd.worker_id, "worker_id")?;
        validate::id(&cmd.session_id, "session_id")?;
        validate::bounded(cmd.version, "version")?;
        validate::bounded(cmd.ownership_epoch, "ownership_epoch")?;
        let checksum = validate::checksum(&cmd.checksum)?;
        validate::error_code(&cmd.error_code)?;
        validate::error_message(&cmd.error_message)?;
        if cmd.applied && !cmd.error_code.is_empty() {
            return Err(ServiceError::InvalidArgument(
                "error_code: only a negative ACK has one".into(),
            ));
        }
        if cmd.version == 0 {
            return Err(ServiceError::InvalidArgument("version: must be positive".into()));
        }
        let ack = Acknowledgement {
            worker_id: cmd.worker_id,
            session_id: cmd.session_id,
            snapshot: SnapshotId {
                version: cmd.version,
                ownership_epoch: cmd.ownership_epoch,
                checksum,
            },
            applied: cmd.applied,
            nonce: cmd.nonce,
        };
        self.store.acknowledge_snapshot(&ack, self.config.session_ttl).await?;
        if ack.applied {
            self.note_applied(&ack.worker_id, ack.snapshot.ownership_epoch, ack.snapshot.version);
        } else {
            tracing::warn!(worker_id = %ack.worker_id, version = ack.snapshot.version, error_code = %cmd.error_code,
                "worker rejected a snapshot");
        }
        self.ack_signal(&ack.worker_id).notify_waiters();
        Ok(())
    }

    /// Validates `report` (sorting its counters) and stores it.
    pub async fn report_runtime(&self, mut report: RuntimeReport) -> Result<RuntimeDecision, ServiceError> {
        validate::id(&report.worker_id, "worker_id")?;
        validate::id(&report.session_id, "session_id")?;
        for (v, field) in [
            (report.sequence, "sequence"),
            (report.snapshot_version, "snapshot_version"),
            (report.ownership_epoch, "ownership_epoch"),
        ] {
            validate::bounded(v, field)?;
        }
        if report.sequence == 0 {
            return Err(ServiceError::InvalidArgument("sequence: must be positive".into()));
        }
        validate::counters(&mut report.counters, self.config.max_runtime_counters)?;
        match self
            .store
            .replace_runtime(&report, self.config.session_ttl, self.config.max_stale_age)
            .await
        {
            Ok(ownership_epoch) => {
                // The heartbeat says which version the worker runs: it stays live.
                self.note_applied(&report.worker_id, report.ownership_epoch, report.snapshot_version);
                Ok(RuntimeDecision {
                    require_full_snapshot: false,
                    ownership_epoch,
                    revoke_proxy_ids: Vec::new(),
                })
            }
            Err(StoreError::SnapshotMismatch) => Ok(RuntimeDecision {
                require_full_snapshot: true,
                ownership_epoch: self.store.current_ownership_epoch().await?,
                revoke_proxy_ids: Vec::new(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// Returns false for a batch already counted.
    pub async fn report_outcomes(&self, batch: OutcomeBatch) -> Result<bool, ServiceError> {
        validate::id(&batch.worker_id, "worker_id")?;
        validate::id(&batch.session_id, "session_id")?;
        validate::id(&batch.batch_id, "batch_id")?;
        if batch.outcomes.len() > MAX_OUTCOMES_PER_BATCH {
            return Err(ServiceError::InvalidArgument(format!(
                "outcomes: more than {MAX_OUTCOMES_PER_BATCH} in one batch"
            )));
        }
        for OutcomeCount { proxy_id, count, .. } in &batch.outcomes {
            validate::id(proxy_id, "proxy_id")?;
            if *count < 0 {
                return Err(ServiceError::InvalidArgument(
                    "outcomes: count must not be negative".into(),
                ));
            }
        }
        Ok(self
            .store
            .record_outcomes(&batch, self.config.session_ttl, self.config.outcome_dedup_ttl)
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::IssuedSnapshot;
    use crate::store::memory::MemoryStore;

    fn register(worker_id: &str) -> RegisterCommand {
        RegisterCommand {
            supported_protocol_version: PROTOCOL_VERSION,
            worker_id: worker_id.into(),
            instance_id: format!("{worker_id}-1"),
            zone: "z".into(),
            labels: Vec::new(),
        }
    }

    /// Issues `version` to the worker as a stream would, then has it ACK it.
    async fn apply(service: &Service, store: &MemoryStore, worker_id: &str, session_id: &str, version: u64) {
        let snapshot = SnapshotId {
            version,
            ownership_epoch: store.current_ownership_epoch().await.unwrap(),
            checksum: [7; 32],
        };
        let issued = IssuedSnapshot {
            worker_id: worker_id.into(),
            session_id: session_id.into(),
            snapshot,
            nonce: "n".into(),
        };
        store
            .record_issued_snapshot(&issued, Duration::from_secs(35))
            .await
            .unwrap();
        let ack = AckCommand {
            worker_id: worker_id.into(),
            session_id: session_id.into(),
            version,
            ownership_epoch: snapshot.ownership_epoch,
            checksum: snapshot.checksum.to_vec(),
            applied: true,
            error_code: String::new(),
            error_message: String::new(),
            nonce: "n".into(),
        };
        service.acknowledge(ack).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_version_is_applied_everywhere_once_every_live_worker_applied_it() {
        let store = Arc::new(MemoryStore::new());
        store.claim_ownership().await.unwrap();
        let service = Service::new(store.clone(), ServiceConfig::default(), watch::channel(None).1);
        let epoch = store.current_ownership_epoch().await.unwrap();
        assert_eq!(
            service.applied_everywhere(epoch),
            None,
            "no worker: nothing to wait for"
        );
        let a = service.register(register("gw-a")).await.unwrap();
        let b = service.register(register("gw-b")).await.unwrap();
        assert_eq!(
            service.applied_everywhere(epoch),
            Some(0),
            "registered workers have applied nothing"
        );
        apply(&service, &store, "gw-a", &a.session_id, 3).await;
        assert_eq!(service.applied_everywhere(epoch), Some(0), "b has not applied 3");
        apply(&service, &store, "gw-b", &b.session_id, 3).await;
        assert_eq!(service.applied_everywhere(epoch), Some(3));
        // A worker registering again (a restart) holds it back until it applies.
        let a = service.register(register("gw-a")).await.unwrap();
        assert_eq!(service.applied_everywhere(epoch), Some(0));
        apply(&service, &store, "gw-a", &a.session_id, 4).await;
        assert_eq!(service.applied_everywhere(epoch), Some(3));
        assert_eq!(
            service.applied_everywhere(epoch + 1),
            Some(0),
            "what was applied under another epoch counts for nothing"
        );
        tokio::time::advance(ServiceConfig::default().session_ttl).await;
        assert_eq!(
            service.applied_everywhere(epoch),
            None,
            "workers not heard from within a TTL are gone"
        );
    }
}
