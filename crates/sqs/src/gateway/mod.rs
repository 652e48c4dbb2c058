//! The SQS gateway: tenants' edge and control-plane worker.

pub mod bodies;
pub mod counters;
pub mod limits;
pub mod link;
pub mod proxy;
pub mod routes;
pub mod table;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;

use bodies::{BODIES_IN_MEMORY, BodyBudget, TENANT_BODIES};
use counters::Counters;
use limits::{Limiter, TenantRates};
use proxy::{GatewayState, InProcessEngines};
use sless_runtime::http::{self, Admission, Admitted, ConnectionLimits};
use table::SharedTable;
use worker::WorkerConfig;

/// A bound gateway, ready to run.
pub struct Gateway {
    pub addr: SocketAddr,
    listener: TcpListener,
    state: GatewayState,
    worker: WorkerConfig,
    limits: ConnectionLimits,
}

/// A connection accepted on the gateway's port, for a serving thread.
type Accepted = (std::net::TcpStream, Admitted);

/// Accepts connections within the gateway's caps and hands them to the
/// serving threads in turn; a thread that stopped (its runtime failed)
/// leaves the rotation.
async fn accept_loop(
    listener: TcpListener,
    admission: Arc<Admission>,
    mut threads: Vec<tokio::sync::mpsc::UnboundedSender<Accepted>>,
) {
    let mut next = 0;
    while !threads.is_empty() {
        let (stream, _, admitted) = http::accept(&listener, &admission).await;
        let Ok(stream) = stream.into_std() else { continue };
        let mut accepted = (stream, admitted);
        while !threads.is_empty() {
            next %= threads.len();
            match threads[next].send(accepted) {
                Ok(()) => {
                    next += 1;
                    break;
                }
                Err(tokio::sync::mpsc::error::SendError(back)) => {
                    tracing::error!("a gateway serving thread stopped; serving on the others");
                    threads.remove(next);
                    accepted = back;
                }
            }
        }
    }
}

/// One serving thread's work: the connections it is handed, each served
/// on this thread until it ends; at `stop`, the requests in flight are
/// answered before it returns.
async fn serve_handed(
    mut handed: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    app: Router,
    limits: ConnectionLimits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = handed.recv() => {
                // None: the acceptor stopped, shutdown is under way.
                let Some((stream, admitted)) = accepted else { break };
                match tokio::net::TcpStream::from_std(stream) {
                    Ok(io) => {
                        connections.spawn(http::serve_connection(io, app.clone(), admitted, limits, stop.clone()));
                    }
                    Err(error) => tracing::warn!(%error, "cannot serve an accepted connection"),
                }
            }
            () = async { drop(stop.wait_for(|s| *s).await) } => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    while connections.join_next().await.is_some() {}
}

impl Gateway {
    /// Binds `listen`; `public_url` (default `http://ADDR`) is what clients use.
    pub async fn bind(listen: SocketAddr, public_url: Option<String>, worker: WorkerConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        Ok(Self {
            addr,
            listener,
            state: GatewayState {
                table: SharedTable::default(),
                counters: Arc::new(Counters::default()),
                links: link::Links::default(),
                leaders: proxy::Leaders::default(),
                http: proxy::backend_client(),
                engines: InProcessEngines::default(),
                public_url: public_url.unwrap_or_else(|| format!("http://{addr}")),
                bodies: Arc::new(BodyBudget::new(BODIES_IN_MEMORY, TENANT_BODIES)),
                limiter: Arc::new(Limiter::default()),
            },
            worker,
            limits: ConnectionLimits::default(),
        })
    }

    /// Serves within `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Keeps each tenant to `rates` (none by default).
    pub fn with_tenant_rates(mut self, rates: TenantRates) -> Self {
        self.state.limiter = Arc::new(Limiter::new(rates));
        self
    }

    /// The engines of this process (`sless dev`) it hands requests to
    /// directly, without an HTTP hop.
    pub fn with_in_process_engines(mut self, engines: InProcessEngines) -> Self {
        self.state.engines = engines;
        self
    }

    /// Its per-tenant counters, which [`metrics_router`] renders.
    pub fn counters(&self) -> Arc<Counters> {
        self.state.counters.clone()
    }

    pub fn public_url(&self) -> &str {
        &self.state.public_url
    }

    /// Serves requests and runs the worker until `shutdown` resolves.
    ///
    /// Requests are served thread per core, as nginx's workers serve them:
    /// each thread runs a single-threaded runtime with the connections it is
    /// handed and its own connections to the engines, so a request never
    /// changes thread between its client, the signature check and its
    /// engine. Only accepting (rare, with keep-alive) crosses threads.
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
            .fallback(proxy::handle);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (mut handoff, mut served) = (Vec::new(), Vec::new());
        for i in 0..threads {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            handoff.push(tx);
            let app = app.clone().with_state(GatewayState {
                links: link::Links::default(),
                http: proxy::backend_client(),
                ..self.state.clone()
            });
            let (limits, stop) = (self.limits, stop_rx.clone());
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name(format!("sless-gateway-{i}"))
                .spawn(move || {
                    let result = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map(|runtime| runtime.block_on(serve_handed(rx, app, limits, stop)));
                    let _ = done_tx.send(result);
                })?;
            served.push(done_rx);
        }
        let acceptor = tokio::spawn(accept_loop(self.listener, Admission::new(self.limits), handoff));
        shutdown.await;
        acceptor.abort();
        let _ = stop_tx.send(true);
        let mut result = Ok(());
        for done in served {
            if let Ok(Err(e)) = done.await {
                result = Err(e);
            }
        }
        let _ = worker.await;
        result
    }
}

/// `/metrics` of the gateway's per-tenant counters, for an internal port:
/// it names tenants, so it is never served to tenants' clients.
pub fn metrics_router(counters: Arc<Counters>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let text = counters.render();
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }
        }),
    )
}
