//! The SQS gateways' routing table, from the cluster. While this replica
//! leads, every QueueService's keys and engine token (its Secret) and the
//! address of its engine (its Service's ClusterIP) go to the control
//! plane's publisher, which debounces and publishes only changes. They are
//! watched (reflectors: one list, then changes; a lost watch lists again),
//! and the table is rebuilt from those caches when one changes, and every
//! [`RESYNC`] besides; both cost the API server nothing.
//! Once every gateway has applied a snapshot holding a QueueService's route,
//! its status says `routed` (the REST API's Ready waits for it); a route
//! the gateways could not use is left out alone, and its QueueService says
//! why (`routeLeftOut`, and a Warning Event).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use sless_controlplane::config::ControlPlaneConfig;
use sless_controlplane::proto::{RoutingSnapshot, TenantRoute};
use sless_controlplane::publisher::{Debounce, SnapshotPublisher, canonical};
use sless_controlplane::server::ControlPlane;
use sless_controlplane::store::ControlStore;
use sless_controlplane::worker::Service as ControlService;
use sless_model::queue_service::Credentials;
use sless_runtime::backoff::Backoff;
use sless_runtime::shutdown::stopped;
use sless_sqs::gateway::routes::{self, Route};
use tokio::sync::{Notify, watch};

use crate::context;
use crate::crd::queue_service::QueueService;
use crate::objects::secret_strings;
use crate::queue_service::builders::{self, ENGINE_TOKEN_KEY, SQS_PORT};

/// How often the store's ownership epoch is read, and the table rebuilt
/// while a queue service waits for its route to reach every gateway.
pub const POLL: Duration = Duration::from_secs(2);
/// How often the table is rebuilt when nothing changed.
pub const RESYNC: Duration = Duration::from_secs(300);

/// Starting the control plane again after a failure: 500 ms, doubling to 10 s.
const RESTART: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));

/// The children of QueueServices, as [`builders`] labels them.
pub(crate) const CHILDREN_SELECTOR: &str = "app.kubernetes.io/managed-by=sless-operator,app.kubernetes.io/name=sqs";

/// Publishes the routing table when its objects change until `stopped`
/// is set, and marks the queue services every gateway routes or none can.
/// A failed watch keeps the table as it was: gateways go on serving.
pub async fn publish(
    client: Client,
    publisher: SnapshotPublisher,
    service: Arc<ControlService>,
    mut stopped: watch::Receiver<bool>,
) {
    let changed = Arc::new(Notify::new());
    let (caches, watching) = Caches::start(&client, &changed);
    let recorder = context::recorder(client.clone(), None);
    // An empty table before the first lists would take every route away.
    let filled = tokio::select! {
        filled = caches.filled() => filled,
        _ = stopped.wait_for(|s| *s) => false,
    };
    if !filled {
        watching.abort();
        return;
    }
    loop {
        let (queues, snapshot, left_out) = caches.read();
        let snapshot = canonical(snapshot);
        publisher.publish(snapshot.clone());
        let waiting = mark_routes(&client, &recorder, &service, &queues, &snapshot, &left_out).await;
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(if waiting { POLL } else { RESYNC }) => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
    }
    watching.abort();
}

/// The objects the routing table is made of, as watches keep them.
struct Caches {
    queues: Store<QueueService>,
    secrets: Store<Secret>,
    services: Store<Service>,
}

impl Caches {
    /// Starts the watches, which notify `changed` of each change; the task
    /// ends them when aborted.
    fn start(client: &Client, changed: &Arc<Notify>) -> (Self, tokio::task::JoinHandle<()>) {
        let children = watcher::Config::default().labels(CHILDREN_SELECTOR);
        let all = watcher::Config::default();
        let (queues, watch_queues) = cache(Api::<QueueService>::all(client.clone()), all, changed.clone());
        let (secrets, watch_secrets) = cache(Api::<Secret>::all(client.clone()), children.clone(), changed.clone());
        let (services, watch_services) = cache(Api::<Service>::all(client.clone()), children, changed.clone());
        let watching = tokio::spawn(async move {
            tokio::join!(watch_queues, watch_secrets, watch_services);
        });
        (
            Self {
                queues,
                secrets,
                services,
            },
            watching,
        )
    }

