//! A stand-in for the Kubernetes API server, over HTTP on loopback, for
//! tests that run the real `sless serve` binary: its controllers, watches,
//! leader Lease, server-side apply and status patches then go over the
//! wire as on a cluster. It is a test's, never the product's.
//!
//! What it does: every resource path (`/api/v1/...`, `/apis/{group}/
//! {version}/...`, namespaced or cluster-wide) over one in-memory store
//! with resource versions; list and watch (from a resource version, with
//! label and field selectors); create (409 when the name is taken);
//! replace (409 on a stale resource version); merge, JSON and apply
//! patches; the `status` subresource (a write to an object leaves its
//! status alone, a write to `/status` changes only the status);
//! finalizers (a delete marks the object until they are gone); `/version`.
//!
//! What it does not do: no garbage collection (owner references are
//! stored, nothing is deleted with its owner), no admission (no webhook is
//! called, no schema is checked), no scheduling or kubelet (nothing runs;
//! a test sets the status a controller or kubelet would), server-side apply
//! is a merge (no field ownership, no removal of fields an applier drops),
//! no authentication, and it forgets everything when dropped.
//!
//! Over 500 lines: one HTTP server whose verbs share one store and one
//! change log; split, each part would reach into the others.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;

/// (collection path, namespace or "", name).
type Key = (String, String, String);

#[derive(Clone)]
struct Change {
    version: u64,
    kind: &'static str,
    key: Key,
    object: Value,
}

#[derive(Default)]
struct Store {
    version: u64,
    objects: BTreeMap<Key, Value>,
    log: Vec<Change>,
    /// List requests (not watches) by collection, e.g. `api/v1/secrets`.
    lists: BTreeMap<String, u64>,
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Store>>,
    changes: broadcast::Sender<Change>,
}

/// The stand-in, serving until dropped.
pub struct KubeApi {
    pub addr: SocketAddr,
    shared: Shared,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl KubeApi {
    pub async fn start() -> Self {
        let (changes, _) = broadcast::channel(4096);
        let shared = Shared {
            store: Arc::default(),
            changes,
        };
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, shared, server }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many lists (not watches) of `collection` (`api/v1/secrets`,
    /// `apis/apps/v1/deployments`) were asked for so far, in any namespace.
    pub fn lists(&self, collection: &str) -> u64 {
        let store = self.shared.store.lock().unwrap_or_else(|p| p.into_inner());
        store.lists.get(collection).copied().unwrap_or(0)
    }

    /// A kubeconfig naming this server, written to `path`.
    pub fn write_kubeconfig(&self, path: &std::path::Path) {
        let text = format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: test\n  cluster:\n    server: {}\n\
             contexts:\n- name: test\n  context:\n    cluster: test\n    user: test\n    namespace: default\n\
             users:\n- name: test\n  user: {{}}\n",
            self.url()
        );
        std::fs::write(path, text).expect("write the kubeconfig");
    }
}

/// Where a request points.
struct Target {
    collection: String,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

fn target(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => (format!("api/{version}"), rest),
        ["apis", group, version, rest @ ..] => (format!("apis/{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, resource, tail) = match rest {
        ["namespaces", ns, resource, tail @ ..] => (Some((*ns).to_owned()), *resource, tail),
        [resource, tail @ ..] => (None, *resource, tail),
        [] => return None,
    };
    Some(Target {
        collection: format!("{prefix}/{resource}"),
        namespace,
        name: tail.first().map(|n| (*n).to_owned()),
        status: tail.get(1) == Some(&"status"),
    })
}

fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code,
    });
    (
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response()
}

/// A missing object, as the API server answers it: its name in `details`
/// (a 404 without one means the kind itself is missing).
fn not_found(collection: &str, name: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{collection} \"{name}\" not found"), "reason": "NotFound",
        "details": {"name": name, "kind": collection}, "code": 404,
    });
    (StatusCode::NOT_FOUND, axum::Json(body)).into_response()
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .into_owned()
        .collect()
}

/// Whether `object` has every `k=v` (or `k`, or `k!=v`) of a selector.
fn labels_match(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    let labels = &object["metadata"]["labels"];
    selector.split(',').all(|term| {
        if let Some((k, v)) = term.split_once("!=") {
            labels[k].as_str() != Some(v)
        } else if let Some((k, v)) = term.split_once('=') {
            labels[k].as_str() == Some(v.trim_start_matches('='))
        } else {
            !labels[term].is_null()
        }
    })
}

