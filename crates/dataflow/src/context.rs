//! Who a pipeline is, for what its connectors keep or reach outside it.

use std::sync::Arc;

use crate::checkpoint::CheckpointStore;
use crate::egress::EgressPolicy;

/// Who a pipeline is, for what it keeps outside itself.
#[derive(Clone)]
pub struct PipelineContext {
    /// `tenant/name` in `sless dev`, `namespace/name` in kubernetes: names
    /// the default Kafka consumer group.
    pub id: String,
    /// Where polling sources keep their read position; `None` when
    /// `checkpointPersistence` is off.
    pub checkpoint: Option<Arc<dyn CheckpointStore>>,
    /// Where its connectors may connect and which TLS files they may read.
    pub egress: Arc<EgressPolicy>,
}