    /// Whether every cache was filled by its first list (false when a
    /// watch ended before that).
    async fn filled(&self) -> bool {
        let (queues, secrets, services) = tokio::join!(
            self.queues.wait_until_ready(),
            self.secrets.wait_until_ready(),
            self.services.wait_until_ready()
        );
        let filled = queues.is_ok() && secrets.is_ok() && services.is_ok();
        if !filled {
            tracing::warn!("a watch of the routing table's objects ended before its first list");
        }
        filled
    }

    /// The QueueServices, the routing table as the caches have it (a route
    /// per QueueService that is not being deleted and has its keys; its
    /// engine address empty until its Service has a ClusterIP, and the
    /// gateway then answers 503), and why each route left out of it is, by
    /// tenant.
    fn read(&self) -> (Vec<QueueService>, RoutingSnapshot, HashMap<String, String>) {
        let queues: Vec<QueueService> = self.queues.state().iter().map(|q| (**q).clone()).collect();
        let key = |namespace: Option<String>, name: String| (namespace.unwrap_or_default(), name);
        let mut secrets: HashMap<(String, String), Secret> = self
            .secrets
            .state()
            .iter()
            .map(|s| (key(s.namespace(), s.name_any()), (**s).clone()))
            .collect();
        let addresses: HashMap<(String, String), String> = self
            .services
            .state()
            .iter()
            .filter_map(|s| {
                let ip = s.spec.as_ref()?.cluster_ip.clone()?;
                let usable = !ip.is_empty() && ip != "None";
                usable.then(|| (key(s.namespace(), s.name_any()), format!("{ip}:{SQS_PORT}")))
            })
            .collect();
        let mut read: Vec<Read> = Vec::new();
        for qs in queues.iter().filter(|q| q.metadata.deletion_timestamp.is_none()) {
            let tenant = qs.spec.tenant_id.clone();
            let namespace = builders::namespace_name(&tenant);
            let Some(secret) = secrets.remove(&(namespace.clone(), builders::secret_name(&tenant))) else {
                continue;
            };
            let mut values = secret_strings(secret);
            let (Some(access_key), Some(secret_key)) = (values.remove("accessKey"), values.remove("secretKey")) else {
                continue;
            };
            read.push(Read {
                backend: addresses.get(&(namespace, builders::service_name(&tenant))).cloned(),
                token: values.remove(ENGINE_TOKEN_KEY),
                credentials: Credentials { access_key, secret_key },
                tenant,
                requests_per_second: qs.spec.requests_per_second,
                bytes_per_second: qs.spec.bytes_per_second,
            });
        }
        let (snapshot, left_out) = routes::snapshot(read.iter().map(|r| Route {
            tenant: &r.tenant,
            backend_address: r.backend.as_deref(),
            backend_token: r.token.as_deref(),
            credentials: &r.credentials,
            requests_per_second: r.requests_per_second,
            bytes_per_second: r.bytes_per_second,
        }));
        let left_out = left_out.into_iter().map(|l| (l.tenant, l.reason)).collect();
        (queues, snapshot, left_out)
    }
}

/// A store kept by a watch of `api`, and the future that keeps it: it
/// notifies `changed` of each change, and lists again, backing off,
/// whenever the watch fails.
fn cache<K>(
    api: Api<K>,
    config: watcher::Config,
    changed: Arc<Notify>,
) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let keeping = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .for_each(move |event| {
            match event {
                Ok(_) => changed.notify_one(),
                Err(e) => tracing::warn!(kind, error = %e, "watch failed; listing again"),
            }
            std::future::ready(())
        });
    (reader, keeping)
}

