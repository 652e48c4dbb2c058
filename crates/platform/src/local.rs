//! The local platform of `sless dev`: desired state in the embedded store,
//! realised on this machine by a reconcile loop.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

use super::{Platform, PlatformError, Result, routing};
use sless_controlplane::proto::RoutingSnapshot;
use sless_controlplane::publisher::{PublishedSnapshot, SnapshotPublisher};
use sless_controlplane::store::ControlStore;
use sless_dataflow::checkpoint::CheckpointStore;
use sless_sqs::credentials;

use crate::checkpoint::EmbeddedCheckpoint;
use crate::store::{Record, Store, StoreError};
use sless_dataflow::egress::EgressPolicy;
use sless_model::Phase;
use sless_model::dataflow::{DataFlowSpec, DataFlowStatus, DataFlowView};
use sless_model::name::DnsLabel;
use sless_model::queue_service::{Credentials, QueueServiceSpec, QueueServiceStatus, QueueServiceView};
use sless_sqs::engine::server::EngineServer;
use sless_sqs::engine::{Engine, EngineConfig};

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
}

/// A tenant's running queue engine and the token it takes from the gateway.
struct RunningEngine {
    server: EngineServer,
    token: String,
}

/// A dataflow's processor task, and what it last reported.
struct RunningFlow {
    generation: i64,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    status: Arc<std::sync::Mutex<DataFlowStatus>>,
    stats: Arc<sless_dataflow::pipeline::Stats>,
}

/// How long a stopping processor may take to write and commit the batch in
/// hand before it is aborted (which loses nothing: the batch is read again).
const FLOW_STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl RunningFlow {
    /// Waits until the stopped processor has committed what it wrote, so
    /// that no later commit of it can overwrite a newer position.
    async fn finished(mut self) {
        self.stop.send_replace(true);
        if tokio::time::timeout(FLOW_STOP_TIMEOUT, &mut self.task).await.is_err() {
            tracing::warn!("dataflow processor did not stop in time; aborting it");
            self.task.abort();
            let _ = self.task.await;
        }
    }

    /// [`Self::finished`] for several: all are signalled first, so they
    /// finish their batches side by side.
    async fn all_finished(flows: Vec<RunningFlow>) {
        for flow in &flows {
            flow.stop.send_replace(true);
        }
        for flow in flows {
            flow.finished().await;
        }
    }
}

