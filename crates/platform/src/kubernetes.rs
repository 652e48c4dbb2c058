//! The kubernetes backend of the REST API (seed 000, step 7): a tenant's
//! queue service and dataflows are custom resources in its namespace
//! `sless-fn-{tenant}`, which the operator reconciles. A tenant reaches
//! only its own namespace, so another tenant's object is simply not found.

use async_trait::async_trait;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Event, Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use super::{Platform, PlatformError, Result};
use sless_dataflow::metrics::{MAX_EXPOSITION_BYTES, counters_of};
use sless_model::FieldError;
use sless_model::dataflow::{
    DataFlowCounters, DataFlowEvent, DataFlowPhase, DataFlowSpec, DataFlowView, EventKind, MAX_EVENTS,
};
use sless_model::name::DnsLabel;
use sless_model::queue_service::{QueueServicePhase, QueueServiceSpec, QueueServiceView};
use sless_operator::config::FIELD_MANAGER;
use sless_operator::crd::dataflow::{DataFlow, DataFlowCrdSpec};
use sless_operator::crd::queue_service::{self as qs_crd, QueueService};
use sless_operator::dataflow::processor::Processors;
use sless_operator::queue_service::builders::{namespace_name, secret_name};

mod errors;

use errors::{api_error, on_create};

/// The ResourceQuota of a tenant's namespace, and what it counts.
const TENANT_QUOTA: &str = "sless-tenant";
const DATAFLOW_COUNT: &str = "count/dataflows.dataflow.dataflow.io";
/// How the API server words a create over a quota, and one refused because
/// the quota's usage is not counted yet.
pub(crate) const QUOTA_EXCEEDED: &str = "exceeded quota";
const QUOTA_UNCOUNTED: &str = "status unknown for quota";
/// How long a quota just made may stay uncounted. The quota controller
/// learns a new kind (the DataFlow CRD, just installed) at its discovery
/// resync, every 30 s; a real cluster took that long for the first
/// dataflow after `deploy/` was applied. Past it, the tenant gets 503.
const QUOTA_COUNTED_WITHIN: std::time::Duration = std::time::Duration::from_secs(45);

pub struct KubePlatform {
    client: Client,
    /// Create a tenant's namespace on its first object (else the platform
    /// provisions it).
    create_namespaces: bool,
    /// Reads processors' counters from their pods' `/metrics`.
    processors: Processors,
    /// The region of queue ARNs, shown with each queue service.
    region: String,
}

/// The items of a list; a tenant whose namespace does not exist yet has none.
fn listed<K: Clone>(list: Result<kube::api::ObjectList<K>, kube::Error>) -> Result<Vec<K>> {
    match list.map_err(api_error) {
        Ok(list) => Ok(list.items),
        Err(PlatformError::NotFound) => Ok(Vec::new()),
        Err(other) => Err(other),
    }
}

/// What the admission webhook would deny, refused here with its field: a
/// secret reference outside the tenant's namespace.
fn check_secret_references(tenant: &DnsLabel, spec: &DataFlowSpec) -> Result<()> {
    sless_operator::dataflow::referenced_secrets(spec, &namespace_name(tenant.as_str()))
        .map(drop)
        .map_err(|e| PlatformError::Invalid(FieldError::from(e).into()))
}

fn params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

impl KubePlatform {
    pub fn new(client: Client, create_namespaces: bool, region: String) -> Self {
        Self {
            client,
            create_namespaces,
            processors: Processors::default(),
            region,
        }
    }

    /// Where processors serve `/metrics` (a test serves it elsewhere).
    pub fn with_processor_metrics_port(mut self, port: u16) -> Self {
        self.processors = Processors::on_port(port);
        self
    }

    /// The live counters of a dataflow's processor, read from its ready
    /// pod's `/metrics` (the processor runs in its own pod, so nothing
    /// else holds them); `None` while no pod is ready or it does not answer.
    async fn counters(&self, tenant: &DnsLabel, name: &str) -> Option<DataFlowCounters> {
        let text = self
            .processors
            .metrics(
                &self.client,
                &namespace_name(tenant.as_str()),
                name,
                MAX_EXPOSITION_BYTES,
            )
            .await?;
        counters_of(&text, name, SystemTime::now())
    }

    fn queues(&self, tenant: &DnsLabel) -> Api<QueueService> {
        Api::namespaced(self.client.clone(), &namespace_name(tenant.as_str()))
    }

