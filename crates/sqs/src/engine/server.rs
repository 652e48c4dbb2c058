//! The HTTP front of one queue engine: both protocols on any path, and
//! `GET /health` for readiness probes. Started with a token, it serves only
//! requests that carry it in [`ENGINE_TOKEN`] (its gateway's): the engine
//! trusts whoever reaches it, so nothing but the gateway may.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use super::Engine;
use crate::error::SqsError;
use crate::protocol;
use crate::{ENGINE_TOKEN, request_id};

/// Largest request: a full 1 MiB batch, URL-encoded (up to three bytes a
/// byte) with the protocol's overhead.
const BODY_LIMIT: usize = 8 * 1024 * 1024;

#[derive(Clone)]
struct Served {
    engine: Arc<Engine>,
    token: Option<Arc<str>>,
}

pub fn router(engine: Arc<Engine>, token: Option<String>) -> Router {
    Router::new()
        .fallback(handle)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(Served {
            engine,
            token: token.map(Arc::from),
        })
}

/// Compares in time independent of where the texts differ.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn handle(State(served): State<Served>, request: Request) -> Response {
    if request.method() == Method::GET && request.uri().path() == "/health" && request.uri().query().is_none() {
        return "ok".into_response();
    }
    let (parts, body) = request.into_parts();
    let id = request_id();
    let protocol = protocol::detect(&parts.headers);
    if let Some(expected) = &served.token {
        let given = parts.headers.get(ENGINE_TOKEN).map_or(&[][..], |v| v.as_bytes());
        if !same_secret(given, expected.as_bytes()) {
            let e = SqsError::access_denied("Requests reach this queue engine through its gateway.");
            return protocol::respond(protocol, "", Err(e.forbidden()), &id);
        }
    }
    let engine = served.engine;
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            // AWS answers an oversized request as an invalid value.
            let e = SqsError::invalid_parameter_value(format!(
                "The request body is unreadable or longer than {BODY_LIMIT} bytes."
            ));
            return protocol::respond(protocol, "", Err(e), &id);
        }
    };
    let mut decoded = match protocol::decode(&parts.headers, parts.uri.query(), &body) {
        Ok(d) => d,
        Err(e) => return protocol::respond(protocol, "", Err(e), &id),
    };
    if let Err(e) = queue_from_path(parts.uri.path(), &engine.config().account_id, &mut decoded.input) {
        return protocol::respond(decoded.protocol, &decoded.action, Err(e), &id);
    }
    let result = engine.handle(&decoded.action, &decoded.input).await;
    protocol::respond(decoded.protocol, &decoded.action, result, &id)
}

/// A request posted to a queue's URL (`/ACCOUNT/QUEUE`) names its queue by
/// the path, as query-era clients (boto 2, the Java SDK v1) do: without a
/// `QueueUrl` parameter the path's queue is the one meant; with one, both
/// must name the same queue. Another account's path names no queue here.
fn queue_from_path(path: &str, account: &str, input: &mut serde_json::Value) -> Result<(), SqsError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let [path_account, queue] = segments.as_slice() else {
        return Ok(());
    };
    if queue.is_empty() {
        return Ok(());
    }
    if *path_account != account {
        return Err(SqsError::queue_does_not_exist("The specified queue does not exist."));
    }
    let serde_json::Value::Object(params) = input else {
        return Ok(());
    };
    match params
        .get("QueueUrl")
        .and_then(|v| v.as_str())
        .filter(|u| !u.is_empty())
    {
        None => {
            params.insert("QueueUrl".into(), serde_json::Value::String(path.to_owned()));
            Ok(())
        }
        Some(url) if url.trim_end_matches('/').rsplit('/').next() == Some(*queue) => Ok(()),
        Some(_) => Err(SqsError::invalid_parameter_value(
            "The QueueUrl parameter names another queue than the request's path.",
        )),
    }
}

/// A running engine server, stopped when dropped.
pub struct EngineServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl EngineServer {
    /// Serves `engine` on `listen`; with `token`, only requests carrying it.
    pub async fn start(engine: Arc<Engine>, listen: SocketAddr, token: Option<String>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let served = axum::serve(listener, router(engine, token)).with_graceful_shutdown(async {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::queue_from_path;

    #[test]
    fn a_queue_is_named_by_the_path_when_the_parameter_is_absent() {
        let mut input = json!({"MessageBody": "hi"});
        queue_from_path("/000000000042/jobs", "000000000042", &mut input).unwrap();
        assert_eq!(input["QueueUrl"], "/000000000042/jobs");
        // Present and agreeing: kept as sent.
        let mut input = json!({"QueueUrl": "http://gw/sqs/a/000000000042/jobs"});
        queue_from_path("/000000000042/jobs/", "000000000042", &mut input).unwrap();
        assert_eq!(input["QueueUrl"], "http://gw/sqs/a/000000000042/jobs");
        // Disagreeing, or another account's path: refused.
        let mut input = json!({"QueueUrl": "http://gw/sqs/a/000000000042/other"});
        let e = queue_from_path("/000000000042/jobs", "000000000042", &mut input).unwrap_err();
        assert_eq!(e.code, "InvalidParameterValue");
        let e = queue_from_path("/999999999999/jobs", "000000000042", &mut json!({})).unwrap_err();
        assert_eq!(e.code, "AWS.SimpleQueueService.NonExistentQueue");
        // Paths that name no queue change nothing.
        for path in ["/", "", "/000000000042", "/000000000042/", "/a/b/c"] {
            let mut input = json!({});
            queue_from_path(path, "000000000042", &mut input).unwrap();
            assert_eq!(input, json!({}), "{path}");
        }
    }
}