/// Whether `object` has every `a.b=v` of a field selector.
fn fields_match(object: &Value, selector: Option<&String>) -> bool {
    let Some(selector) = selector.filter(|s| !s.is_empty()) else {
        return true;
    };
    selector.split(',').all(|term| {
        let Some((path, want)) = term.split_once('=') else {
            return true;
        };
        let got = path.split('.').fold(object, |v, k| &v[k]);
        got.as_str() == Some(want.trim_start_matches('='))
    })
}

fn in_scope(key: &Key, target: &Target) -> bool {
    key.0 == target.collection && target.namespace.as_ref().is_none_or(|ns| &key.1 == ns)
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl Store {
    fn record(&mut self, changes: &broadcast::Sender<Change>, kind: &'static str, key: Key, object: Value) {
        let change = Change {
            version: self.version,
            kind,
            key,
            object,
        };
        self.log.push(change.clone());
        let _ = changes.send(change);
    }

    fn bump(&mut self, object: &mut Value) {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
    }
}

/// JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in fields {
                if v.is_null() {
                    if let Some(map) = target.as_object_mut() {
                        map.remove(k);
                    }
                } else {
                    merge(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

async fn handle(State(shared): State<Shared>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    if uri.path() == "/version" {
        return axum::Json(json!({
            "major": "1", "minor": "32", "gitVersion": "v1.32.0-sless-test", "gitCommit": "", "gitTreeState": "",
            "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"
        }))
        .into_response();
    }
    let Some(target) = target(uri.path()) else {
        return status(404, "NotFound", format!("no route {}", uri.path()));
    };
    let params = query(&uri);
    match (&method, target.name.is_some()) {
        (&Method::GET, false) if params.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            watch(shared, target, params)
        }
        (&Method::GET, false) => list(&shared, &target, &params),
        (&Method::GET, true) => get(&shared, &target),
        (&Method::POST, false) => create(&shared, &target, &body),
        (&Method::PUT, true) => replace(&shared, &target, &body),
        (&Method::PATCH, true) => patch(&shared, &target, &headers, &body),
        (&Method::DELETE, true) => delete(&shared, &target),
        _ => status(405, "MethodNotAllowed", format!("{method} {}", uri.path())),
    }
}

fn key(target: &Target, name: &str) -> Key {
    (
        target.collection.clone(),
        target.namespace.clone().unwrap_or_default(),
        name.to_owned(),
    )
}

fn list(shared: &Shared, target: &Target, params: &BTreeMap<String, String>) -> Response {
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    *store.lists.entry(target.collection.clone()).or_default() += 1;
    let items: Vec<&Value> = store
        .objects
        .iter()
        .filter(|(k, v)| {
            in_scope(k, target)
                && labels_match(v, params.get("labelSelector"))
                && fields_match(v, params.get("fieldSelector"))
        })
        .map(|(_, v)| v)
        .collect();
    axum::Json(json!({
        "apiVersion": "v1", "kind": "List",
        "metadata": {"resourceVersion": store.version.to_string()},
        "items": items,
    }))
    .into_response()
}

fn get(shared: &Shared, target: &Target) -> Response {
    let store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let name = target.name.clone().unwrap_or_default();
    match store.objects.get(&key(target, &name)) {
        Some(object) => axum::Json(object.clone()).into_response(),
        None => not_found(&target.collection, &name),
    }
}

fn create(shared: &Shared, target: &Target, body: &[u8]) -> Response {
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let name = match object["metadata"]["name"].as_str() {
        Some(name) => name.to_owned(),
        None => match object["metadata"]["generateName"].as_str() {
            Some(prefix) => format!("{prefix}{:05x}", rand::random::<u32>() & 0xfffff),
            None => return status(422, "Invalid", "metadata.name: Required value"),
        },
    };
    let key = key(target, &name);
    if store.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", target.collection),
        );
    }
    object["metadata"]["name"] = json!(name);
    if let Some(ns) = &target.namespace {
        object["metadata"]["namespace"] = json!(ns);
    }
    object["metadata"]["uid"] = json!(format!("{:032x}", rand::random::<u128>()));
    object["metadata"]["creationTimestamp"] = json!(now());
    object["metadata"]["generation"] = json!(1);
    store.bump(&mut object);
    store.objects.insert(key.clone(), object.clone());
    store.record(&shared.changes, "ADDED", key, object.clone());
    (StatusCode::CREATED, axum::Json(object)).into_response()
}