    fn flows(&self, tenant: &DnsLabel) -> Api<DataFlow> {
        Api::namespaced(self.client.clone(), &namespace_name(tenant.as_str()))
    }

    /// Caps the tenant's dataflows at `quota` with a ResourceQuota in its
    /// namespace: the API server counts and admits each create in one
    /// step, whichever replica of the API sends it.
    async fn apply_quota(&self, tenant: &DnsLabel, quota: usize) -> Result<()> {
        use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let object = ResourceQuota {
            metadata: kube::api::ObjectMeta {
                name: Some(TENANT_QUOTA.into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some([(DATAFLOW_COUNT.to_owned(), Quantity(quota.to_string()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Api::<ResourceQuota>::namespaced(self.client.clone(), &namespace_name(tenant.as_str()))
            .patch(
                TENANT_QUOTA,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map(drop)
            .map_err(api_error)
    }

    async fn ensure_namespace(&self, tenant: &DnsLabel) -> Result<()> {
        if !self.create_namespaces {
            return Ok(());
        }
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(namespace_name(tenant.as_str())),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<Namespace>::all(self.client.clone()).create(&params(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(api_error(e)),
        }
    }

    /// A queue service as the API shows it, keys from its Secret.
    async fn queue_view(&self, tenant: &DnsLabel, qs: QueueService) -> Result<QueueServiceView> {
        let status = qs.status.clone().unwrap_or_default();
        // Ready describes the spec the operator last saw; a newer one is
        // not Ready until its engine runs (a status without the field is
        // from before the spec's first reconcile).
        let behind = status.observed_generation.unwrap_or(0) < qs.metadata.generation.unwrap_or(0);
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace_name(tenant.as_str()));
        let keys = secrets
            .get_opt(&secret_name(tenant.as_str()))
            .await
            .map_err(api_error)?
            .map(sless_operator::objects::secret_strings)
            .unwrap_or_default();
        Ok(QueueServiceView {
            name: qs.name_any(),
            tenant_id: tenant.to_string(),
            memory_mb: qs.spec.memory_mb,
            storage_mb: qs.spec.storage_mb,
            persistence: qs.spec.persistence,
            durability: qs.spec.durability,
            replicas: qs.spec.replicas(),
            requests_per_second: qs.spec.requests_per_second,
            bytes_per_second: qs.spec.bytes_per_second,
            // Marked for deletion: going, whatever the operator wrote last.
            // A spec the operator has not reconciled yet is not Ready yet:
            // the status it wrote is of the previous spec.
            phase: if qs.metadata.deletion_timestamp.is_some() {
                QueueServicePhase::Deleting
            } else if status.route_left_out.is_some() {
                // No gateway serves it, whatever its engine does.
                QueueServicePhase::Failed
            } else if (behind || status.routed != Some(true)) && status.phase == Some(QueueServicePhase::Ready) {
                // Nor is one the gateways do not all route yet.
                QueueServicePhase::Provisioning
            } else {
                status.phase.unwrap_or(QueueServicePhase::Pending)
            },
            endpoint: status.endpoint,
            region: self.region.clone(),
            access_key: keys.get("accessKey").cloned(),
            secret_key: keys.get("secretKey").cloned(),
            message: match status.route_left_out {
                Some(reason) => Some(format!("the gateways cannot route it: {reason}")),
                None => status.message,
            },
            created_at: qs
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            ready_at: status.ready_at.map(|t| t.0.to_string()),
        })
    }
}

fn crd_spec(spec: DataFlowSpec, keep: Option<&DataFlowCrdSpec>) -> DataFlowCrdSpec {
    DataFlowCrdSpec {
        source: spec.source,
        sink: spec.sink,
        transformations: spec.transformations,
        errors: spec.errors,
        resources: spec.resources,
        // Set with kubectl, not through the REST API: an update keeps them.
        scheduling: keep.and_then(|k| k.scheduling.clone()),
        processor_image: keep.and_then(|k| k.processor_image.clone()),
        checkpoint_persistence: Some(spec.checkpoint_persistence),
        channel_buffer_size: Some(spec.channel_buffer_size),
        snapshots: spec.snapshots,
    }
}

fn flow_view(tenant: &DnsLabel, df: DataFlow) -> DataFlowView {
    let status = df.status.clone().unwrap_or_default();
    // A spec the operator has not taken up yet: its processor is being
    // replaced, and the status it wrote is of the previous spec.
    let behind = status
        .observed_generation
        .is_some_and(|seen| Some(seen) < df.metadata.generation);
    let (phase, message) = if behind {
        (DataFlowPhase::Pending, Some(crate::RESTARTING_FOR_NEW_SPEC.to_owned()))
    } else {
        (status.phase.unwrap_or(DataFlowPhase::Pending), status.message)
    };
    let spec = df.spec;
    DataFlowView {
        name: df.metadata.name.clone().unwrap_or_default(),
        tenant_id: tenant.to_string(),
        source: spec.source,
        sink: spec.sink,
        transformations: spec.transformations,
        errors: spec.errors,
        resources: spec.resources,
        checkpoint_persistence: spec.checkpoint_persistence.unwrap_or(true),
        channel_buffer_size: spec
            .channel_buffer_size
            .unwrap_or(sless_model::dataflow::DEFAULT_CHANNEL_BUFFER_SIZE),
        snapshots: spec.snapshots,
        phase,
        message,
        created_at: df
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        // Filled in by `get_dataflow` from the processor's pod.
        counters: None,
    }
}

/// A Kubernetes Event as a dataflow event. The operator publishes
/// events.k8s.io/v1 Events; the API server serves the same objects as
/// core/v1 Events, whose field selectors name `involvedObject`.
fn flow_event(e: Event) -> (k8s_openapi::jiff::Timestamp, DataFlowEvent) {
    let at = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
        .or(e.last_timestamp.map(|t| t.0))
        .or(e.event_time.map(|t| t.0))
        .or(e.metadata.creation_timestamp.map(|t| t.0))
        .unwrap_or_default();
    let count = e.series.as_ref().and_then(|s| s.count).or(e.count).unwrap_or(1);
    let event = DataFlowEvent {
        at: at.to_string(),
        kind: if e.type_.as_deref() == Some("Warning") {
            EventKind::Warning
        } else {
            EventKind::Normal
        },
        reason: e.reason.unwrap_or_default(),
        message: e.message.unwrap_or_default(),
        count: u32::try_from(count).unwrap_or(1),
    };
    (at, event)
}

#[async_trait]
impl Platform for KubePlatform {
    /// Three replicas: a node lost takes one of them, not the queues.
    fn default_queue_spec(&self) -> QueueServiceSpec {
        QueueServiceSpec {
            replicas: qs_crd::DEFAULT_REPLICAS,
            ..QueueServiceSpec::default()
        }
    }

    async fn create_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView> {
        self.ensure_namespace(tenant).await?;
        let api = self.queues(tenant);
        if let Some(other) = api.list(&ListParams::default()).await.map_err(api_error)?.items.first() {
            return Err(super::one_queue_service(tenant, &other.name_any(), name.as_str()));
        }
        let qs = QueueService::new(
            name.as_str(),
            qs_crd::QueueServiceSpec {
                tenant_id: tenant.to_string(),
                memory_mb: spec.memory_mb,
                storage_mb: spec.storage_mb,
                persistence: spec.persistence,
                engine: qs_crd::QueueEngine::default(),
                durability: spec.durability,
                replicas: Some(spec.replicas),
                requests_per_second: spec.requests_per_second,
                bytes_per_second: spec.bytes_per_second,
            },
        );
        let created = api.create(&params(), &qs).await.map_err(on_create)?;
        self.queue_view(tenant, created).await
    }

    async fn get_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<QueueServiceView> {
        let qs = self.queues(tenant).get(name.as_str()).await.map_err(api_error)?;
        self.queue_view(tenant, qs).await
    }

    async fn list_queue_services(&self, tenant: &DnsLabel) -> Result<Vec<QueueServiceView>> {
        let mut views = Vec::new();
        for qs in listed(self.queues(tenant).list(&ListParams::default()).await)? {
            views.push(self.queue_view(tenant, qs).await?);
        }
        Ok(views)
    }

    async fn update_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView> {
        let current = self.queues(tenant).get(name.as_str()).await.map_err(api_error)?;
        changeable(&current.spec, &spec)?;
        // A rate left out is null, which a merge patch removes: the
        // platform's default again.
        let patch = serde_json::json!({"spec": {
            "memoryMB": spec.memory_mb, "storageMB": spec.storage_mb, "persistence": spec.persistence,
            "durability": spec.durability, "replicas": spec.replicas,
            "requestsPerSecond": spec.requests_per_second, "bytesPerSecond": spec.bytes_per_second,
        }});
        let qs = self
            .queues(tenant)
            .patch(name.as_str(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
        self.queue_view(tenant, qs).await
    }

    async fn delete_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()> {
        self.queues(tenant)
            .delete(name.as_str(), &DeleteParams::default())
            .await
            .map(drop)
            .map_err(api_error)
    }

    async fn create_dataflow(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: DataFlowSpec,
        quota: usize,
    ) -> Result<DataFlowView> {
        check_secret_references(tenant, &spec)?;
        self.ensure_namespace(tenant).await?;
        self.apply_quota(tenant, quota).await?;
        let df = DataFlow::new(name.as_str(), crd_spec(spec, None));
        // A quota the cluster has not counted yet refuses creates for a
        // moment after it is made.
        let deadline = tokio::time::Instant::now() + QUOTA_COUNTED_WITHIN;
        loop {
            let outcome = self.flows(tenant).create(&params(), &df).await;
            if let Err(kube::Error::Api(status)) = &outcome
                && status.message.contains(QUOTA_UNCOUNTED)
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                continue;
            }
            match outcome.map_err(on_create) {
                Ok(created) => return Ok(flow_view(tenant, created)),
                Err(PlatformError::Forbidden(reason)) if reason.contains(QUOTA_EXCEEDED) => {
                    // Quota admission answers before the name is looked at:
                    // a name the tenant holds is a conflict, as in sless dev.
                    let held = self.flows(tenant).get_opt(name.as_str()).await.map_err(api_error)?;
                    return Err(match held {
                        Some(_) => PlatformError::AlreadyExists,
                        None => PlatformError::QuotaReached(quota),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Its namespace: a processor's id is `namespace/name`.
    fn pipeline_tenant(&self, tenant: &DnsLabel) -> String {
        namespace_name(tenant.as_str())
    }

    /// With the processor's counters; a list leaves them out (a request to
    /// every processor for one list).
    async fn get_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<DataFlowView> {
        let df = self.flows(tenant).get(name.as_str()).await.map_err(api_error)?;
        let counters = self.counters(tenant, name.as_str()).await;
        Ok(DataFlowView {
            counters,
            ..flow_view(tenant, df)
        })
    }

    async fn list_dataflows(&self, tenant: &DnsLabel) -> Result<Vec<DataFlowView>> {
        let flows = listed(self.flows(tenant).list(&ListParams::default()).await)?;
        Ok(flows.into_iter().map(|df| flow_view(tenant, df)).collect())
    }

    async fn update_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel, spec: DataFlowSpec) -> Result<DataFlowView> {
        check_secret_references(tenant, &spec)?;
        let api = self.flows(tenant);
        let mut df = api.get(name.as_str()).await.map_err(api_error)?;
        df.spec = crd_spec(spec, Some(&df.spec));
        // Carries the resourceVersion read: a concurrent change is a 409.
        let updated = api.replace(name.as_str(), &params(), &df).await.map_err(api_error)?;
        Ok(flow_view(tenant, updated))
    }

    async fn delete_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()> {
        self.flows(tenant)
            .delete(name.as_str(), &DeleteParams::default())
            .await
            .map(drop)
            .map_err(api_error)
    }

    async fn dataflow_events(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<Vec<DataFlowEvent>> {
        let df = self.flows(tenant).get(name.as_str()).await.map_err(api_error)?;
        let selector = format!("involvedObject.kind=DataFlow,involvedObject.name={name}");
        let events = Api::<Event>::namespaced(self.client.clone(), &namespace_name(tenant.as_str()))
            .list(&ListParams::default().fields(&selector))
            .await;
        // A dataflow deleted and made again keeps its name, not its uid.
        let mut events: Vec<_> = listed(events)?
            .into_iter()
            .filter(|e| e.involved_object.uid == df.metadata.uid)
            .map(flow_event)
            .collect();
        events.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        Ok(events.into_iter().take(MAX_EVENTS).map(|(_, e)| e).collect())
    }

    async fn ready(&self) -> Result<()> {
        self.client.apiserver_version().await.map(drop).map_err(api_error)
    }
}

/// What this platform cannot change in place yet, refused rather than
/// left undone: the volumes' size (a StatefulSet's claim template cannot
/// change, and volumes grow only where their class allows).
fn changeable(now: &qs_crd::QueueServiceSpec, asked: &QueueServiceSpec) -> Result<()> {
    let refused = |field: &str, message: String| {
        Err(PlatformError::Invalid(
            sless_model::FieldError::invalid(field, message).into(),
        ))
    };
    if asked.storage_mb != now.storage_mb {
        return refused(
            "storageMB",
            format!(
                "the volumes' size cannot change on the Kubernetes platform yet (it is {})",
                now.storage_mb
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
