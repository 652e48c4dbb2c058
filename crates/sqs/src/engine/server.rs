//! The network front of one queue engine: HTTP/1.1 with both protocols on
//! any path, `GET /health` for liveness and `GET /ready` for readiness
//! probes, and on the same port
//! the engine link its gateway speaks ([`crate::link`]). Started with a
//! token, it serves only requests that carry it (in [`ENGINE_TOKEN`], or
//! in the link's hello): the engine trusts whoever reaches it, so nothing
//! but the gateway may.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use sless_runtime::http::{self, Admission, Admitted, ConnectionLimits};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::Engine;
use crate::error::SqsError;
use crate::{ENGINE_TOKEN, link, protocol, request_id};

/// Largest request: a full 1 MiB batch, URL-encoded (up to three bytes a
/// byte) with the protocol's overhead.
const BODY_LIMIT: usize = 8 * 1024 * 1024;
/// Most requests one engine-link connection has in flight; more wait
/// unread.
const LINK_IN_FLIGHT: usize = 1024;
/// Time for a link's hello once its first byte came.
const LINK_HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a stopping engine's link waits for the gateway to close its
/// side after being told the link closes (one that knows no notice never does).
const LINK_CLOSING: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a stopping engine waits for the answers still owed (a long
/// poll takes up to 20 s).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(25);
/// Most connections from one client address: a gateway holds a link per
/// serving thread and, while it speaks HTTP to an engine, a connection per
/// request in flight; several gateways may share an address behind SNAT
/// or a sidecar. Far above that, and far below the descriptors' cap.
const PER_CLIENT: usize = 4096;

#[derive(Clone)]
struct Served {
    engine: Arc<Engine>,
    token: Option<Arc<str>>,
}

pub fn router(engine: Arc<Engine>, token: Option<String>) -> Router {
    app(Served {
        engine,
        token: token.map(Arc::from),
    })
}

fn app(served: Served) -> Router {
    Router::new()
        .fallback(handle)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(served)
}

/// Compares in time independent of where the texts differ.
pub(crate) fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

impl Served {
    /// Whether `given` is the token this engine serves (any, without one).
    fn admits(&self, given: &[u8]) -> bool {
        self.token
            .as_ref()
            .is_none_or(|expected| same_secret(given, expected.as_bytes()))
    }
}

fn refused(protocol: protocol::Protocol) -> Response {
    let e = SqsError::access_denied("Requests reach this queue engine through its gateway.");
    protocol::respond(protocol, "", Err(e.forbidden()), &request_id())
}

async fn handle(State(served): State<Served>, request: Request) -> Response {
    if request.method() == Method::GET && request.uri().query().is_none() {
        match request.uri().path() {
            "/health" => return "ok".into_response(),
            "/ready" => {
                return match served.engine.unready() {
                    None => "ok".into_response(),
                    Some(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
                };
            }
            _ => {}
        }
    }
    let (parts, body) = request.into_parts();
    if !served.admits(parts.headers.get(ENGINE_TOKEN).map_or(&[][..], |v| v.as_bytes())) {
        return refused(protocol::detect(&parts.headers));
    }
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            // AWS answers an oversized request as an invalid value.
            let e = SqsError::invalid_parameter_value(format!(
                "The request body is unreadable or longer than {BODY_LIMIT} bytes."
            ));
            return protocol::respond(protocol::detect(&parts.headers), "", Err(e), &request_id());
        }
    };
    answer(
        &served.engine,
        &parts.headers,
        parts.uri.path(),
        parts.uri.query(),
        &body,
    )
    .await
}

/// The engine's answer to an admitted request, whichever way it came.
async fn answer(engine: &Engine, headers: &HeaderMap, path: &str, query: Option<&str>, body: &Bytes) -> Response {
    let id = request_id();
    let mut decoded = match protocol::decode(headers, query, body) {
        Ok(d) => d,
        Err(e) => return protocol::respond(protocol::detect(headers), "", Err(e), &id),
    };
    if let Err(e) = queue_from_path(path, &engine.config().account_id, &mut decoded.input) {
        return protocol::respond(decoded.protocol, &decoded.action, Err(e), &id);
    }
    let result = engine.handle(&decoded.action, &decoded.input).await;
    let mut response = protocol::respond(decoded.protocol, &decoded.action, result, &id);
    if engine.follows() {
        response
            .headers_mut()
            .insert(link::FOLLOWER, HeaderValue::from_static("1"));
    }
    response
}

