//! The local platform of `sless dev`: desired state in the embedded store,
//! realised on this machine by a reconcile loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, Notify};

use super::{Platform, PlatformError, Result, credentials, routing};
use crate::controlplane::publisher::SnapshotPublisher;
use crate::model::Phase;
use crate::model::dataflow::{DataFlowSpec, DataFlowStatus, DataFlowView};
use crate::model::name::DnsLabel;
use crate::model::queue_service::{Credentials, QueueServiceSpec, QueueServiceStatus, QueueServiceView};
use crate::store::{Record, Store, StoreError};

const QUEUE_SERVICE: &str = "queue-service";
const DATAFLOW: &str = "dataflow";

/// How often the reconcile loop re-checks everything without being woken.
const RESYNC: Duration = Duration::from_secs(5);

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

pub struct LocalPlatform {
    store: Store,
    /// Receives the gateway routing table after every reconcile pass.
    routes: SnapshotPublisher,
    wake: Arc<Notify>,
    /// Serialises queue-service creation: one per tenant is checked, then inserted.
    create_lock: Mutex<()>,
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

fn dataflow_view(r: DataFlowRecord) -> DataFlowView {
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
    }
}

impl LocalPlatform {
    pub fn new(store: Store, routes: SnapshotPublisher) -> Arc<Self> {
        Arc::new(Self {
            store,
            routes,
            wake: Arc::new(Notify::new()),
            create_lock: Mutex::new(()),
        })
    }

    /// Runs the reconcile loop until `shutdown` resolves.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            if let Err(e) = self.reconcile_all().await {
                tracing::warn!(error = %e, "reconcile pass failed; retrying");
            }
            tokio::select! {
                () = &mut shutdown => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(RESYNC) => {}
            }
        }
    }

    async fn reconcile_all(&self) -> Result<(), StoreError> {
        let queues: Vec<QueueRecord> = self.store.list(QUEUE_SERVICE, None).await?;
        self.routes
            .publish(routing::snapshot(queues.iter().map(|q| routing::Route {
                tenant: &q.tenant,
                backend_address: None,
                credentials: &q.status.credentials,
            })));
        for q in queues {
            self.reconcile_queue_service(q).await?;
        }
        let flows: Vec<DataFlowRecord> = self.store.list(DATAFLOW, None).await?;
        for f in flows {
            self.reconcile_dataflow(f).await?;
        }
        Ok(())
    }

    async fn reconcile_queue_service(&self, q: QueueRecord) -> Result<(), StoreError> {
        // This build has no queue engine yet, so nothing can become Ready: the
        // service stays Provisioning and says why, rather than claim an
        // endpoint that does not answer.
        let desired = QueueServiceStatus {
            phase: Phase::Provisioning,
            message: Some("waiting for a queue engine: this build of sless dev has no SQS data plane".into()),
            endpoint: None,
            ready_at: None,
        };
        if q.status.status != desired {
            let state = QueueState {
                status: desired,
                credentials: q.status.credentials,
            };
            self.store
                .update_status(QUEUE_SERVICE, &q.tenant, &q.name, q.generation, &state)
                .await?;
            tracing::info!(tenant = %q.tenant, name = %q.name, phase = ?state.status.phase, "queue service reconciled");
        }
        Ok(())
    }

    async fn reconcile_dataflow(&self, f: DataFlowRecord) -> Result<(), StoreError> {
        let desired = DataFlowStatus {
            phase: Phase::Provisioning,
            message: Some("waiting for a processor: this build of sless dev has no dataflow runtime".into()),
        };
        if f.status != desired {
            self.store
                .update_status(DATAFLOW, &f.tenant, &f.name, f.generation, &desired)
                .await?;
            tracing::info!(tenant = %f.tenant, name = %f.name, phase = ?desired.phase, "dataflow reconciled");
        }
        Ok(())
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
            if other.name == name.as_str() {
                return Err(PlatformError::AlreadyExists);
            }
            return Err(PlatformError::Conflict(format!(
                "tenant {tenant} already has queue service {:?}: a tenant has one queue service, \
                 served at /sqs/{tenant}; it holds any number of queues",
                other.name
            )));
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
        Ok(dataflow_view(record))
    }

    async fn get_dataflow(&self, tenant: &DnsLabel, name: &DnsLabel) -> Result<DataFlowView> {
        self.dataflow(tenant, name).await.map(dataflow_view)
    }

    async fn list_dataflows(&self, tenant: &DnsLabel) -> Result<Vec<DataFlowView>> {
        let records: Vec<DataFlowRecord> = self.store.list(DATAFLOW, Some(tenant.as_str())).await?;
        Ok(records.into_iter().map(dataflow_view).collect())
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
        if !self.store.delete(DATAFLOW, tenant.as_str(), name.as_str()).await? {
            return Err(PlatformError::NotFound);
        }
        self.wake.notify_one();
        Ok(())
    }

    async fn ready(&self) -> Result<()> {
        Ok(self.store.ping().await?)
    }
}
