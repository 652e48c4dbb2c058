//! The local platform of `sless dev`: desired state in the embedded store,
//! realised on this machine by a reconcile loop.

pub mod checkpoint;
pub mod db;
mod engines;
mod flows;
mod replicas;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

use super::{Platform, PlatformError, Result};
use sless_controlplane::publisher::{PublishedSnapshot, SnapshotPublisher};
use sless_controlplane::store::ControlStore;
use sless_sqs::credentials;
use sless_sqs::gateway::routes;

use self::checkpoint::EmbeddedCheckpoint;
use self::db::{Record, Store, StoreError};
use self::engines::RunningEngine;
use self::flows::{Releases, RunningFlow, flow_id};
use sless_dataflow::budget::Budgets;
use sless_dataflow::egress::EgressPolicy;
use sless_model::dataflow::DataFlowPhase;
use sless_model::dataflow::{DataFlowEvent, DataFlowSpec, DataFlowStatus, DataFlowView};
use sless_model::name::DnsLabel;
use sless_model::queue_service::QueueServicePhase;
use sless_model::queue_service::{Credentials, QueueServiceSpec, QueueServiceStatus, QueueServiceView};
use sless_runtime::sync::Unpoisoned;

const QUEUE_SERVICE: &str = "queue-service";
const DATAFLOW: &str = "dataflow";

/// How often the reconcile loop re-checks everything without being woken…
const RESYNC: Duration = Duration::from_secs(5);
/// …and how often while an object is still on its way to Ready.
const RESYNC_PENDING: Duration = Duration::from_millis(200);

/// Stored status of a local queue service: its status plus its keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QueueState {
    status: QueueServiceStatus,
    credentials: Credentials,
}

type QueueRecord = Record<QueueServiceSpec, QueueState>;
type DataFlowRecord = Record<DataFlowSpec, DataFlowStatus>;

impl From<StoreError> for PlatformError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::AlreadyExists => PlatformError::AlreadyExists,
            other => PlatformError::Unavailable(Box::new(other)),
        }
    }
}

/// What the local platform needs of the gateway and its control plane.
pub struct GatewayLink {
    /// Receives the routing table after every reconcile pass.
    pub publisher: SnapshotPublisher,
    /// Snapshots as published, to learn which version holds a route.
    pub published: tokio::sync::watch::Receiver<Option<Arc<PublishedSnapshot>>>,
    /// Control-plane state, to read what the gateway acknowledged.
    pub control: Arc<dyn ControlStore>,
    pub worker_id: String,
    /// Public base URL of the gateway; endpoints are `{public_url}/sqs/{tenant}`.
    pub public_url: String,
    /// The region of queue ARNs (`--region`).
    pub region: String,
    /// Where the engines are registered for the gateway to call directly.
    pub engines: sless_sqs::gateway::proxy::InProcessEngines,
    /// The connection caps every engine's port shares: they take the
    /// descriptors of one process.
    pub engine_connections: Arc<sless_runtime::http::Admission>,
}

pub struct LocalPlatform {
    store: Store,
    /// Queue journals live in `{data_dir}/queues/{tenant}.journal`; kept on delete.
    data_dir: PathBuf,
    gateway: GatewayLink,
    engines: Mutex<HashMap<String, RunningEngine>>,
    /// Processors by (tenant, name).
    flows: std::sync::Mutex<HashMap<(String, String), RunningFlow>>,
    /// Held while processors are started or stopped, so that a delete or a
    /// shutdown never races a reconcile pass starting the same dataflow.
    flow_lifecycle: Mutex<()>,
    releases: Releases,
    /// Tenant → (backend, first snapshot version that routes it there).
    route_versions: std::sync::Mutex<HashMap<String, (String, u64)>>,
    http: reqwest::Client,
    wake: Arc<Notify>,
    /// Serialises creation: what a tenant holds is counted, then inserted
    /// (one queue service, its quota of dataflows).
    create_lock: Mutex<()>,
    /// Where dataflows may connect.
    egress: Arc<EgressPolicy>,
    /// What dataflows may keep on disk and hold in memory, per tenant and
    /// in all.
    budgets: Arc<Budgets>,
    /// The `sless` executable that runs queue engine replicas; without it,
    /// a queue service runs one engine in this process.
    replica_program: Option<PathBuf>,
    /// The replicas of a queue service that does not say.
    default_replicas: u8,
}