/// Serves the engine link (see [`crate::link`]) on a connection whose
/// first byte was NUL: each request in a task of its own, at most
/// [`LINK_IN_FLIGHT`] at once, every answer through one writer. A hello
/// without the engine's token is closed at once, before anything else is
/// allocated for it; a link idle for [`link::IDLE_TIMEOUT`] is closed too.
/// At `stop` it closes as [`link`] says: it tells the gateway, answers
/// what it reads from then on with [`link::closing`], and closes once the
/// gateway closed its side (or after [`LINK_CLOSING`]) and the requests in
/// flight are answered.
async fn serve_link(stream: TcpStream, served: Served, mut stop: watch::Receiver<bool>) {
    let (mut read, write) = stream.into_split();
    let hello = tokio::time::timeout(LINK_HELLO_TIMEOUT, link::read_hello_with(&mut read)).await;
    let Ok(Ok(Some(token))) = hello else {
        tracing::debug!("an engine-link hello was malformed or late");
        return;
    };
    if !served.admits(&token) {
        tracing::debug!("an engine-link hello without this engine's token; closed");
        let mut write = write;
        let denied = tokio::io::AsyncWriteExt::write_all(&mut write, link::DENIED);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), denied).await;
        return;
    }
    let (answers, mut to_write) = tokio::sync::mpsc::channel::<BytesMut>(LINK_IN_FLIGHT);
    let writer = tokio::spawn(async move { link::write_frames(write, &mut to_write, Some).await });
    if answers.send(BytesMut::from(link::HELLO)).await.is_err() {
        return;
    }
    let room = Arc::new(tokio::sync::Semaphore::new(LINK_IN_FLIGHT));
    let mut frames = link::FrameReader::new(read, link::MAX_REQUEST);
    let mut closing: Option<tokio::time::Instant> = None;
    let mut told = false;
    loop {
        if closing.is_some() && !told {
            told = true;
            if answers.send(link::closing(link::NOTICE_ID)).await.is_err() {
                break;
            }
        }
        let frame = tokio::select! {
            frame = tokio::time::timeout(link::IDLE_TIMEOUT, frames.next()) => match frame {
                Ok(frame) => frame,
                // Idle: closed unless an answer is still owed.
                Err(_) if room.available_permits() == LINK_IN_FLIGHT => break,
                Err(_) => continue,
            },
            _ = stop.wait_for(|s| *s), if closing.is_none() => {
                closing = Some(tokio::time::Instant::now() + LINK_CLOSING);
                continue;
            }
            () = tokio::time::sleep_until(closing.unwrap_or_else(tokio::time::Instant::now)), if closing.is_some() => break,
        };
        let request = match frame.and_then(|f| f.map(link::read_request).transpose()) {
            Ok(Some(request)) => request,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(error = %e, "engine link closed");
                break;
            }
        };
        if closing.is_some() {
            // Run nowhere yet: the gateway sends it again on a new link.
            if answers.send(link::closing(request.id)).await.is_err() {
                break;
            }
            continue;
        }
        let Ok(permit) = room.clone().acquire_owned().await else {
            break;
        };
        let (engine, answers) = (served.engine.clone(), answers.clone());
        tokio::spawn(async move {
            let response = answer(
                &engine,
                &request.headers,
                request.path(),
                request.query(),
                &request.body,
            )
            .await;
            let frame = match framed(request.id, response).await {
                Ok(frame) => Some(frame),
                Err(e) => {
                    tracing::error!(error = %e, "an answer too large for the engine link");
                    let e = SqsError::internal("The answer is too large to pass on.");
                    let protocol = protocol::detect(&request.headers);
                    framed(request.id, protocol::respond(protocol, "", Err(e), &request_id()))
                        .await
                        .ok()
                }
            };
            if let Some(frame) = frame {
                let _ = answers.send(frame).await;
            }
            drop(permit);
        });
    }
    drop(answers);
    if let Ok(Err(e)) = writer.await {
        tracing::debug!(error = %e, "engine link's answers not all written");
    }
}

/// A response as its link frame.
async fn framed(id: u32, response: Response) -> Result<BytesMut, link::FrameError> {
    let (parts, body) = response.into_parts();
    // The engine's answers are whole in memory already.
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
    link::answer_frame(id, parts.status, parts.headers.iter(), &body)
}

