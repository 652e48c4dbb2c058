//! An in-process control plane on a loopback socket, and its generated client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sless_controlplane::config::{ControlPlaneConfig, TlsMaterial};
use sless_controlplane::identity::IdentityPolicy;
use sless_controlplane::proto::worker_control_plane_client::WorkerControlPlaneClient;
use sless_controlplane::proto::{self, RoutingSnapshot, TenantRoute};
use sless_controlplane::publisher::{Debounce, SnapshotPublisher};
use sless_controlplane::server::ControlPlane;
use sless_controlplane::store::ControlStore;
use sless_controlplane::worker::ServiceConfig;
use tonic::transport::Channel;

pub type Client = WorkerControlPlaneClient<Channel>;

pub const FAST: Debounce = Debounce {
    quiet: Duration::from_millis(10),
    max_delay: Duration::from_millis(50),
};

pub fn config(tls: Option<(TlsMaterial, IdentityPolicy)>) -> ControlPlaneConfig {
    let (tls, identity) = match tls {
        Some((material, identity)) => (Some(material), identity),
        None => (None, IdentityPolicy::Loopback),
    };
    ControlPlaneConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        max_message_bytes: 4 * 1024 * 1024,
        service: ServiceConfig {
            heartbeat_interval: Duration::from_secs(1),
            session_ttl: Duration::from_secs(5),
            max_stale_age: Duration::from_secs(2),
            max_runtime_counters: 100,
            outcome_dedup_ttl: Duration::from_secs(60),
            ack_timeout: Duration::from_secs(3),
            full_snapshot_concurrency: 4,
            stream_poll_interval: Duration::from_millis(100),
        },
        identity,
        tls,
    }
}

/// A running control plane, stopped on drop.
pub struct Harness {
    pub addr: SocketAddr,
    pub publisher: SnapshotPublisher,
    pub epoch: u64,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Harness {
    pub async fn start(store: Arc<dyn ControlStore>, config: ControlPlaneConfig) -> Self {
        let cp = ControlPlane::start(config, store, FAST).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (addr, publisher, epoch) = (cp.local_addr, cp.publisher.clone(), cp.ownership_epoch);
        tokio::spawn(cp.serve(async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            publisher,
            epoch,
            stop: Some(stop),
        }
    }

    pub async fn client(&self) -> Client {
        WorkerControlPlaneClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    pub fn publish(&self, tenants: &[&str]) {
        self.publisher.publish(table(tenants));
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn table(tenants: &[&str]) -> RoutingSnapshot {
    RoutingSnapshot {
        routes: tenants
            .iter()
            .map(|t| TenantRoute {
                tenant: t.to_string(),
                backend_address: "127.0.0.1:9324".into(),
                keys: vec![proto::AccessKey {
                    access_key_id: format!("SQSAK{t}_abcdefgh"),
                    secret_access_key: "c2VjcmV0".into(),
                }],
                ..Default::default()
            })
            .collect(),
    }
}

pub fn register_request(worker: &str) -> proto::RegisterWorkerRequest {
    proto::RegisterWorkerRequest {
        supported_protocol_version: 1,
        worker_id: worker.into(),
        instance_id: "pod-1".into(),
        zone: "zone-a".into(),
        labels: vec![proto::Label {
            key: "role".into(),
            value: "gateway".into(),
        }],
    }
}

pub async fn register(client: &mut Client, worker: &str) -> proto::RegisterWorkerResponse {
    client
        .register_worker(register_request(worker))
        .await
        .unwrap()
        .into_inner()
}

pub fn ack_of(
    worker: &str,
    session: &str,
    d: &proto::SnapshotDelivery,
    applied: bool,
) -> proto::AcknowledgeSnapshotRequest {
    proto::AcknowledgeSnapshotRequest {
        worker_id: worker.into(),
        session_id: session.into(),
        snapshot: d.snapshot.clone(),
        applied,
        error_code: if applied { String::new() } else { "BAD_ROUTE".into() },
        error_message: if applied { String::new() } else { "cannot apply".into() },
        nonce: d.nonce.clone(),
    }
}

pub fn report(
    worker: &str,
    session: &str,
    seq: u64,
    d: &proto::SnapshotDelivery,
    requests: i64,
) -> proto::ReportRuntimeRequest {
    let snap = d.snapshot.as_ref().unwrap();
    proto::ReportRuntimeRequest {
        worker_id: worker.into(),
        session_id: session.into(),
        sequence: seq,
        snapshot_version: snap.version,
        ownership_epoch: snap.ownership_epoch,
        counters: if requests == 0 {
            vec![]
        } else {
            vec![proto::ProxyCounters {
                proxy_id: "tenant-a".into(),
                requests,
                errors: 0,
                in_flight: 0,
                bytes_in: 1,
                bytes_out: 2,
            }]
        },
    }
}

/// Opens `worker`'s snapshot stream for `session`.
pub async fn watch(client: &mut Client, worker: &str, session: &str) -> tonic::Streaming<proto::SnapshotDelivery> {
    client
        .watch_snapshots(proto::WatchSnapshotsRequest {
            worker_id: worker.into(),
            session_id: session.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Next message of a snapshot stream, within `within`.
pub async fn next(
    stream: &mut tonic::Streaming<proto::SnapshotDelivery>,
    within: Duration,
) -> Option<Result<proto::SnapshotDelivery, tonic::Status>> {
    tokio::time::timeout(within, stream.message())
        .await
        .ok()
        .and_then(|r| r.transpose())
}
