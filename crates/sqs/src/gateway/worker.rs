//! The gateway as a control-plane worker: register, watch snapshots, apply
//! and ACK (or NACK) them, heartbeat with runtime counters, and send outcome
//! batches. It reconnects and re-registers on any loss.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Status};

use super::counters::Counters;
use super::table::{RoutingTable, SharedTable};
use sless_controlplane::model::{SnapshotId, checksum};
use sless_controlplane::proto::worker_control_plane_client::WorkerControlPlaneClient;
use sless_controlplane::proto::{self, RoutingSnapshot};
use sless_runtime::backoff::Backoff;

const OUTCOME_FLUSH: Duration = Duration::from_secs(2);
/// Registering again after a lost session: 500 ms, doubling to 10 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));

/// The gateway's client certificate for mTLS to the control plane.
#[derive(Clone)]
pub enum ClientTls {
    /// Material made in this process (`sless dev`).
    Fixed(ClientTlsConfig),
    /// PEM files, read again at every connection: a certificate renewed on
    /// disk (by cert-manager) is used from the next connection on.
    Files {
        ca: PathBuf,
        cert: PathBuf,
        key: PathBuf,
        /// Server name to verify (default: the host of the address).
        domain: Option<String>,
    },
}

impl ClientTls {
    /// The TLS configuration as its files hold it now.
    pub async fn load(&self) -> Result<ClientTlsConfig, Status> {
        match self {
            Self::Fixed(config) => Ok(config.clone()),
            Self::Files { ca, cert, key, domain } => {
                let paths = [ca.clone(), cert.clone(), key.clone()];
                let [ca, cert, key] = tokio::task::spawn_blocking(move || {
                    paths.map(|p| std::fs::read(&p).map_err(|e| format!("cannot read {}: {e}", p.display())))
                })
                .await
                .map_err(|e| Status::internal(e.to_string()))?;
                let mut config = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca.map_err(Status::failed_precondition)?))
                    .identity(Identity::from_pem(
                        cert.map_err(Status::failed_precondition)?,
                        key.map_err(Status::failed_precondition)?,
                    ));
                if let Some(domain) = domain {
                    config = config.domain_name(domain.clone());
                }
                Ok(config)
            }
        }
    }
}

#[derive(Clone)]
pub struct WorkerConfig {
    /// `http://host:port`, or `https://…` with `tls`: one address (a
    /// Service), or each replica's, tried in turn; only the leader serves.
    pub control_planes: Vec<String>,
    pub worker_id: String,
    pub instance_id: String,
    pub tls: Option<ClientTls>,
}

type Client = WorkerControlPlaneClient<Channel>;

