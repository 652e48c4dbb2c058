//! Who a pipeline is, for what its connectors keep or reach outside it.

use std::sync::Arc;

use async_trait::async_trait;

use crate::checkpoint::CheckpointStore;
use crate::egress::EgressPolicy;

/// Who a pipeline is, for what it keeps outside itself.
#[derive(Clone)]
pub struct PipelineContext {
    /// `tenant/name` in `sless dev`, `namespace/name` in kubernetes: names
    /// the default Kafka consumer group and a CDC slot.
    pub id: String,
    /// Where polling sources keep their read position; `None` when
    /// `checkpointPersistence` is off.
    pub checkpoint: Option<Arc<dyn CheckpointStore>>,
    /// Where its connectors may connect and which TLS files they may read.
    pub egress: Arc<EgressPolicy>,
    /// The pipeline's tenant's queue services, for SQS connectors that name
    /// one (`queueService`). `None` where the platform resolved them into
    /// the spec before the processor started (kubernetes).
    pub queue_services: Option<Arc<dyn QueueServices>>,
    /// Where the source resumes, as its exactly-once sink stored it
    /// ([`crate::sources::Source::resume_text`]); set by the pipeline when
    /// it connects the source, `None` elsewhere.
    pub resume: Option<String>,
    /// The tenant's requests to read tables again
    /// (`DataFlowSpec::snapshots`); set by the pipeline when it connects
    /// the source, empty elsewhere.
    pub snapshots: Vec<sless_model::dataflow::SnapshotRequest>,
    /// The tenant's key for the positions exactly-once sinks store; `None`
    /// where the platform gave none (exactly once is refused then).
    pub positions_key: Option<PositionsKey>,
    /// What it may keep on disk and hold in memory, within its tenant's and
    /// its process's bounds.
    pub budget: crate::budget::FlowBudget,
}

/// A tenant's key for the source positions its exactly-once sinks store on
/// servers other tenants may share: each stored position carries a seal
/// made with it, and one without the right seal (written or changed by
/// anyone else) is refused, never resumed from.
#[derive(Clone)]
pub struct PositionsKey([u8; 32]);

impl std::fmt::Debug for PositionsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PositionsKey(..)")
    }
}

impl PositionsKey {
    /// A new random key.
    pub fn generate() -> Self {
        Self(sless_runtime::random::bytes::<32>())
    }

    /// A key from its text ([`Self::to_text`]): 64 hex digits.
    pub fn from_text(text: &str) -> Option<Self> {
        let text = text.trim();
        if text.len() != 64 {
            return None;
        }
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(key))
    }

    pub fn to_text(&self) -> String {
        sless_runtime::hex::encode(&self.0)
    }

    fn mac(&self, row: &str, position: &str) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(row.as_bytes());
        mac.update(&[0]);
        mac.update(position.as_bytes());
        mac
    }

    /// The seal of `position` stored in row `row` (which names the
    /// dataflow and its target), as hex.
    pub fn seal(&self, row: &str, position: &str) -> String {
        use hmac::Mac;
        sless_runtime::hex::encode(&self.mac(row, position).finalize().into_bytes())
    }

    /// Whether `seal` is this key's seal of `position` in `row`, compared
    /// in constant time.
    pub fn verify(&self, row: &str, position: &str, seal: &str) -> bool {
        use hmac::Mac;
        let Some(given) = Self::from_text(seal) else {
            return false;
        };
        self.mac(row, position).verify_slice(&given.0).is_ok()
    }
}

impl PipelineContext {
    /// The part of [`Self::id`] that names the tenant (`sless dev`) or its
    /// namespace (kubernetes): what names on servers that tenants share are
    /// scoped to.
    pub fn tenant(&self) -> &str {
        self.id.split_once('/').map_or(self.id.as_str(), |(tenant, _)| tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::PositionsKey;

    #[test]
    fn a_seal_binds_the_position_to_its_row_and_key() {
        let key = PositionsKey::generate();
        let seal = key.seal("a/flow t", "p1");
        assert!(key.verify("a/flow t", "p1", &seal));
        assert!(!key.verify("a/flow t", "p2", &seal), "another position");
        assert!(!key.verify("a/other t", "p1", &seal), "another dataflow's row");
        assert!(!PositionsKey::generate().verify("a/flow t", "p1", &seal), "another key");
        assert!(!key.verify("a/flow t", "p1", "not hex"));
        let back = PositionsKey::from_text(&key.to_text()).unwrap();
        assert!(back.verify("a/flow t", "p1", &seal));
        assert!(PositionsKey::from_text("00").is_none());
        assert_eq!(format!("{key:?}"), "PositionsKey(..)");
    }
}

/// How to reach a queue service: what its tenant would put in an SDK.
#[derive(Clone, PartialEq, Eq)]
pub struct QueueAccess {
    /// The queue service's SQS endpoint, e.g. `http://host:9324/sqs/acme`.
    pub endpoint: String,
    /// The account id in its queue URLs.
    pub account_id: String,
    pub access_key: String,
    pub secret_key: String,
}

impl std::fmt::Debug for QueueAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueAccess")
            .field("endpoint", &self.endpoint)
            .field("account_id", &self.account_id)
            .finish_non_exhaustive()
    }
}

/// The queue services of one tenant: a pipeline can reach only its own.
#[async_trait]
pub trait QueueServices: Send + Sync {
    /// The endpoint and keys of queue service `name`, or why there are none
    /// (it does not exist, it is not ready).
    async fn access(&self, name: &str) -> Result<QueueAccess, String>;
}