/// How the local platform runs queue engines of several replicas.
#[derive(Debug, Clone, Default)]
pub struct ReplicaOptions {
    /// The `sless` executable (`sless queue` runs each replica).
    pub program: Option<PathBuf>,
    /// The replicas of a queue service that does not say: 1 or 3.
    pub default: u8,
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn queue_view(r: QueueRecord, region: &str) -> QueueServiceView {
    QueueServiceView {
        name: r.name,
        tenant_id: r.tenant,
        memory_mb: r.spec.memory_mb,
        storage_mb: r.spec.storage_mb,
        persistence: r.spec.persistence,
        durability: r.spec.durability,
        replicas: r.spec.replicas,
        requests_per_second: r.spec.requests_per_second,
        bytes_per_second: r.spec.bytes_per_second,
        phase: r.status.status.phase,
        endpoint: r.status.status.endpoint,
        region: region.to_owned(),
        access_key: Some(r.status.credentials.access_key),
        secret_key: Some(r.status.credentials.secret_key),
        message: r.status.status.message,
        created_at: r.created_at,
        ready_at: r.status.status.ready_at,
    }
}

fn dataflow_view(r: DataFlowRecord, counters: Option<sless_model::dataflow::DataFlowCounters>) -> DataFlowView {
    DataFlowView {
        name: r.name,
        tenant_id: r.tenant,
        source: r.spec.source,
        sink: r.spec.sink,
        transformations: r.spec.transformations,
        errors: r.spec.errors,
        resources: r.spec.resources,
        checkpoint_persistence: r.spec.checkpoint_persistence,
        channel_buffer_size: r.spec.channel_buffer_size,
        snapshots: r.spec.snapshots,
        phase: r.status.phase,
        message: r.status.message,
        created_at: r.created_at,
        counters,
    }
}

impl LocalPlatform {
    pub fn new(
        store: Store,
        data_dir: PathBuf,
        gateway: GatewayLink,
        egress: Arc<EgressPolicy>,
        budgets: Arc<Budgets>,
        replicas: ReplicaOptions,
    ) -> Arc<Self> {
        Arc::new(Self {
            // Replicas need the program that runs them.
            default_replicas: if replicas.program.is_some()
                && sless_model::queue_service::REPLICAS.contains(&replicas.default)
            {
                replicas.default
            } else {
                1
            },
            replica_program: replicas.program,
            store,
            data_dir,
            gateway,
            egress,
            budgets,
            engines: Mutex::default(),
            flows: std::sync::Mutex::default(),
            flow_lifecycle: Mutex::default(),
            releases: Releases::default(),
            route_versions: std::sync::Mutex::default(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(1))
                .build()
                .unwrap_or_default(),
            wake: Arc::new(Notify::new()),
            create_lock: Mutex::new(()),
        })
    }

    /// One pass, before the API serves: a status stored by a previous run
    /// (Ready, say) is recomputed from what runs now.
    pub async fn reconcile_now(&self) {
        if let Err(e) = self.reconcile_all().await {
            tracing::warn!(error = %e, "start-up reconcile pass failed");
        }
    }

