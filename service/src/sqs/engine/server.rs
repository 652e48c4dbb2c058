//! The HTTP front of one queue engine: both protocols on any path, and
//! `GET /health` for readiness probes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use super::Engine;
use crate::sqs::protocol;

/// Largest request: a full 256 KiB batch, base64 and protocol overhead included.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

pub fn router(engine: Arc<Engine>) -> Router {
    Router::new()
        .fallback(handle)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(engine)
}

pub fn request_id() -> String {
    crate::controlplane::model::hex(&crate::random::bytes::<16>())
}

async fn handle(State(engine): State<Arc<Engine>>, request: Request) -> Response {
    if request.method() == Method::GET && request.uri().path() == "/health" && request.uri().query().is_none() {
        return "ok".into_response();
    }
    let (parts, body) = request.into_parts();
    let id = request_id();
    let protocol = protocol::detect(&parts.headers);
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            let e = super::error::SqsError::malformed_request("The request body is too large or unreadable.");
            return protocol::respond(protocol, "", Err(e), &id);
        }
    };
    let decoded = match protocol::decode(&parts.headers, parts.uri.query(), &body) {
        Ok(d) => d,
        Err(e) => return protocol::respond(protocol, "", Err(e), &id),
    };
    let result = engine.handle(&decoded.action, &decoded.input).await;
    protocol::respond(decoded.protocol, &decoded.action, result, &id)
}

/// A running engine server, stopped when dropped.
pub struct EngineServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl EngineServer {
    pub async fn start(engine: Arc<Engine>, listen: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let served = axum::serve(listener, router(engine)).with_graceful_shutdown(async {
                let _ = stopped.await;
            });
            if let Err(e) = served.await {
                tracing::error!(error = %e, "queue engine server failed");
            }
        });
        Ok(Self { addr, stop: Some(stop) })
    }
}

impl Drop for EngineServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