/// Stores `updated` in place of `current` (which exists): a write to the
/// object keeps its status, a write to `/status` changes only the status;
/// the generation follows the spec; an object marked for deletion whose
/// finalizers are gone is deleted.
fn store_update(
    shared: &Shared,
    store: &mut Store,
    key: Key,
    current: &Value,
    mut updated: Value,
    to_status: bool,
) -> Value {
    if to_status {
        let status = updated["status"].take();
        updated = current.clone();
        updated["status"] = status;
    } else {
        updated["status"] = current["status"].clone();
        if updated["status"].is_null()
            && let Some(map) = updated.as_object_mut()
        {
            map.remove("status");
        }
        // Fields the server owns.
        for field in ["uid", "creationTimestamp", "deletionTimestamp", "namespace", "name"] {
            updated["metadata"][field] = current["metadata"][field].clone();
        }
        let generation = current["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = updated["spec"] != current["spec"];
        updated["metadata"]["generation"] = json!(if changed { generation + 1 } else { generation });
    }
    if let Some(map) = updated["metadata"].as_object_mut() {
        map.retain(|_, v| !v.is_null());
    }
    // A write that changes nothing is no change: no new version, no event
    // (a controller writing its unchanged status must not wake itself).
    updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    if updated == *current {
        return updated;
    }
    store.bump(&mut updated);
    let finalized = !updated["metadata"]["deletionTimestamp"].is_null()
        && updated["metadata"]["finalizers"].as_array().is_none_or(Vec::is_empty);
    if finalized {
        store.objects.remove(&key);
        store.record(&shared.changes, "DELETED", key, updated.clone());
    } else {
        store.objects.insert(key.clone(), updated.clone());
        store.record(&shared.changes, "MODIFIED", key, updated.clone());
    }
    updated
}

fn stale(current: &Value, sent: &Value) -> bool {
    sent["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|rv| Some(rv) != current["metadata"]["resourceVersion"].as_str())
}

fn conflict(target: &Target, name: &str) -> Response {
    status(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
            target.collection
        ),
    )
}

fn replace(shared: &Shared, target: &Target, body: &[u8]) -> Response {
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let name = target.name.clone().unwrap_or_default();
    let key = key(target, &name);
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let Some(current) = store.objects.get(&key).cloned() else {
        return not_found(&target.collection, &name);
    };
    if stale(&current, &sent) {
        return conflict(target, &name);
    }
    let updated = store_update(shared, &mut store, key, &current, sent, target.status);
    axum::Json(updated).into_response()
}

fn patch(shared: &Shared, target: &Target, headers: &HeaderMap, body: &[u8]) -> Response {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "the body is not JSON");
    };
    let name = target.name.clone().unwrap_or_default();
    let key = key(target, &name);
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let current = store.objects.get(&key).cloned();
    let apply = content_type.starts_with("application/apply-patch");
    let Some(current) = current else {
        if !apply {
            return not_found(&target.collection, &name);
        }
        // Server-side apply of a missing object creates it.
        drop(store);
        let mut object = sent;
        object["metadata"]["name"] = json!(name);
        return create(shared, target, &serde_json::to_vec(&object).unwrap_or_default());
    };
    let mut updated = current.clone();
    if content_type.starts_with("application/json-patch") {
        let Ok(ops) = serde_json::from_value::<json_patch::Patch>(sent) else {
            return status(400, "BadRequest", "not a JSON patch");
        };
        // The API server tests an absent list as null (kube's first
        // finalizer is added after a `test` of null).
        if updated["metadata"]["finalizers"].is_null() {
            updated["metadata"]["finalizers"] = Value::Null;
        }
        if let Err(e) = json_patch::patch(&mut updated, &ops) {
            return status(422, "Invalid", format!("the JSON patch does not apply: {e}"));
        }
    } else {
        if stale(&current, &sent) {
            return conflict(target, &name);
        }
        merge(&mut updated, &sent);
    }
    let updated = store_update(shared, &mut store, key, &current, updated, target.status);
    axum::Json(updated).into_response()
}

