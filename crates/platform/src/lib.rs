//! The backend behind the REST API: it stores a desired spec, realises it and
//! reports status. `local` runs everything on this machine (`sless dev`); the
//! kubernetes backend (`sless serve`) keeps the specs as custom resources.

pub mod kubernetes;
pub mod local;

use async_trait::async_trait;

use sless_model::ValidationErrors;
use sless_model::dataflow::{DataFlowEvent, DataFlowSpec, DataFlowView};
use sless_model::name::DnsLabel;
use sless_model::queue_service::{QueueServiceSpec, QueueServiceView};

/// What a dataflow says while its processor is replaced for a new spec,
/// on either backend.
const RESTARTING_FOR_NEW_SPEC: &str = "restarting with the new spec";

#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("not found")]
    NotFound,
    #[error("an object with this name already exists")]
    AlreadyExists,
    /// A request that the current state forbids; the text is for the user.
    #[error("{0}")]
    Conflict(String),
    /// The request breaks a rule the backend enforces (a custom resource's
    /// schema, an admission webhook); each problem at its field.
    #[error("{0}")]
    Invalid(ValidationErrors),
    /// The backend refused the request as malformed; the text is for the user.
    #[error("{0}")]
    BadRequest(String),
    /// The backend forbids the request (an admission policy, a namespace
    /// being deleted); the text is for the user.
    #[error("{0}")]
    Forbidden(String),
    /// The tenant already holds as many objects of the kind as its quota
    /// allows (the number).
    #[error("the tenant holds its quota of {0}")]
    QuotaReached(usize),
    /// The backing store or cluster failed; details are logged, not returned.
    #[error("backend unavailable: {0}")]
    Unavailable(Box<dyn std::error::Error + Send + Sync>),
}

pub type Result<T, E = PlatformError> = std::result::Result<T, E>;

/// Why `requested` cannot be created when the tenant has `existing`: a
/// tenant has one queue service (seed 000 serves it at `/sqs/{tenant}`).
pub fn one_queue_service(tenant: &DnsLabel, existing: &str, requested: &str) -> PlatformError {
    if existing == requested {
        return PlatformError::AlreadyExists;
    }
    PlatformError::Conflict(format!(
        "tenant {tenant} already has queue service \"{existing}\": a tenant has one queue service, \
         served at /sqs/{tenant}; it holds up to {} queues",
        sless_sqs::engine::MAX_QUEUES
    ))
}

/// Every call is scoped to one tenant: an object of another tenant is
/// `NotFound`, exactly as if it did not exist.
#[async_trait]
pub trait Platform: Send + Sync {
    async fn create_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView>;
    async fn get_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<QueueServiceView>;
    async fn list_queue_services(&self, tenant: &DnsLabel) -> Result<Vec<QueueServiceView>>;
    async fn update_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView>;
    async fn delete_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()>;

    /// Creates a dataflow unless the tenant holds `quota` of them already:
    /// the count and the create are one step, whatever else creates at once.
    async fn create_dataflow(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: DataFlowSpec,
        quota: usize,
    ) -> Result<DataFlowView>;
    async fn get_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<DataFlowView>;
    async fn list_dataflows(&self, tenant: &DnsLabel) -> Result<Vec<DataFlowView>>;
    async fn update_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel, spec: DataFlowSpec) -> Result<DataFlowView>;
    async fn delete_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()>;
    /// The dataflow's recent events, newest first, at most
    /// [`sless_model::dataflow::MAX_EVENTS`].
    async fn dataflow_events(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<Vec<DataFlowEvent>>;

    /// What `tenant`'s dataflows are named by on servers tenants share
    /// ([`sless_dataflow::context::PipelineContext::tenant`]): slot,
    /// publication and consumer-group names must begin with its prefix.
    fn pipeline_tenant(&self, tenant: &DnsLabel) -> String;

    /// Whether the backend can serve requests (for `/readyz`).
    async fn ready(&self) -> Result<()>;

    /// What a queue service that leaves a field out gets (its replicas
    /// depend on the platform).
    fn default_queue_spec(&self) -> QueueServiceSpec {
        QueueServiceSpec::default()
    }

    /// Live counters of the dataflows this process runs, for `/metrics`.
    fn dataflow_samples(&self) -> Vec<sless_dataflow::metrics::FlowSample> {
        Vec::new()
    }
}