    /// Runs the reconcile loop until `shutdown` resolves, then stops every
    /// dataflow processor once it has written and committed its batch.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let pending = match self.reconcile_all().await {
                Ok(pending) => pending,
                Err(e) => {
                    tracing::warn!(error = %e, "reconcile pass failed; retrying");
                    true
                }
            };
            tokio::select! {
                () = &mut shutdown => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(if pending { RESYNC_PENDING } else { RESYNC }) => {}
            }
        }
        let _lifecycle = self.flow_lifecycle.lock().await;
        let flows: Vec<RunningFlow> = self.flows.lock_unpoisoned().drain().map(|(_, flow)| flow).collect();
        RunningFlow::all_finished(flows).await;
        self.releases.all_settled().await;
    }

    /// One pass over everything; returns whether something is not Ready yet.
    async fn reconcile_all(&self) -> Result<bool, StoreError> {
        let queues: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, None).await?;
        let backends = self.ensure_engines(&queues).await;
        // Its own keys make every route sless dev publishes usable; one
        // left out all the same is logged by the snapshot.
        let (snapshot, _) = routes::snapshot(queues.iter().map(|q| {
            let backend = backends.get(&q.tenant).and_then(|b| b.as_ref().ok());
            routes::Route {
                tenant: &q.tenant,
                backend_address: backend.map(|b| b.address.as_str()),
                backend_token: backend.map(|b| b.token.as_str()),
                credentials: &q.status.credentials,
                requests_per_second: q.spec.requests_per_second,
                bytes_per_second: q.spec.bytes_per_second,
            }
        }));
        self.gateway.publisher.publish(snapshot);
        self.learn_route_versions();
        let acked = match self.gateway.control.session(&self.gateway.worker_id).await {
            Ok(session) => session.map_or(0, |s| s.acked_version),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the gateway session");
                0
            }
        };
        let mut pending = false;
        for q in queues {
            let backend = match backends.get(&q.tenant) {
                Some(Ok(backend)) => Ok(backend),
                Some(Err(message)) => Err(message.clone()),
                None => Err("queue engine not started".into()),
            };
            pending |= self.reconcile_queue_service(q, backend, acked).await? != QueueServicePhase::Ready;
        }
        let _lifecycle = self.flow_lifecycle.lock().await;
        let flows: Vec<DataFlowRecord> = self.store.list(DATAFLOW, None).await?;
        self.stop_deleted_flows(&flows).await;
        // Processors report through `wake`; dataflows need no polling.
        for f in flows {
            self.reconcile_dataflow(f).await?;
        }
        Ok(pending)
    }

    /// Starts an engine for every queue service without one and stops those
    /// of deleted services. Returns each tenant's backend address and token,
    /// or the error.
    /// Refuses replicas this platform cannot run (no program to run them).
    fn can_run(&self, spec: &QueueServiceSpec) -> Result<()> {
        if spec.replicas == 1 || self.replica_program.is_some() {
            return Ok(());
        }
        Err(PlatformError::Invalid(
            sless_model::FieldError::invalid("replicas", "this platform runs one queue engine per queue service")
                .into(),
        ))
    }

    async fn queue(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<QueueRecord> {
        self.store
            .get(QUEUE_SERVICE, tenant.as_str(), name.as_str())
            .await?
            .ok_or(PlatformError::NotFound)
    }

    async fn dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<DataFlowRecord> {
        self.store
            .get(DATAFLOW, tenant.as_str(), name.as_str())
            .await?
            .ok_or(PlatformError::NotFound)
    }
}

