//! The tenants' edge: `/sqs/{tenant}/…`, or any other path with the tenant
//! named by the request's access key. Each request is authenticated with
//! SigV4 against the local routing table and proxied to the tenant's queue
//! engine. Nothing here calls the control plane or Redis.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::bodies::{BODY_LIMIT, BodyBudget, BodyError};
use super::counters::{self, Counters};
use super::limits::Limiter;
use super::link::{LinkError, Links, Way};
use super::table::{RoutingTable, SharedTable};
use crate::error::SqsError;
use crate::link::FrameError;
use crate::protocol::{self, Protocol};
use crate::sigv4::{self, AuthError};
use crate::{ENGINE_TOKEN, request_id};
use sless_controlplane::model::OutcomeKind;
use sless_runtime::sync::Unpoisoned;

/// Request headers passed on to the engine.
const FORWARDED: &[&str] = &[
    "content-type",
    "x-amz-target",
    "x-amz-date",
    "user-agent",
    "x-amzn-query-mode",
];
/// Response headers passed back to the client.
const RETURNED: &[&str] = &["content-type", "x-amzn-requestid", "x-amzn-query-error"];

/// Pooled HTTP/1.1 client to the engines.
pub type BackendClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, http_body_util::Full<Bytes>>;

/// A client for one serving thread: its connections' tasks run on the
/// thread that opened them.
pub fn backend_client() -> BackendClient {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build(connector)
}

/// The engines that run in the gateway's own process (`sless dev`), by
/// the backend address the routing table names: a request for one is
/// handed to its router in process, with no HTTP hop.
#[derive(Clone, Default)]
pub struct InProcessEngines(Arc<std::sync::RwLock<HashMap<String, axum::Router>>>);

impl InProcessEngines {
    pub fn insert(&self, backend: String, router: axum::Router) {
        self.0.lock_unpoisoned().insert(backend, router);
    }

    pub fn remove(&self, backend: &str) {
        self.0.lock_unpoisoned().remove(backend);
    }

    fn get(&self, backend: &str) -> Option<axum::Router> {
        self.0.read_unpoisoned().get(backend).cloned()
    }
}

#[derive(Clone)]
pub struct GatewayState {
    pub table: SharedTable,
    pub counters: Arc<Counters>,
    /// Engine links of this serving thread; `http` for engines without.
    pub links: Links,
    /// The replica of each replicated engine to ask first.
    pub leaders: Leaders,
    pub http: BackendClient,
    pub engines: InProcessEngines,
    /// Public base URL of the gateway, e.g. `http://127.0.0.1:9324`.
    pub public_url: String,
    /// Room for request bodies, shared by every serving thread.
    pub bodies: Arc<BodyBudget>,
    /// Each tenant's requests and bytes a second, shared likewise.
    pub limiter: Arc<Limiter>,
}

fn error(protocol: Protocol, e: SqsError) -> Response {
    protocol::respond(protocol, "", Err(e), &request_id())
}

fn auth_error(e: AuthError) -> SqsError {
    match e {
        AuthError::Missing => SqsError::missing_authentication_token(e.to_string()).forbidden(),
        AuthError::ContentSha256Mismatch => SqsError::content_sha256_mismatch(e.to_string()),
        AuthError::Malformed(_)
        | AuthError::Expired
        | AuthError::Mismatch
        | AuthError::WrongRegion(_)
        | AuthError::WrongService => SqsError::signature_does_not_match(e.to_string()).forbidden(),
    }
}

fn unknown_key() -> SqsError {
    SqsError::invalid_client_token_id("The security token included in the request is invalid.").forbidden()
}

