//! Runs the gRPC listener: TLS, message limits, keepalive and a bounded
//! graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::config::ControlPlaneConfig;
use super::grpc::GrpcControlPlane;
use super::proto::worker_control_plane_server::WorkerControlPlaneServer;
use super::publisher::{self, Debounce, SnapshotPublisher};
use super::store::{ControlStore, StoreError};
use super::worker::Service;

/// How long in-flight calls may take to finish after shutdown starts.
const GRACE: Duration = Duration::from_secs(5);
/// Concurrent HTTP/2 streams per connection.
const MAX_CONCURRENT_STREAMS: u32 = 256;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("invalid TLS material: {0}")]
    Tls(tonic::transport::Error),
    #[error("control plane server failed: {0}")]
    Serve(tonic::transport::Error),
    #[error("cannot take ownership of the control plane state: {0}")]
    Ownership(StoreError),
}

/// A control plane ready to serve: it owns the state (newest epoch), its
/// publisher runs and its port is bound.
pub struct ControlPlane {
    pub service: Arc<Service>,
    pub publisher: SnapshotPublisher,
    pub ownership_epoch: u64,
    pub local_addr: std::net::SocketAddr,
    listener: TcpListener,
    config: ControlPlaneConfig,
}

impl ControlPlane {
    pub async fn start(
        config: ControlPlaneConfig,
        store: Arc<dyn ControlStore>,
        debounce: Debounce,
    ) -> Result<Self, ServerError> {
        let ownership_epoch = store.claim_ownership().await.map_err(ServerError::Ownership)?;
        let (publisher, snapshots) = publisher::spawn(store.clone(), ownership_epoch, debounce);
        let service = Service::new(store, config.service.clone(), snapshots);
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.listen,
            source,
        })?;
        Ok(Self {
            service,
            publisher,
            ownership_epoch,
            local_addr,
            listener,
            config,
        })
    }

    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()> + Send) -> Result<(), ServerError> {
        tracing::info!(addr = %self.local_addr, epoch = self.ownership_epoch, tls = self.config.tls.is_some(),
            "worker control plane listening");
        serve(self.listener, &self.config, self.service, shutdown).await
    }
}

/// Serves until `shutdown` resolves; then ends the watch streams, lets
/// in-flight calls finish for up to [`GRACE`] and drops the rest.
async fn serve(
    listener: TcpListener,
    config: &ControlPlaneConfig,
    service: Arc<Service>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServerError> {
    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(Some(MAX_CONCURRENT_STREAMS));
    if let Some(tls) = &config.tls {
        sless_runtime::tls::install_default_provider();
        builder = builder
            .tls_config(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(&tls.cert, &tls.key))
                    .client_ca_root(Certificate::from_pem(&tls.client_ca)),
            )
            .map_err(ServerError::Tls)?;
    }
    let grpc = WorkerControlPlaneServer::new(GrpcControlPlane::new(service.clone(), config.identity.clone()))
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes);
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let server = builder
        .add_service(grpc)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            shutdown.await;
            service.shut_down();
            let _ = stopping_tx.send(());
        });
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return result.map_err(ServerError::Serve),
        _ = stopping_rx => {}
    }
    match tokio::time::timeout(GRACE, server).await {
        Ok(result) => result.map_err(ServerError::Serve),
        Err(_) => {
            tracing::warn!("control plane calls still running after the grace period; dropping them");
            Ok(())
        }
    }
}
