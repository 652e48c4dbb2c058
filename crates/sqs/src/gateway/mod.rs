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
use proxy::{GatewayState, InProcessEngines};
use table::SharedTable;
use worker::WorkerConfig;

/// A bound gateway, ready to run.
pub struct Gateway {
    pub addr: SocketAddr,
    listener: TcpListener,
    state: GatewayState,
    worker: WorkerConfig,
}

/// A connection accepted on the gateway's port, for a serving thread.
type Accepted = (std::net::TcpStream, SocketAddr);

/// The connections one serving thread is handed, as axum's listener.
struct Handed {
    rx: tokio::sync::mpsc::UnboundedReceiver<Accepted>,
    local: SocketAddr,
}

impl axum::serve::Listener for Handed {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some((stream, peer)) = self.rx.recv().await else {
                // The acceptor stopped: shutdown is under way.
                return std::future::pending().await;
            };
            match tokio::net::TcpStream::from_std(stream) {
                Ok(io) => {
                    // Answers are written whole: no reason to wait for an ACK.
                    let _ = io.set_nodelay(true);
                    return (io, peer);
                }
                Err(error) => tracing::warn!(%error, "cannot serve an accepted connection"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// Accepts connections and hands them to the serving threads in turn; a
/// thread that stopped (its runtime failed) leaves the rotation.
async fn accept_loop(listener: TcpListener, mut threads: Vec<tokio::sync::mpsc::UnboundedSender<Accepted>>) {
    let mut next = 0;
    while !threads.is_empty() {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, most likely: wait, as axum does.
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(mut stream) = stream.into_std() else { continue };
        while !threads.is_empty() {
            next %= threads.len();
            match threads[next].send((stream, peer)) {
                Ok(()) => {
                    next += 1;
                    break;
                }
                Err(tokio::sync::mpsc::error::SendError((back, _))) => {
                    tracing::error!("a gateway serving thread stopped; serving on the others");
                    threads.remove(next);
                    stream = back;
                }
            }
        }
    }
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
                http: proxy::backend_client(),
                engines: InProcessEngines::default(),
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

    /// The engines of this process (`sless dev`) it hands requests to
    /// directly, without an HTTP hop.
    pub fn with_in_process_engines(mut self, engines: InProcessEngines) -> Self {
        self.state.engines = engines;
        self
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
            let listener = Handed { rx, local: self.addr };
            let app = app.clone().with_state(GatewayState {
                http: proxy::backend_client(),
                ..self.state.clone()
            });
            let mut stop = stop_rx.clone();
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            std::thread::Builder::new()
                .name(format!("sless-gateway-{i}"))
                .spawn(move || {
                    let result = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .and_then(|runtime| {
                            runtime.block_on(
                                axum::serve(listener, app)
                                    .with_graceful_shutdown(async move {
                                        let _ = stop.wait_for(|s| *s).await;
                                    })
                                    .into_future(),
                            )
                        });
                    let _ = done_tx.send(result);
                })?;
            served.push(done_rx);
        }
        let acceptor = tokio::spawn(accept_loop(self.listener, handoff));
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
