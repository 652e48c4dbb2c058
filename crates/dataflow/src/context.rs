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
}

impl PipelineContext {
    /// The part of [`Self::id`] that names the tenant (`sless dev`) or its
    /// namespace (kubernetes): what names on servers that tenants share are
    /// scoped to.
    pub fn tenant(&self) -> &str {
        self.id.split_once('/').map_or(self.id.as_str(), |(tenant, _)| tenant)
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