/// Runs until `shutdown` resolves.
pub async fn run(
    config: WorkerConfig,
    table: SharedTable,
    counters: Arc<Counters>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut retries = RETRY.start();
    for attempt in 0usize.. {
        let Some(address) = config.control_planes.get(attempt % config.control_planes.len().max(1)) else {
            tracing::error!("no control plane address; the routing table stays empty");
            return shutdown.await;
        };
        tokio::select! {
            () = &mut shutdown => return,
            result = session(&config, address, &table, &counters) => {
                match result {
                    Ok(()) => {
                        retries.succeeded();
                        tracing::info!("control plane session ended; registering again");
                    }
                    Err(e) => tracing::warn!(code = ?e.code(), message = e.message(), "control plane session lost; retrying"),
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(retries.failed()) => {}
        }
    }
}

async fn connect(config: &WorkerConfig, address: &str) -> Result<Client, Status> {
    let mut endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|e| Status::invalid_argument(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_keepalive(Some(Duration::from_secs(30)));
    if let Some(tls) = &config.tls {
        sless_runtime::tls::install_default_provider();
        endpoint = endpoint
            .tls_config(tls.load().await?)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    Ok(WorkerControlPlaneClient::new(channel))
}

/// The currently applied snapshot, for runtime reports.
#[derive(Default)]
struct Applied {
    snapshot: Option<SnapshotId>,
}

/// One session: lasts until an error ends it.
async fn session(
    config: &WorkerConfig,
    address: &str,
    table: &SharedTable,
    counters: &Arc<Counters>,
) -> Result<(), Status> {
    let mut client = connect(config, address).await?;
    let registration = client
        .register_worker(proto::RegisterWorkerRequest {
            supported_protocol_version: 1,
            worker_id: config.worker_id.clone(),
            instance_id: config.instance_id.clone(),
            zone: String::new(),
            labels: vec![proto::Label {
                key: "role".into(),
                value: "sqs-gateway".into(),
            }],
        })
        .await?
        .into_inner();
    let session_id = registration.session_id;
    let heartbeat = Duration::from_millis(u64::from(registration.heartbeat_interval_ms.max(100)));
    tracing::info!(worker_id = %config.worker_id, "registered with the control plane");
    let mut stream = client
        .watch_snapshots(proto::WatchSnapshotsRequest {
            worker_id: config.worker_id.clone(),
            session_id: session_id.clone(),
        })
        .await?
        .into_inner();
    let applied = Arc::new(tokio::sync::Mutex::new(Applied::default()));
    let mut heartbeat_timer = tokio::time::interval(heartbeat);
    let mut outcome_timer = tokio::time::interval(OUTCOME_FLUSH);
    let mut sequence = 0u64;
    let mut pending_batch: Option<proto::ReportOutcomesRequest> = None;
    loop {
        tokio::select! {
            message = stream.message() => {
                let Some(delivery) = message? else { return Ok(()) };
                apply(&mut client, config, &session_id, table, &applied, delivery).await?;
            }
            _ = heartbeat_timer.tick() => {
                let Some(snapshot) = applied.lock().await.snapshot else { continue };
                sequence += 1;
                let tenants = table.current().routes.keys().cloned().collect::<Vec<_>>();
                let response = client
                    .report_runtime(proto::ReportRuntimeRequest {
                        worker_id: config.worker_id.clone(),
                        session_id: session_id.clone(),
                        sequence,
                        snapshot_version: snapshot.version,
                        ownership_epoch: snapshot.ownership_epoch,
                        counters: counters.report(tenants.into_iter()),
                    })
                    .await;
                match response {
                    Ok(r) if r.get_ref().require_full_snapshot => {
                        tracing::info!("control plane asks for a full snapshot resync");
                        return Ok(());
                    }
                    Ok(_) => {}
                    // A sequence fenced by an earlier report: move past it.
                    Err(s) if matches!(s.code(), Code::Aborted | Code::AlreadyExists) => sequence += 1,
                    Err(s) => return Err(s),
                }
            }
            _ = outcome_timer.tick() => {
                if pending_batch.is_none() {
                    let outcomes = counters.take_outcomes();
                    if !outcomes.is_empty() {
                        pending_batch = Some(proto::ReportOutcomesRequest {
                            worker_id: config.worker_id.clone(),
                            session_id: session_id.clone(),
                            batch_id: sless_runtime::random::id(),
                            outcomes,
                        });
                    }
                }
                if let Some(batch) = &pending_batch {
                    // A retried batch keeps its id, so it is counted once.
                    client.report_outcomes(batch.clone()).await?;
                    pending_batch = None;
                }
            }
        }
    }
}

async fn apply(
    client: &mut Client,
    config: &WorkerConfig,
    session_id: &str,
    table: &SharedTable,
    applied: &tokio::sync::Mutex<Applied>,
    delivery: proto::SnapshotDelivery,
) -> Result<(), Status> {
    let snapshot_ref = delivery.snapshot.clone().unwrap_or_default();
    let decoded = (|| {
        let sum: [u8; 32] = snapshot_ref
            .checksum
            .as_slice()
            .try_into()
            .map_err(|_| "checksum is not 32 bytes".to_owned())?;
        if checksum(&delivery.payload) != sum {
            return Err("payload does not match its checksum".to_owned());
        }
        let snapshot = RoutingSnapshot::decode(&delivery.payload[..]).map_err(|e| e.to_string())?;
        let id = SnapshotId {
            version: snapshot_ref.version,
            ownership_epoch: snapshot_ref.ownership_epoch,
            checksum: sum,
        };
        Ok(RoutingTable::from_snapshot(id, snapshot))
    })();
    let (is_applied, error_code) = match decoded {
        Ok((new_table, left_out)) => {
            // The publisher leaves out the same routes: this is a defence.
            for route in &left_out {
                tracing::warn!(tenant = %route.tenant, reason = %route.reason, "route left out of the table");
            }
            let id = new_table.snapshot;
            let routes = new_table.routes.len();
            table.replace(new_table);
            applied.lock().await.snapshot = id;
            tracing::info!(version = snapshot_ref.version, routes, "routing snapshot applied");
            (true, String::new())
        }
        Err(reason) => {
            tracing::warn!(version = snapshot_ref.version, %reason, "routing snapshot rejected");
            (false, "INVALID_SNAPSHOT".to_owned())
        }
    };
    client
        .acknowledge_snapshot(proto::AcknowledgeSnapshotRequest {
            worker_id: config.worker_id.clone(),
            session_id: session_id.to_owned(),
            snapshot: Some(snapshot_ref),
            applied: is_applied,
            error_code,
            error_message: String::new(),
            nonce: delivery.nonce,
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renewed certificate files are used from the next connection on:
    /// every load reads the files as they are now.
    #[tokio::test]
    async fn certificate_files_are_read_at_every_connection() {
        let dir = sless_testkit::TempDir::new("client-tls");
        let ca = sless_testkit::tls::Ca::new("test CA");
        let (cert, key) = ca.issue(&[], &["spiffe://sless.test/ci/worker/gw-1"]);
        let path = |name: &str| dir.0.join(name);
        std::fs::write(path("ca.pem"), &ca.pem).unwrap();
        std::fs::write(path("cert.pem"), &cert).unwrap();
        std::fs::write(path("key.pem"), &key).unwrap();
        let tls = ClientTls::Files {
            ca: path("ca.pem"),
            cert: path("cert.pem"),
            key: path("key.pem"),
            domain: Some("localhost".into()),
        };
        assert!(tls.load().await.is_ok());
        std::fs::remove_file(path("key.pem")).unwrap();
        let e = tls.load().await.unwrap_err();
        assert!(e.message().contains("key.pem"), "{}", e.message());
        let (_, renewed) = ca.issue(&[], &["spiffe://sless.test/ci/worker/gw-1"]);
        std::fs::write(path("key.pem"), renewed).unwrap();
        assert!(tls.load().await.is_ok());
    }
}