#[async_trait]
impl Platform for LocalPlatform {
    async fn create_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView> {
        self.can_run(&spec)?;
        let _guard = self.create_lock.lock().await;
        let existing: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, Some(tenant.as_str())).await?;
        if let Some(other) = existing.first() {
            return Err(super::one_queue_service(tenant, &other.name, name.as_str()));
        }
        let record = QueueRecord {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
            status: QueueState {
                status: QueueServiceStatus::pending(),
                credentials: credentials::generate(tenant.as_str()),
            },
            created_at: now_rfc3339(),
            generation: 1,
        };
        self.store.insert(QUEUE_SERVICE, record.clone()).await?;
        self.wake.notify_one();
        Ok(queue_view(record, &self.gateway.region))
    }

    async fn get_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<QueueServiceView> {
        self.queue(tenant, name)
            .await
            .map(|r| queue_view(r, &self.gateway.region))
    }

    async fn list_queue_services(&self, tenant: &DnsLabel) -> Result<Vec<QueueServiceView>> {
        let records: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, Some(tenant.as_str())).await?;
        Ok(records
            .into_iter()
            .map(|r| queue_view(r, &self.gateway.region))
            .collect())
    }

    async fn update_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView> {
        self.can_run(&spec)?;
        let current = self.queue(tenant, name).await?;
        // The engine restarts for a new durability or number of replicas:
        // not Ready until it has, so that a caller waiting for Ready does
        // not take the old engine's.
        let restart = if current.spec.replicas != spec.replicas {
            Some("changing the queue engine's replicas")
        } else {
            (current.spec.durability != spec.durability)
                .then_some("restarting the queue engine with the new durability")
        };
        let restarting = restart.map(|why| QueueState {
            status: QueueServiceStatus {
                phase: QueueServicePhase::Provisioning,
                message: Some(why.into()),
                endpoint: None,
                ready_at: current.status.status.ready_at.clone(),
            },
            credentials: current.status.credentials.clone(),
        });
        if !self
            .store
            .update_spec(
                QUEUE_SERVICE,
                tenant.as_str(),
                name.as_str(),
                &spec,
                restarting.as_ref(),
            )
            .await?
        {
            return Err(PlatformError::NotFound);
        }
        self.wake.notify_one();
        self.get_queue_service(tenant, name).await
    }

    async fn delete_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()> {
        if !self.store.delete(QUEUE_SERVICE, tenant.as_str(), name.as_str()).await? {
            return Err(PlatformError::NotFound);
        }
        self.wake.notify_one();
        Ok(())
    }

    async fn create_dataflow(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: DataFlowSpec,
        quota: usize,
    ) -> Result<DataFlowView> {
        let _guard = self.create_lock.lock().await;
        let held: Vec<DataFlowRecord> = self.store.list(DATAFLOW, Some(tenant.as_str())).await?;
        // A name the tenant holds is a conflict whatever the quota.
        if held.len() >= quota && !held.iter().any(|f| f.name == name.as_str()) {
            return Err(PlatformError::QuotaReached(quota));
        }
        let record = DataFlowRecord {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
            status: DataFlowStatus {
                phase: DataFlowPhase::Pending,
                message: Some("accepted; waiting to be provisioned".into()),
            },
            created_at: now_rfc3339(),
            generation: 1,
        };
        self.store.insert(DATAFLOW, record.clone()).await?;
        self.wake.notify_one();
        Ok(dataflow_view(record, None))
    }

    async fn get_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<DataFlowView> {
        self.dataflow(tenant, name).await.map(|r| self.flow_view(r))
    }

    /// The tenant itself: a dataflow's id is `tenant/name` here.
    fn pipeline_tenant(&self, tenant: &DnsLabel) -> String {
        tenant.to_string()
    }

    async fn list_dataflows(&self, tenant: &DnsLabel) -> Result<Vec<DataFlowView>> {
        let records: Vec<DataFlowRecord> = self.store.list(DATAFLOW, Some(tenant.as_str())).await?;
        Ok(records.into_iter().map(|r| self.flow_view(r)).collect())
    }

    async fn update_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel, spec: DataFlowSpec) -> Result<DataFlowView> {
        // A new spec restarts the processor: Pending until it has, so that a
        // caller waiting for the dataflow to leave Pending (Terraform) sees
        // how the new spec runs, not how the old one ran.
        let restarting = DataFlowStatus {
            phase: DataFlowPhase::Pending,
            message: Some(crate::RESTARTING_FOR_NEW_SPEC.into()),
        };
        if !self
            .store
            .update_spec(DATAFLOW, tenant.as_str(), name.as_str(), &spec, Some(&restarting))
            .await?
        {
            return Err(PlatformError::NotFound);
        }
        self.wake.notify_one();
        self.get_dataflow(tenant, name).await
    }

    async fn delete_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<()> {
        let _lifecycle = self.flow_lifecycle.lock().await;
        if !self.store.delete(DATAFLOW, tenant.as_str(), name.as_str()).await? {
            return Err(PlatformError::NotFound);
        }
        let running = self
            .flows
            .lock_unpoisoned()
            .remove(&(tenant.to_string(), name.to_string()));
        if let Some(flow) = running {
            flow.deleted((tenant.to_string(), name.to_string()), &self.releases)
                .await;
        }
        // A new dataflow of the same name starts from the beginning: its
        // processor has stopped, so nothing writes this position again.
        self.store
            .delete_setting(EmbeddedCheckpoint::setting_key(&flow_id(
                tenant.as_str(),
                name.as_str(),
            )))
            .await?;
        self.wake.notify_one();
        Ok(())
    }

    async fn dataflow_events(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<Vec<DataFlowEvent>> {
        self.dataflow(tenant, name).await?;
        let events = self
            .flows
            .lock_unpoisoned()
            .get(&(tenant.to_string(), name.to_string()))
            .map(|f| f.events.clone());
        Ok(events.map(|e| e.lock_unpoisoned().newest_first()).unwrap_or_default())
    }

    async fn ready(&self) -> Result<()> {
        Ok(self.store.ping().await?)
    }

    fn default_queue_spec(&self) -> QueueServiceSpec {
        QueueServiceSpec {
            replicas: self.default_replicas,
            ..QueueServiceSpec::default()
        }
    }

    fn dataflow_samples(&self) -> Vec<sless_dataflow::metrics::FlowSample> {
        self.flows
            .lock_unpoisoned()
            .iter()
            .map(|((tenant, name), flow)| sless_dataflow::metrics::FlowSample {
                namespace: tenant.clone(),
                dataflow: name.clone(),
                stats: flow.stats.clone(),
            })
            .collect()
    }
}