/// A dataflow's pipeline id: its checkpoint key and default consumer group.
fn flow_id(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

pub struct LocalPlatform {
    store: Store,
    /// Queue journals live in `{data_dir}/queues/{tenant}.db`; kept on delete.
    data_dir: PathBuf,
    gateway: GatewayLink,
    engines: Mutex<HashMap<String, RunningEngine>>,
    /// Processors by (tenant, name).
    flows: std::sync::Mutex<HashMap<(String, String), RunningFlow>>,
    /// Held while processors are started or stopped, so that a delete or a
    /// shutdown never races a reconcile pass starting the same dataflow.
    flow_lifecycle: Mutex<()>,
    /// Tenant → (backend, first snapshot version that routes it there).
    route_versions: std::sync::Mutex<HashMap<String, (String, u64)>>,
    http: reqwest::Client,
    wake: Arc<Notify>,
    /// Serialises queue-service creation: one per tenant is checked, then inserted.
    create_lock: Mutex<()>,
    /// Where dataflows may connect.
    egress: Arc<EgressPolicy>,
}

pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

fn queue_view(r: QueueRecord) -> QueueServiceView {
    QueueServiceView {
        name: r.name,
        tenant_id: r.tenant,
        memory_mb: r.spec.memory_mb,
        storage_mb: r.spec.storage_mb,
        persistence: r.spec.persistence,
        phase: r.status.status.phase,
        endpoint: r.status.status.endpoint,
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
        phase: r.status.phase,
        message: r.status.message,
        created_at: r.created_at,
        counters,
    }
}

impl LocalPlatform {
    pub fn new(store: Store, data_dir: PathBuf, gateway: GatewayLink, egress: Arc<EgressPolicy>) -> Arc<Self> {
        Arc::new(Self {
            store,
            data_dir,
            gateway,
            egress,
            engines: Mutex::default(),
            flows: std::sync::Mutex::default(),
            flow_lifecycle: Mutex::default(),
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
        let flows: Vec<RunningFlow> = self
            .flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, flow)| flow)
            .collect();
        RunningFlow::all_finished(flows).await;
    }

    /// One pass over everything; returns whether something is not Ready yet.
    async fn reconcile_all(&self) -> Result<bool, StoreError> {
        let queues: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, None).await?;
        let backends = self.ensure_engines(&queues).await;
        self.gateway.publisher.publish(routing::snapshot(queues.iter().map(|q| {
            let backend = backends.get(&q.tenant).and_then(|b| b.as_ref().ok());
            routing::Route {
                tenant: &q.tenant,
                backend_address: backend.map(|(address, _)| address.as_str()),
                backend_token: backend.map(|(_, token)| token.as_str()),
                credentials: &q.status.credentials,
            }
        })));
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
            let backend = backends
                .get(&q.tenant)
                .cloned()
                .unwrap_or_else(|| Err("queue engine not started".into()))
                .map(|(address, _)| address);
            pending |= self.reconcile_queue_service(q, backend, acked).await? != Phase::Ready;
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
    async fn ensure_engines(&self, queues: &[QueueRecord]) -> HashMap<String, Result<(String, String), String>> {
        let mut engines = self.engines.lock().await;
        engines.retain(|tenant, _| queues.iter().any(|q| &q.tenant == tenant));
        let mut backends = HashMap::new();
        for q in queues {
            if !engines.contains_key(&q.tenant) {
                match self.start_engine(q).await {
                    Ok(running) => {
                        tracing::info!(tenant = %q.tenant, addr = %running.server.addr, "queue engine started");
                        engines.insert(q.tenant.clone(), running);
                    }
                    Err(message) => {
                        backends.insert(q.tenant.clone(), Err(message));
                        continue;
                    }
                }
            }
            if let Some(running) = engines.get(&q.tenant) {
                backends.insert(
                    q.tenant.clone(),
                    Ok((running.server.addr.to_string(), running.token.clone())),
                );
            }
        }
        backends
    }

    async fn start_engine(&self, q: &QueueRecord) -> Result<RunningEngine, String> {
        let journal = q
            .spec
            .persistence
            .then(|| self.data_dir.join("queues").join(format!("{}.db", q.tenant)));
        let config = EngineConfig {
            account_id: q.tenant.clone(),
            region: sless_sqs::DEFAULT_REGION.into(),
            base_url: self.endpoint(&q.tenant),
        };
        // Replaying a journal reads the disk: off the async runtime.
        let engine = tokio::task::spawn_blocking(move || Engine::open(config, journal.as_deref()))
            .await
            .map_err(|e| format!("cannot open the message store: {e}"))?
            .map_err(|e| format!("cannot open the message store: {}", e.message))?;
        // Only the gateway, which learns it from the routing snapshot, can
        // reach the engine's loopback port.
        let token = sless_runtime::random::id();
        let server = EngineServer::start(
            engine,
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            Some(token.clone()),
        )
        .await
        .map_err(|e| format!("cannot start the queue engine: {e}"))?;
        Ok(RunningEngine { server, token })
    }

    fn endpoint(&self, tenant: &str) -> String {
        format!("{}/sqs/{tenant}", self.gateway.public_url.trim_end_matches('/'))
    }

    /// Records, per tenant, the first published version that routes it to
    /// its current backend.
    fn learn_route_versions(&self) {
        let Some(published) = self.gateway.published.borrow().clone() else {
            return;
        };
        let Ok(table) = <RoutingSnapshot as prost::Message>::decode(&published.payload[..]) else {
            return;
        };
        let mut versions = self.route_versions.lock().unwrap_or_else(|p| p.into_inner());
        versions.retain(|tenant, _| table.routes.iter().any(|r| &r.tenant == tenant));
        for route in table.routes.iter().filter(|r| !r.backend_address.is_empty()) {
            let current = versions.get(&route.tenant);
            if current.is_none_or(|(backend, _)| *backend != route.backend_address) {
                versions.insert(
                    route.tenant.clone(),
                    (route.backend_address.clone(), published.id.version),
                );
            }
        }
    }

    async fn healthy(&self, backend: &str) -> bool {
        let url = format!("http://{backend}/health");
        matches!(self.http.get(url).send().await, Ok(r) if r.status().is_success())
    }

    /// Seed 000's phases: Ready once the engine answers and the gateway has
    /// applied a snapshot that routes to it; Failed while it does not
    /// answer; back to Ready when it recovers.
    async fn reconcile_queue_service(
        &self,
        q: QueueRecord,
        backend: Result<String, String>,
        acked: u64,
    ) -> Result<Phase, StoreError> {
        let previous = &q.status.status;
        let desired = match backend {
            Err(message) => QueueServiceStatus {
                phase: Phase::Failed,
                message: Some(message),
                endpoint: None,
                ready_at: previous.ready_at.clone(),
            },
            Ok(backend) if !self.healthy(&backend).await => QueueServiceStatus {
                phase: Phase::Failed,
                message: Some("the queue engine does not answer its health check".into()),
                endpoint: previous.endpoint.clone(),
                ready_at: previous.ready_at.clone(),
            },
            Ok(backend) => {
                let routed = self
                    .route_versions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&q.tenant)
                    .filter(|(b, _)| *b == backend)
                    .map(|(_, version)| *version);
                match routed {
                    Some(version) if acked >= version => QueueServiceStatus {
                        phase: Phase::Ready,
                        message: None,
                        endpoint: Some(self.endpoint(&q.tenant)),
                        ready_at: previous.ready_at.clone().or_else(|| Some(now_rfc3339())),
                    },
                    _ => QueueServiceStatus {
                        phase: Phase::Provisioning,
                        message: Some("queue engine running; waiting for the gateway to apply its route".into()),
                        endpoint: None,
                        ready_at: previous.ready_at.clone(),
                    },
                }
            }
        };
        let phase = desired.phase;
        if *previous != desired {
            let state = QueueState {
                status: desired,
                credentials: q.status.credentials,
            };
            self.store
                .update_status(QUEUE_SERVICE, &q.tenant, &q.name, q.generation, &state)
                .await?;
            tracing::info!(tenant = %q.tenant, name = %q.name, ?phase, "queue service reconciled");
        }
        Ok(phase)
    }

    async fn stop_deleted_flows(&self, flows: &[DataFlowRecord]) {
        let deleted: Vec<RunningFlow> = self
            .flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extract_if(|(tenant, name), _| !flows.iter().any(|f| &f.tenant == tenant && &f.name == name))
            .map(|(_, flow)| flow)
            .collect();
        RunningFlow::all_finished(deleted).await;
    }

    /// Runs each dataflow's processor as a task (restarted when its spec
    /// changes) and reports the task's state as the dataflow's status.
    async fn reconcile_dataflow(&self, f: DataFlowRecord) -> Result<(), StoreError> {
        let key = (f.tenant.clone(), f.name.clone());
        let (current, replaced) = {
            let mut running = self.flows.lock().unwrap_or_else(|p| p.into_inner());
            match running.get(&key) {
                Some(r) if r.generation == f.generation => (Some(r.status.clone()), None),
                _ => (None, running.remove(&key)),
            }
        };
        let status = match current {
            Some(status) => status,
            None => {
                // The old processor commits its last batch before the new
                // one reads the position.
                if let Some(old) = replaced {
                    old.finished().await;
                }
                let flow = self.start_flow(&f);
                let status = flow.status.clone();
                self.flows.lock().unwrap_or_else(|p| p.into_inner()).insert(key, flow);
                status
            }
        };
        let desired = status.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if f.status != desired {
            self.store
                .update_status(DATAFLOW, &f.tenant, &f.name, f.generation, &desired)
                .await?;
            tracing::info!(tenant = %f.tenant, name = %f.name, phase = ?desired.phase, "dataflow reconciled");
        }
        Ok(())
    }

    fn start_flow(&self, f: &DataFlowRecord) -> RunningFlow {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let status = Arc::new(std::sync::Mutex::new(DataFlowStatus {
            phase: Phase::Provisioning,
            message: Some("connecting the source and sinks".into()),
        }));
        let id = flow_id(&f.tenant, &f.name);
        let ctx = sless_dataflow::context::PipelineContext {
            egress: self.egress.clone(),
            checkpoint: f
                .spec
                .checkpoint_persistence
                .then(|| Arc::new(EmbeddedCheckpoint::new(self.store.clone(), &id)) as Arc<dyn CheckpointStore>),
            id,
        };
        let stats = Arc::new(sless_dataflow::pipeline::Stats::default());
        let (spec, report, wake) = (f.spec.clone(), status.clone(), self.wake.clone());
        let task = tokio::spawn(sless_dataflow::supervisor::supervise(
            spec,
            ctx,
            stats.clone(),
            stopped,
            move |phase, message| {
                *report.lock().unwrap_or_else(|p| p.into_inner()) = DataFlowStatus {
                    phase,
                    message: Some(message),
                };
                wake.notify_one();
            },
        ));
        RunningFlow {
            generation: f.generation,
            stop,
            task,
            status,
            stats,
        }
    }

    /// The view of a dataflow, with its processor's live counters.
    fn flow_view(&self, r: DataFlowRecord) -> DataFlowView {
        let counters = self
            .flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(r.tenant.clone(), r.name.clone()))
            .map(|f| f.stats.snapshot());
        dataflow_view(r, counters)
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
        Ok(queue_view(record))
    }

    async fn get_queue_service(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<QueueServiceView> {
        self.queue(tenant, name).await.map(queue_view)
    }

    async fn list_queue_services(&self, tenant: &DnsLabel) -> Result<Vec<QueueServiceView>> {
        let records: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, Some(tenant.as_str())).await?;
        Ok(records.into_iter().map(queue_view).collect())
    }

    async fn update_queue_service(
        &self,
        tenant: &DnsLabel,
        name: &DnsLabel,
        spec: QueueServiceSpec,
    ) -> Result<QueueServiceView> {
        if !self
            .store
            .update_spec(QUEUE_SERVICE, tenant.as_str(), name.as_str(), &spec)
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

    async fn create_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel, spec: DataFlowSpec) -> Result<DataFlowView> {
        let record = DataFlowRecord {
            tenant: tenant.to_string(),
            name: name.to_string(),
            spec,
            status: DataFlowStatus {
                phase: Phase::Pending,
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

    async fn list_dataflows(&self, tenant: &DnsLabel) -> Result<Vec<DataFlowView>> {
        let records: Vec<DataFlowRecord> = self.store.list(DATAFLOW, Some(tenant.as_str())).await?;
        Ok(records.into_iter().map(|r| self.flow_view(r)).collect())
    }

    async fn update_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel, spec: DataFlowSpec) -> Result<DataFlowView> {
        if !self
            .store
            .update_spec(DATAFLOW, tenant.as_str(), name.as_str(), &spec)
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
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(tenant.to_string(), name.to_string()));
        if let Some(flow) = running {
            flow.finished().await;
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

    async fn ready(&self) -> Result<()> {
        Ok(self.store.ping().await?)
    }

    fn dataflow_samples(&self) -> Vec<sless_dataflow::metrics::FlowSample> {
        self.flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|((tenant, name), flow)| sless_dataflow::metrics::FlowSample {
                namespace: tenant.clone(),
                dataflow: name.clone(),
                stats: flow.stats.clone(),
            })
            .collect()
    }
}