/// A request posted to a queue's URL (`/ACCOUNT/QUEUE`) names its queue by
/// the path, as query-era clients (boto 2, the Java SDK v1) do: without a
/// `QueueUrl` parameter the path's queue is the one meant; with one, both
/// must name the same queue. Another account's path names no queue here.
fn queue_from_path(path: &str, account: &str, input: &mut serde_json::Value) -> Result<(), SqsError> {
    let serde_json::Value::Object(params) = input else {
        return Ok(());
    };
    let queue_url = params
        .get("QueueUrl")
        .and_then(|v| v.as_str())
        .filter(|u| !u.is_empty());
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (path_account, queue) = match segments.as_slice() {
        [path_account, queue] if !queue.is_empty() => (path_account, queue),
        [_, .., path_account, queue] if *path_account == account && !queue.is_empty() && queue_url.is_none() => {
            return Err(appended_to_a_path(path, account, queue));
        }
        _ => return Ok(()),
    };
    if *path_account != account {
        return Err(SqsError::queue_does_not_exist("The specified queue does not exist."));
    }
    match queue_url {
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

/// A client that appends a queue's path to its endpoint's path (boto 2)
/// given the published endpoint, which has a path (`/sqs/{tenant}`), sends
/// the queue's path after it: say what to configure instead.
fn appended_to_a_path(path: &str, account: &str, queue: &str) -> SqsError {
    SqsError::missing_parameter(format!(
        "The request has no QueueUrl, and its path ({path} after the endpoint's) puts the queue's path \
         /{account}/{queue} after another: the client appended the queue's path to an endpoint that has a path \
         of its own. Configure the client with the endpoint's scheme, host and port alone (the access key names \
         the tenant), or send the QueueUrl parameter."
    ))
}

/// A running engine server, stopped when dropped.
pub struct EngineServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl EngineServer {
    /// Serves `engine` on `listen`; with `token`, only requests carrying it.
    pub async fn start(engine: Arc<Engine>, listen: SocketAddr, token: Option<String>) -> std::io::Result<Self> {
        // A process of its own: most of its descriptors may be connections.
        let total = http::descriptor_limit() / 4 * 3;
        Self::start_within(engine, listen, token, connections(total)).await
    }

    /// As [`Self::start`], within the connection caps of `admission`, which
    /// the other engines of the process share (`sless dev`).
    pub async fn start_within(
        engine: Arc<Engine>,
        listen: SocketAddr,
        token: Option<String>,
        admission: Arc<Admission>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = Served {
            engine,
            token: token.map(Arc::from),
        };
        let task = tokio::spawn(serve(listener, served, admission, stopped));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// Refuses new connections, closes the links as [`link`] says and
    /// waits (at most [`STOP_WAIT`]) for the requests in flight.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(STOP_WAIT, &mut self.task).await.is_err() {
            tracing::warn!("answers still owed when the engine stopped");
        }
    }
}

/// The caps on engines' connections, `total` of them at most: anyone may
/// connect (the token decides what they get), so they are capped in
/// number, per client address and in idle time as the gateway's are.
pub fn connections(total: usize) -> Arc<Admission> {
    Admission::new(
        ConnectionLimits {
            per_client: PER_CLIENT,
            ..ConnectionLimits::default()
        }
        .within(total),
    )
}

/// Accepts until `stopped`, then waits for the requests in flight.
async fn serve(
    listener: TcpListener,
    served: Served,
    admission: Arc<Admission>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let app = app(served.clone());
    let limits = admission.limits();
    let stopped = async {
        let _ = stopped.await;
    };
    http::serve_admitted(listener, admission, stopped, move |stream, admitted, stop| {
        serve_connection(stream, served.clone(), app.clone(), admitted, limits, stop)
    })
    .await;
}

/// Serves a connection in what its first byte shows it speaks: the
/// engine link, or HTTP/1.1.
async fn serve_connection(
    stream: TcpStream,
    served: Served,
    app: Router,
    admitted: Admitted,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    let peeked = tokio::select! {
        peeked = tokio::time::timeout(limits.header_timeout, stream.peek(&mut first)) => peeked,
        _ = stop.wait_for(|s| *s) => return,
    };
    match peeked {
        Ok(Ok(1)) if first[0] == 0 => serve_link(stream, served, stop).await,
        Ok(Ok(1)) => http::serve_connection(stream, app, admitted, limits, stop).await,
        _ => {}
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
        // The queue's path after another (boto 2 given the published
        // endpoint): what to configure, not a bare MissingParameter.
        let e = queue_from_path("/sqs/a/000000000042/jobs", "000000000042", &mut json!({})).unwrap_err();
        assert_eq!(e.code, "MissingParameter");
        assert!(e.message.contains("host and port alone"), "{e}");
        let mut named = json!({"QueueUrl": "http://gw/sqs/a/000000000042/jobs"});
        queue_from_path("/sqs/a/000000000042/jobs", "000000000042", &mut named).unwrap();
        // Paths that name no queue change nothing.
        for path in ["/", "", "/000000000042", "/000000000042/", "/a/b/c"] {
            let mut input = json!({});
            queue_from_path(path, "000000000042", &mut input).unwrap();
            assert_eq!(input, json!({}), "{path}");
        }
    }
}