fn delete(shared: &Shared, target: &Target) -> Response {
    let name = target.name.clone().unwrap_or_default();
    let key = key(target, &name);
    let mut store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut object) = store.objects.get(&key).cloned() else {
        return not_found(&target.collection, &name);
    };
    let finalizers = object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    if finalizers {
        if object["metadata"]["deletionTimestamp"].is_null() {
            object["metadata"]["deletionTimestamp"] = json!(now());
            store.bump(&mut object);
            store.objects.insert(key.clone(), object.clone());
            store.record(&shared.changes, "MODIFIED", key, object.clone());
        }
    } else {
        store.bump(&mut object);
        store.objects.remove(&key);
        store.record(&shared.changes, "DELETED", key, object.clone());
    }
    axum::Json(object).into_response()
}

fn watch(shared: Shared, target: Target, params: BTreeMap<String, String>) -> Response {
    let since: u64 = params.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(300), Duration::from_secs);
    // Subscribed before the backlog is read, so nothing falls in between.
    let receiver = shared.changes.subscribe();
    let backlog: Vec<Change> = {
        let store = shared.store.lock().unwrap_or_else(|p| p.into_inner());
        store.log.iter().filter(|c| c.version > since).cloned().collect()
    };
    let matches = move |c: &Change| {
        in_scope(&c.key, &target)
            && labels_match(&c.object, params.get("labelSelector"))
            && fields_match(&c.object, params.get("fieldSelector"))
    };
    let line = |c: &Change| {
        let mut text = json!({"type": c.kind, "object": c.object}).to_string();
        text.push('\n');
        Bytes::from(text)
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let state = (backlog.into_iter(), receiver, since, matches, line);
    let stream = futures_util::stream::unfold(
        state,
        move |(mut backlog, mut receiver, mut last, matches, line)| async move {
            loop {
                let next = match backlog.next() {
                    Some(change) => change,
                    None => match tokio::time::timeout_at(deadline, receiver.recv()).await {
                        Ok(Ok(change)) => change,
                        // Lagged: the watcher starts over with a list, as after a 410.
                        Ok(Err(_)) | Err(_) => return None,
                    },
                };
                if next.version <= last || !matches(&next) {
                    last = last.max(next.version);
                    continue;
                }
                last = next.version;
                let bytes = line(&next);
                return Some((Ok::<_, Infallible>(bytes), (backlog, receiver, last, matches, line)));
            }
        },
    );
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| status(500, "InternalError", "cannot stream"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_collection_namespace_and_object() {
        let t = target("/apis/apps/v1/namespaces/ns/deployments/d/status").unwrap();
        assert_eq!(
            (
                t.collection.as_str(),
                t.namespace.as_deref(),
                t.name.as_deref(),
                t.status
            ),
            ("apis/apps/v1/deployments", Some("ns"), Some("d"), true)
        );
        let t = target("/api/v1/namespaces/sless-fn-a").unwrap();
        assert_eq!(
            (t.collection.as_str(), t.namespace.as_deref(), t.name.as_deref()),
            ("api/v1/namespaces", None, Some("sless-fn-a"))
        );
        let t = target("/apis/sless.kube5s.ru/v1alpha1/queueservices").unwrap();
        assert_eq!((t.namespace, t.name), (None, None));
        assert_eq!(now().len(), 20);
    }

    #[test]
    fn selectors_and_merges() {
        let object = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "involvedObject": {"name": "x"}});
        assert!(labels_match(&object, Some(&"a=1,b".to_owned())));
        assert!(!labels_match(&object, Some(&"a=2".to_owned())));
        assert!(fields_match(&object, Some(&"involvedObject.name=x".to_owned())));
        let mut target = json!({"a": {"b": 1, "c": 2}});
        merge(&mut target, &json!({"a": {"b": null, "d": 3}}));
        assert_eq!(target, json!({"a": {"c": 2, "d": 3}}));
        let selector = query(&"/x?labelSelector=a%3Db%2Cc&watch=true".parse().unwrap());
        assert_eq!(selector["labelSelector"], "a=b,c");
    }
}
