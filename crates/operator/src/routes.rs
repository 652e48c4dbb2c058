//! The SQS gateways' routing table, from the cluster. While this replica
//! leads, every QueueService's keys and engine token (its Secret) and the
//! address of its engine (its Service's ClusterIP) go to the control
//! plane's publisher, which debounces and publishes only changes. They are
//! watched (reflectors: one list, then changes; a lost watch lists again),
//! and the table is rebuilt from those caches every [`POLL`], which costs
//! the API server nothing.
//! Once every gateway has applied a snapshot holding a QueueService's route,
//! its status says `routed` (the REST API's Ready waits for it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, Patch, PatchParams};
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
use tokio::sync::watch;

use crate::crd::queue_service::QueueService;
use crate::objects::secret_strings;
use crate::queue_service::builders::{self, ENGINE_TOKEN_KEY, SQS_PORT};

/// How often the table is rebuilt from the caches (and the store's
/// ownership epoch read).
pub const POLL: Duration = Duration::from_secs(2);

/// Starting the control plane again after a failure: 500 ms, doubling to 10 s.
const RESTART: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));

/// The children of QueueServices, as [`builders`] labels them.
pub(crate) const CHILDREN_SELECTOR: &str = "app.kubernetes.io/managed-by=sless-operator,app.kubernetes.io/name=sqs";

/// Publishes the routing table every [`POLL`] until `stopped` is set, and
/// marks the queue services every gateway routes. A failed read keeps the
/// table as it was: gateways go on serving.
pub async fn publish(
    client: Client,
    publisher: SnapshotPublisher,
    service: Arc<ControlService>,
    mut stopped: watch::Receiver<bool>,
) {
    let (caches, watching) = Caches::start(&client);
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
        let (queues, snapshot) = caches.read();
        let snapshot = canonical(snapshot);
        publisher.publish(snapshot.clone());
        mark_routed(&client, &service, &queues, &snapshot).await;
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
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
    /// Starts the watches; the task ends them when aborted.
    fn start(client: &Client) -> (Self, tokio::task::JoinHandle<()>) {
        let children = watcher::Config::default().labels(CHILDREN_SELECTOR);
        let (queues, watch_queues) = cache(Api::<QueueService>::all(client.clone()), watcher::Config::default());
        let (secrets, watch_secrets) = cache(Api::<Secret>::all(client.clone()), children.clone());
        let (services, watch_services) = cache(Api::<Service>::all(client.clone()), children);
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

    /// The QueueServices, and the routing table as the caches have it: a
    /// route per QueueService that is not being deleted and has its keys.
    /// Its engine address is empty until its Service has a ClusterIP (the
    /// gateway then answers 503).
    fn read(&self) -> (Vec<QueueService>, RoutingSnapshot) {
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
            });
        }
        let snapshot = routes::snapshot(read.iter().map(|r| Route {
            tenant: &r.tenant,
            backend_address: r.backend.as_deref(),
            backend_token: r.token.as_deref(),
            credentials: &r.credentials,
        }));
        (queues, snapshot)
    }
}

/// A store kept by a watch of `api`, and the future that keeps it: it
/// lists again, backing off, whenever the watch fails.
fn cache<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, impl std::future::Future<Output = ()>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let keeping = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .for_each(move |event| {
            if let Err(e) = event {
                tracing::warn!(kind, error = %e, "watch failed; listing again");
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
}

/// Sets `status.routed` on each queue service not marked yet whose route,
/// with its engine's address, is in the newest published snapshot as it is
/// in `desired` (canonical), once every live gateway has applied that
/// snapshot (at once when no gateway is connected: none to wait for).
async fn mark_routed(client: &Client, service: &ControlService, queues: &[QueueService], desired: &RoutingSnapshot) {
    let Some(published) = service.published().borrow().clone() else {
        return;
    };
    if service
        .applied_everywhere(published.id.ownership_epoch)
        .is_some_and(|applied| applied < published.id.version)
    {
        return;
    }
    let routed = |tenant: &str| {
        let wanted = route_of(desired, tenant);
        wanted.is_some_and(|r| !r.backend_address.is_empty()) && wanted == route_of(&published.snapshot, tenant)
    };
    for qs in queues {
        let marked = qs.status.as_ref().and_then(|s| s.routed) == Some(true);
        if marked || qs.metadata.deletion_timestamp.is_some() || !routed(&qs.spec.tenant_id) {
            continue;
        }
        let api = Api::<QueueService>::namespaced(client.clone(), &qs.namespace().unwrap_or_default());
        let patch = serde_json::json!({ "status": { "routed": true } });
        match api
            .patch_status(&qs.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!(tenant = %qs.spec.tenant_id, version = published.id.version,
                "every gateway routes the queue service"),
            Err(e) => tracing::warn!(tenant = %qs.spec.tenant_id, error = %e, "cannot mark the queue service routed"),
        }
    }
}

fn route_of<'a>(snapshot: &'a RoutingSnapshot, tenant: &str) -> Option<&'a TenantRoute> {
    snapshot.routes.iter().find(|r| r.tenant == tenant)
}