/// What a client gets for a body not read. One that came too slowly or
/// broke off ends its connection: what is left of it is not read.
fn body_error(protocol: Protocol, e: BodyError) -> Response {
    let refused = match e {
        BodyError::Busy => SqsError::unavailable("The gateway is busy; retry."),
        BodyError::TooLong => too_long(),
        BodyError::TooSlow | BodyError::Broken => SqsError {
            status: 408,
            ..SqsError::invalid_parameter_value(format!("{e}."))
        },
    };
    let mut response = error(protocol, refused);
    if matches!(e, BodyError::TooSlow | BodyError::Broken) {
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// A declared body length over the limit, or not a number, is refused
/// before anything is read.
fn check_declared_length(headers: &HeaderMap) -> Result<(), SqsError> {
    let Some(value) = headers.get(axum::http::header::CONTENT_LENGTH) else {
        return Ok(());
    };
    match value.to_str().ok().and_then(|v| v.parse::<u64>().ok()) {
        Some(n) if n <= BODY_LIMIT as u64 => Ok(()),
        _ => Err(too_long()),
    }
}

fn too_long() -> SqsError {
    SqsError {
        status: 413,
        ..SqsError::invalid_parameter_value(format!("The request body is longer than {BODY_LIMIT} bytes."))
    }
}

/// The index of the request's action (see [`counters::action_index`]):
/// from `X-Amz-Target`, or the query protocol's `Action` in the query
/// string or the form body (empty until the body is read).
fn action_of(headers: &HeaderMap, query: Option<&str>, body: &[u8]) -> usize {
    if let Some(target) = headers.get("x-amz-target") {
        let action = target.to_str().ok().and_then(|t| t.strip_prefix("AmazonSQS."));
        return counters::action_index(action.unwrap_or_default());
    }
    let form = |text: &[u8]| {
        text.split(|b| *b == b'&')
            .find_map(|pair| pair.strip_prefix(b"Action="))
            .and_then(|a| std::str::from_utf8(a).ok())
            .map(counters::action_index)
    };
    query
        .and_then(|q| form(q.as_bytes()))
        .or_else(|| form(body))
        .unwrap_or_else(|| counters::action_index(""))
}

/// Serves one request: whose it is, its signature, the tenant's rate, its
/// engine, and the answer passed back.
pub async fn handle(State(state): State<GatewayState>, request: Request) -> Response {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let protocol = protocol::detect(&parts.headers);
    let table = state.table.current();
    let path = parts.uri.path().to_owned();
    let claimed = match claimed(&table, &parts.headers, &path) {
        Ok(claimed) => claimed,
        Err(e) => return error(protocol, e),
    };
    let tenant = claimed.tenant;
    let counters = state.counters.tenant(tenant);
    let outcome = |action, kind| counters.record(action, kind, started.elapsed());
    let (action, body) = match verified(&state, &parts, body, &claimed).await {
        Ok(verified) => verified,
        Err(Refused::Auth(action, e)) => {
            outcome(action, OutcomeKind::AuthFailed);
            return error(protocol, auth_error(e));
        }
        Err(Refused::Body(e)) => return body_error(protocol, e),
    };
    let route = table.routes.get(tenant);
    let own = route.map(|r| r.rates).unwrap_or_default();
    if let Err(held) = state.limiter.admit(tenant, own, body.len(), started) {
        counters.throttled.fetch_add(1, Ordering::Relaxed);
        outcome(action, OutcomeKind::ClientError);
        return error(protocol, SqsError::request_throttled(held.to_string()));
    }
    let Some(route) = route.filter(|r| !r.members.is_empty()) else {
        outcome(action, OutcomeKind::BackendError);
        return error(protocol, SqsError::unavailable("The queue service is not ready yet."));
    };
    counters.requests.fetch_add(1, Ordering::Relaxed);
    counters
        .bytes_in
        .fetch_add(i64::try_from(body.len()).unwrap_or(i64::MAX), Ordering::Relaxed);
    let target = engine_target(claimed.rest, parts.uri.query());
    let asked = Asked {
        token: route.token.as_ref(),
        target: &target,
        method: &parts.method,
        headers: &parts.headers,
        body,
    };
    counters.in_flight.fetch_add(1, Ordering::Relaxed);
    let result = ask_engine(&state, &route.members, read_only(protocol, action), &asked).await;
    counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    let (kind, response) = answer(protocol, tenant, result, &counters);
    outcome(action, kind);
    response
}

/// Whose a request says it is, before its body is read: the tenant (from
/// the `/sqs/{tenant}` prefix, or else its access key), the path's rest, and
/// the secret of its key.
struct Claimed<'a> {
    tenant: &'a str,
    rest: &'a str,
    auth: sigv4::Authorization,
    secret: &'a str,
}

fn claimed<'a>(table: &'a RoutingTable, headers: &HeaderMap, path: &'a str) -> Result<Claimed<'a>, SqsError> {
    check_declared_length(headers)?;
    let auth = sigv4::parse_authorization(headers).map_err(auth_error)?;
    let (tenant, rest) = match path.strip_prefix("/sqs/") {
        Some(after) => after.split_once('/').unwrap_or((after, "")),
        // Without the /sqs/{tenant} prefix (clients that cannot put a path
        // in their endpoint, such as kombu's broker URL) the access key
        // names the tenant; the signature proves the key later.
        None => match table.keys.get(&auth.access_key) {
            Some((key_tenant, _)) => (key_tenant.as_str(), path.trim_start_matches('/')),
            None => return Err(unknown_key()),
        },
    };
    // A key of another tenant is refused exactly like an unknown key.
    match table.keys.get(&auth.access_key) {
        Some((key_tenant, secret)) if key_tenant == tenant => Ok(Claimed {
            tenant,
            rest,
            auth,
            secret,
        }),
        _ => Err(unknown_key()),
    }
}

/// Why a claimed request goes no further.
enum Refused {
    /// Its signature, scope or time is wrong (the action, for counting).
    Auth(usize, AuthError),
    Body(BodyError),
}

/// The request's action and body once its signature is verified.
/// Everything but the signature is checked before the body is read: an
/// anonymous client cannot make the gateway hold a body.
async fn verified(
    state: &GatewayState,
    parts: &axum::http::request::Parts,
    body: Body,
    claimed: &Claimed<'_>,
) -> Result<(usize, Bytes), Refused> {
    let now = i64::try_from(crate::now_ms() / 1000).unwrap_or(i64::MAX);
    if let Err(e) = sigv4::check_scope_and_time(&parts.headers, &claimed.auth, now) {
        return Err(Refused::Auth(action_of(&parts.headers, parts.uri.query(), &[]), e));
    }
    let (body, _room) = state.bodies.read(claimed.tenant, body).await.map_err(Refused::Body)?;
    let action = action_of(&parts.headers, parts.uri.query(), &body);
    let signed = sigv4::Request {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
        body: &body,
    };
    match sigv4::verify(&signed, &claimed.auth, claimed.secret, now) {
        Ok(()) => Ok((action, body)),
        Err(e) => Err(Refused::Auth(action, e)),
    }
}

/// The engine's answer to `asked`, from the replicas in `members`, within
/// [`BACKEND_TIMEOUT`].
async fn ask_engine(
    state: &GatewayState,
    members: &[String],
    read_only: bool,
    asked: &Asked<'_>,
) -> Result<(StatusCode, Response, i64), ForwardError> {
    match tokio::time::timeout(BACKEND_TIMEOUT, across(state, members, read_only, asked)).await {
        Ok(Ok((status, headers, bytes))) => Ok(relay(status, &headers, bytes)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ForwardError::Timeout(BACKEND_TIMEOUT)),
    }
}

/// What the client gets for the engine's answer (or its absence), and how
/// the outcome counts.
fn answer(
    protocol: Protocol,
    tenant: &str,
    result: Result<(StatusCode, Response, i64), ForwardError>,
    counters: &counters::TenantCounters,
) -> (OutcomeKind, Response) {
    let (kind, response) = match result {
        Ok((status, response, len)) => {
            counters.bytes_out.fetch_add(len, Ordering::Relaxed);
            let kind = if status.is_success() {
                OutcomeKind::Ok
            } else if status.is_client_error() {
                OutcomeKind::ClientError
            } else {
                OutcomeKind::BackendError
            };
            (kind, response)
        }
        // A request too long for the link: the client's, not the engine's.
        Err(ForwardError::Frame(e)) => {
            let refused = match e {
                FrameError::FieldTooLong(what) => {
                    SqsError::invalid_parameter_value(format!("The request's {what} is too long."))
                }
                _ => too_long(),
            };
            (OutcomeKind::ClientError, error(protocol, refused))
        }
        Err(e) => {
            tracing::warn!(tenant, error = %e, "queue engine unreachable");
            let unavailable = SqsError::unavailable("The queue service is unavailable; retry.");
            (OutcomeKind::BackendError, error(protocol, unavailable))
        }
    };
    if kind != OutcomeKind::Ok {
        counters.errors.fetch_add(1, Ordering::Relaxed);
    }
    (kind, response)
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("bad backend request: {0}")]
    Request(#[from] axum::http::Error),
    #[error("backend unreachable: {0}")]
    Connect(#[from] hyper_util::client::legacy::Error),
    #[error("backend response broken: {0}")]
    Body(#[from] hyper::Error),
    #[error("backend did not answer within {0:?}")]
    Timeout(std::time::Duration),
    #[error("in-process engine's response broken: {0}")]
    InProcess(axum::Error),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("the request does not fit the engine link: {0}")]
    Frame(#[from] FrameError),
}

impl ForwardError {
    /// Whether the request certainly never reached the engine.
    fn nothing_sent(&self) -> bool {
        match self {
            ForwardError::Connect(e) => e.is_connect(),
            ForwardError::Link(e) => e.nothing_sent(),
            _ => false,
        }
    }
}

/// What the gateway asks a tenant's engine.
struct Asked<'a> {
    token: Option<&'a axum::http::HeaderValue>,
    target: &'a str,
    method: &'a axum::http::Method,
    headers: &'a HeaderMap,
    body: Bytes,
}

/// Whether the request's action changes nothing, so that one whose
/// answer was lost may be asked of another replica. Only a JSON request
/// says so for sure: the engine reads its one `X-Amz-Target` as the gateway
/// does, while a query request may name `Action` more than once.
fn read_only(protocol: Protocol, action: usize) -> bool {
    const READ_ONLY: [&str; 6] = [
        "GetQueueUrl",
        "ListQueues",
        "GetQueueAttributes",
        "ListQueueTags",
        "ListDeadLetterSourceQueues",
        "ListMessageMoveTasks",
    ];
    matches!(protocol, Protocol::Json)
        && protocol::ACTIONS
            .get(action)
            .is_some_and(|name| READ_ONLY.contains(name))
}

/// The replica of each replicated engine (by its route's members) that the
/// gateway asks first: the one that last answered as the leader, or the
/// one after a replica that answered as a follower. So the gateway learns
/// the leader from the replicas' answers (see
/// [`crate::link::FOLLOWER`]) within a request or two of a
/// failover, and each request reaches it without the follower's hop.
#[derive(Clone, Default)]
pub struct Leaders(Arc<std::sync::Mutex<HashMap<String, usize>>>);

impl Leaders {
    /// Where in `members` to start asking.
    fn first(&self, members: &[String]) -> usize {
        let Some(key) = members.first() else { return 0 };
        self.0.lock_unpoisoned().get(key).copied().unwrap_or(0) % members.len()
    }

    /// Takes in that the member at `answered` answered, as a follower or not.
    fn learn(&self, members: &[String], answered: usize, follower: bool) {
        let Some(key) = members.first() else { return };
        let first = if follower {
            (answered + 1) % members.len()
        } else {
            answered
        };
        let mut leaders = self.0.lock_unpoisoned();
        if leaders.get(key) != Some(&first) {
            leaders.insert(key.clone(), first);
        }
    }
}

/// Asks the replicas of a queue engine in turn (any replica serves; a
/// follower passes the request to its leader), the one [`Leaders`] names
/// first: one that cannot be reached, so was sent nothing, gives way to
/// the next, and so does one that broke off a read-only request; one
/// closing its link is asked again first. Any other failure is the answer: the request
/// may have been done, and the client's SDK decides whether to retry.
async fn across(
    state: &GatewayState,
    members: &[String],
    read_only: bool,
    asked: &Asked<'_>,
) -> Result<Exchanged, ForwardError> {
    let mut failed = None;
    let first = if members.len() > 1 {
        state.leaders.first(members)
    } else {
        0
    };
    for at in (0..members.len()).map(|i| (first + i) % members.len()) {
        let backend = &members[at];
        let mut answer = exchange(state, backend, asked).await;
        // An engine closing its link ran nothing: asked again on a new
        // link (behind a Service, another replica's).
        if matches!(answer, Err(ForwardError::Link(LinkError::Closing))) {
            answer = exchange(state, backend, asked).await;
        }
        match answer {
            Ok(answer) => {
                if members.len() > 1 {
                    let follower = answer.1.contains_key(crate::link::FOLLOWER);
                    state.leaders.learn(members, at, follower);
                }
                return Ok(answer);
            }
            Err(e) if e.nothing_sent() || (read_only && !matches!(e, ForwardError::Frame(_))) => {
                tracing::debug!(backend, error = %e, "a replica of the queue engine failed; trying the next");
                failed = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(failed.unwrap_or(ForwardError::Link(LinkError::Down)))
}

/// Asks the engine (replica) at `backend`: one of this process is called
/// by path; any other over its link, or over HTTP if it speaks no link.
async fn exchange(state: &GatewayState, backend: &str, asked: &Asked<'_>) -> Result<Exchanged, ForwardError> {
    let request = |origin| backend_request(origin, asked.token, asked.target, asked.method, asked.headers);
    if let Some(router) = state.engines.get(backend) {
        return in_process(router, request(None), asked.body.clone()).await;
    }
    match state.links.way(backend, asked.token).await? {
        Way::Link(link) => {
            let forwarded = FORWARDED
                .iter()
                .filter_map(|name| asked.headers.get(*name).map(|value| (*name, value)));
            let frame = crate::link::request_frame(asked.method, asked.target, forwarded, &asked.body)?;
            let answer = link.call(frame).await?;
            Ok((answer.status, answer.headers, answer.body))
        }
        Way::Http => forward(&state.http, request(Some(backend)), asked.body.clone()).await,
    }
}

/// Longer than the longest long poll (20 s).
const BACKEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the engine is asked for: the path after the tenant's prefix,
/// with the query.
fn engine_target(rest: &str, query: Option<&str>) -> String {
    let mut target = String::with_capacity(rest.len() + 2 + query.map_or(0, str::len));
    target.push('/');
    target.push_str(rest);
    if let Some(q) = query {
        target.push('?');
        target.push_str(q);
    }
    target
}

/// The HTTP request for the engine: `target` (at `http://{origin}` when
/// given), the headers the engine reads, and the engine's token.
fn backend_request(
    origin: Option<&str>,
    token: Option<&axum::http::HeaderValue>,
    target: &str,
    method: &axum::http::Method,
    headers: &HeaderMap,
) -> axum::http::request::Builder {
    let uri = match origin {
        Some(origin) => format!("http://{origin}{target}"),
        None => target.to_owned(),
    };
    let mut request = axum::http::Request::builder().method(method.clone()).uri(uri);
    for name in FORWARDED {
        if let Some(v) = headers.get(*name) {
            request = request.header(*name, v);
        }
    }
    if let Some(token) = token {
        request = request.header(ENGINE_TOKEN, token);
    }
    request
}

/// The engine's answer as the client gets it: its status, body and the
/// headers clients read. The body passes through untouched: an engine is
/// told its public base URL (`{gateway}/sqs/{tenant}`, ElasticMQ's
/// node-address), so the queue URLs it answers with already name the edge.
fn relay(status: StatusCode, headers: &HeaderMap, bytes: Bytes) -> (StatusCode, Response, i64) {
    let len = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    let mut response = (status, Body::from(bytes)).into_response();
    for name in RETURNED {
        if let Some(v) = headers.get(*name) {
            response.headers_mut().insert(*name, v.clone());
        }
    }
    (status, response, len)
}

/// To an engine over HTTP/1.1 (a pooled keep-alive connection).
async fn forward(
    http: &BackendClient,
    request: axum::http::request::Builder,
    body: Bytes,
) -> Result<Exchanged, ForwardError> {
    use http_body_util::BodyExt;
    let upstream = http.request(request.body(http_body_util::Full::new(body))?).await?;
    let (parts, upstream_body) = upstream.into_parts();
    Ok((parts.status, parts.headers, upstream_body.collect().await?.to_bytes()))
}

/// To an engine of this process: its router is called directly.
async fn in_process(
    router: axum::Router,
    request: axum::http::request::Builder,
    body: Bytes,
) -> Result<Exchanged, ForwardError> {
    use tower::ServiceExt;
    let Ok(response) = router.oneshot(request.body(Body::from(body))?).await;
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(ForwardError::InProcess)?;
    Ok((parts.status, parts.headers, bytes))
}

/// An engine's answer: status, headers and body.
type Exchanged = (StatusCode, HeaderMap, Bytes);

#[cfg(test)]
mod leaders_tests {
    use super::Leaders;

    #[test]
    fn the_replica_asked_first_is_the_last_leader_or_the_one_after_a_follower() {
        let members: Vec<String> = ["a:1", "b:1", "c:1"].map(str::to_owned).into();
        let leaders = Leaders::default();
        assert_eq!(leaders.first(&members), 0, "the first member until one answered");
        leaders.learn(&members, 0, true);
        assert_eq!(leaders.first(&members), 1, "a follower answered: the next one");
        leaders.learn(&members, 2, false);
        assert_eq!(leaders.first(&members), 2, "the leader answered: it again");
        leaders.learn(&members, 2, true);
        assert_eq!(leaders.first(&members), 0, "round the members");
        // A route whose members changed: its first member names it, and a
        // remembered index past its end wraps.
        let fewer: Vec<String> = ["a:1", "b:1"].map(str::to_owned).into();
        leaders.learn(&members, 2, false);
        assert_eq!(leaders.first(&fewer), 0);
    }
}