/// The leader's part of the worker control plane: it claims a fresh
/// ownership epoch, serves the gateways and publishes the routing table,
/// until `stop` turns true. Followers serve nothing, so gateways settle on
/// the leader. When the store's epoch moves away from this one (another
/// replica claimed it, or Redis lost it in a restart), this control plane
/// stops and claims again: gateways re-register with a current owner and
/// keep serving from their last table meanwhile.
pub async fn serve_control_plane(
    config: ControlPlaneConfig,
    store: Arc<dyn ControlStore>,
    client: Client,
    debounce: Debounce,
    mut stop: watch::Receiver<bool>,
) {
    let mut retries = RESTART.start();
    while !*stop.borrow() {
        let control_plane = match ControlPlane::start(config.clone(), store.clone(), debounce).await {
            Ok(cp) => cp,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the worker control plane; retrying");
                if !retries.wait(&mut stop).await {
                    return;
                }
                continue;
            }
        };
        retries.succeeded();
        let epoch = control_plane.ownership_epoch;
        let (stop_this, this_stopped) = watch::channel(false);
        let publishing = tokio::spawn(publish(
            client.clone(),
            control_plane.publisher.clone(),
            control_plane.service.clone(),
            this_stopped.clone(),
        ));
        let mut serving = tokio::spawn(control_plane.serve(stopped(&this_stopped)));
        let ended = loop {
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                _ = stop.wait_for(|s| *s) => break None,
                ended = &mut serving => break Some(ended),
            }
            match store.current_ownership_epoch().await {
                Ok(current) if current != epoch => {
                    tracing::warn!(epoch, current, "the ownership epoch moved; claiming it again");
                    break None;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "cannot read the ownership epoch"),
            }
        };
        stop_this.send_replace(true);
        let _ = publishing.await;
        let ended = match ended {
            Some(ended) => ended,
            None => serving.await,
        };
        if let Ok(Err(e)) = ended {
            tracing::warn!(error = %e, "the worker control plane stopped");
        }
    }
}

/// One tenant's route as read from its children.
struct Read {
    tenant: String,
    credentials: Credentials,
    token: Option<String>,
    backend: Option<String>,
    requests_per_second: Option<u32>,
    bytes_per_second: Option<u64>,
}

/// Marks each queue service's status with where its route stands: left
/// out of the table (`routeLeftOut`, `routed` false, and a Warning Event
/// when the reason is new), or `routed` once its route, with its engine's
/// address, is in the newest published snapshot as it is in `desired`
/// (canonical) and every live gateway has applied that snapshot (at once
/// when no gateway is connected: none to wait for). Whether a queue
/// service still waits for its route to reach the gateways.
async fn mark_routes(
    client: &Client,
    recorder: &Recorder,
    service: &ControlService,
    queues: &[QueueService],
    desired: &RoutingSnapshot,
    left_out: &HashMap<String, String>,
) -> bool {
    let published = service.published().borrow().clone();
    let everywhere = published.as_ref().filter(|p| {
        service
            .applied_everywhere(p.id.ownership_epoch)
            .is_none_or(|applied| applied >= p.id.version)
    });
    let routed = |tenant: &str| {
        let wanted = route_of(desired, tenant);
        everywhere.is_some_and(|p| {
            wanted.is_some_and(|r| !r.backend_address.is_empty()) && wanted == route_of(&p.snapshot, tenant)
        })
    };
    let mut waiting = false;
    for qs in queues.iter().filter(|q| q.metadata.deletion_timestamp.is_none()) {
        let tenant = &qs.spec.tenant_id;
        let status = qs.status.as_ref();
        let then = (
            status.and_then(|s| s.routed),
            status.and_then(|s| s.route_left_out.as_ref()),
        );
        let reason = left_out.get(tenant);
        let now = match reason {
            Some(reason) => (Some(false), Some(reason)),
            None if then.0 == Some(true) || routed(tenant) => (Some(true), None),
            None => {
                waiting = true;
                (then.0, None)
            }
        };
        if now == then {
            continue;
        }
        let api = Api::<QueueService>::namespaced(client.clone(), &qs.namespace().unwrap_or_default());
        let patch = serde_json::json!({ "status": { "routed": now.0, "routeLeftOut": now.1 } });
        if let Err(e) = api
            .patch_status(&qs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%tenant, error = %e, "cannot mark where the queue service's route stands");
            waiting = true;
            continue;
        }
        match reason {
            // Once for each reason, not for each write of it.
            Some(reason) if now.1 != then.1 => {
                let note = format!("the gateways leave this queue service's route out: {reason}");
                context::publish(recorder, qs, &context::event(false, "RouteLeftOut", "Route", note)).await;
            }
            None if now.0 == Some(true) => {
                tracing::info!(%tenant, version = ?published.as_ref().map(|p| p.id.version),
                    "every gateway routes the queue service");
            }
            _ => {}
        }
    }
    waiting
}

fn route_of<'a>(snapshot: &'a RoutingSnapshot, tenant: &str) -> Option<&'a TenantRoute> {
    snapshot.routes.iter().find(|r| r.tenant == tenant)
}
