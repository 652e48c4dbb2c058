//! The SQS gateway: tenants' edge and control-plane worker.

pub mod counters;
pub mod proxy;
pub mod routes;
pub mod sigv4;
pub mod table;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

use counters::Counters;
use proxy::GatewayState;
use table::SharedTable;
use worker::WorkerConfig;

/// A bound gateway, ready to run.
pub struct Gateway {
    pub addr: SocketAddr,
    listener: TcpListener,
    state: GatewayState,
    worker: WorkerConfig,
}

impl Gateway {
    /// Binds `listen`; `public_url` (default `http://ADDR`) is what clients use.
    pub async fn bind(listen: SocketAddr, public_url: Option<String>, worker: WorkerConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        Ok(Self {
            addr,
            listener,
            state: GatewayState {
                table: SharedTable::default(),
                counters: Arc::new(Counters::default()),
                http,
                public_url: public_url.unwrap_or_else(|| format!("http://{addr}")),
                region: crate::DEFAULT_REGION.to_owned(),
            },
            worker,
        })
    }

    /// Accepts only signatures scoped to `region` (default [`crate::DEFAULT_REGION`]).
    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.state.region = region.into();
        self
    }

    pub fn public_url(&self) -> &str {
        &self.state.public_url
    }

    /// Serves requests and runs the worker until `shutdown` resolves.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let worker = {
            let mut rx = stop_rx.clone();
            tokio::spawn(worker::run(
                self.worker,
                self.state.table.clone(),
                self.state.counters.clone(),
                async move {
                    let _ = rx.wait_for(|s| *s).await;
                },
            ))
        };
        let table = self.state.table.clone();
        let app = Router::new()
            .route(
                "/healthz",
                get(move || {
                    let ready = table.current().snapshot.is_some();
                    async move {
                        if ready {
                            (axum::http::StatusCode::OK, "ok")
                        } else {
                            (axum::http::StatusCode::SERVICE_UNAVAILABLE, "no routing snapshot yet")
                        }
                    }
                }),
            )
            // Every other path is a tenant's: /sqs/{tenant}[/…], with or
            // without a trailing slash, or any path with the tenant named
            // by the access key.
            .fallback(proxy::handle)
            .with_state(self.state);
        let served = axum::serve(self.listener, app)
            .with_graceful_shutdown(async move {
                shutdown.await;
                let _ = stop_tx.send(true);
            })
            .await;
        let _ = worker.await;
        served
    }
}
