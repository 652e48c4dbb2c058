//! Runs the operator in `sless serve`: competes for the leader Lease, and
//! while it holds it runs the QueueService and DataFlow controllers
//! (`kube::runtime::Controller`, watching the children they own) and
//! whatever else only the leader may do. Counts reconciles, failures and
//! their duration for `/metrics`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use super::config::{MANAGED_BY, OperatorConfig};
use super::context::{Context, error_policy};
use super::crd::dataflow::DataFlow;
use super::crd::queue_service::QueueService;
use super::error::Error;
use super::leader::LeaderElector;
use super::{dataflow, queue_service};

pub const LEASE_NAME: &str = "sless-operator";
const LEASE_DURATION: Duration = Duration::from_secs(15);
const CANDIDATE_RETRY: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

pub struct OperatorMetrics {
    reconciles: Family<ControllerLabels, Counter>,
    failures: Family<ControllerLabels, Counter>,
    duration: Family<ControllerLabels, Histogram>,
    leader: Gauge<i64, AtomicI64>,
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> Arc<Self> {
        let metrics = Self {
            reconciles: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 14))),
            leader: Gauge::default(),
        };
        let registry = registry.sub_registry_with_prefix("sless_operator");
        registry.register(
            "reconciles",
            "Reconciles run, by controller",
            metrics.reconciles.clone(),
        );
        registry.register(
            "reconcile_failures",
            "Reconciles that failed, by controller",
            metrics.failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration, by controller",
            metrics.duration.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            metrics.leader.clone(),
        );
        Arc::new(metrics)
    }

    async fn timed(
        &self,
        controller: &'static str,
        reconcile: impl Future<Output = Result<Action, Error>>,
    ) -> Result<Action, Error> {
        let labels = ControllerLabels { controller };
        let started = Instant::now();
        let result = reconcile.await;
        self.reconciles.get_or_create(&labels).inc();
        if result.is_err() {
            self.failures.get_or_create(&labels).inc();
        }
        self.duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        result
    }
}

pub struct OperatorOptions {
    pub config: OperatorConfig,
    /// Namespace of the leader Lease (the operator's own).
    pub lease_namespace: String,
    /// This replica's name in the Lease (its pod name).
    pub identity: String,
    /// What else runs only on the leader, beside the controllers (the
    /// worker control plane and its route publisher in `sless serve`).
    pub while_leading: Option<LeaderWork>,
}

/// Work that runs while this replica leads, until its receiver turns true.
pub type LeaderWork = Arc<dyn Fn(watch::Receiver<bool>) -> BoxFuture<'static, ()> + Send + Sync>;

/// Runs until `shutdown` is set; gives the Lease up on the way out.
pub async fn run(
    client: Client,
    opts: OperatorOptions,
    metrics: Arc<OperatorMetrics>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), kube::Error> {
    let lease = Api::namespaced(client.clone(), &opts.lease_namespace);
    let ctx = Arc::new(Context::new(client, opts.config, Some(opts.identity.clone())));
    let also = opts.while_leading;
    lead(lease, &opts.identity, LEASE_DURATION, shutdown, move |stopped| {
        let controllers = controllers(ctx.clone(), metrics.clone(), stopped.clone());
        let also = also.as_ref().map(|work| work(stopped));
        let metrics = metrics.clone();
        async move {
            metrics.leader.set(1);
            match also {
                Some(also) => drop(tokio::join!(controllers, also)),
                None => controllers.await,
            }
            metrics.leader.set(0);
        }
    })
    .await
}

/// Competes for the Lease `lease` (named [`LEASE_NAME`]); while it holds
/// it, runs `work`, which must end once its receiver turns true: when the
/// Lease is lost or on `shutdown` (then the Lease is released).
pub async fn lead<W, F>(
    lease: Api<Lease>,
    identity: &str,
    duration: Duration,
    mut shutdown: watch::Receiver<bool>,
    work: W,
) -> Result<(), kube::Error>
where
    W: Fn(watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let elector = LeaderElector::new(lease, LEASE_NAME, identity, duration);
    loop {
        // A candidate until it holds the Lease.
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot reach the leader Lease"),
            }
            tokio::select! {
                () = tokio::time::sleep(CANDIDATE_RETRY.min(duration / 3)) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
        }
        tracing::info!(%identity, "leading");
        let (stop, stopped) = watch::channel(false);
        let working = tokio::spawn(work(stopped));
        let mut renewed = Instant::now();
        let lost = loop {
            tokio::select! {
                () = tokio::time::sleep(elector.renew_every()) => {}
                _ = shutdown.wait_for(|s| *s) => break false,
            }
            match elector.try_acquire_or_renew().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => break true,
                // Without a renewal for a whole lease, another may lead.
                Err(e) if renewed.elapsed() >= duration => {
                    tracing::warn!(error = %e, "cannot renew the leader Lease");
                    break true;
                }
                Err(e) => tracing::warn!(error = %e, "leader Lease renewal failed; retrying"),
            }
        };
        stop.send_replace(true);
        let _ = working.await;
        if !lost {
            return elector.release().await;
        }
        tracing::warn!(%identity, "lost the leader Lease: leader work stopped");
    }
}

/// A watch of the objects the operator made (they carry its label).
fn ours() -> watcher::Config {
    watcher::Config::default().labels(MANAGED_BY)
}

async fn controllers(ctx: Arc<Context>, metrics: Arc<OperatorMetrics>, stopped: watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let config = watcher::Config::default;
    let m = metrics.clone();
    // Every kind a QueueService makes is watched, so a child deleted or
    // changed by hand is put back at once, not at the next requeue. Only
    // the operator's own objects (by label) are watched and cached.
    let queues = Controller::new(Api::<QueueService>::all(client.clone()), config())
        .owns(Api::<Deployment>::all(client.clone()), ours())
        .owns(Api::<StatefulSet>::all(client.clone()), ours())
        .owns(Api::<PodDisruptionBudget>::all(client.clone()), ours())
        .owns(Api::<Service>::all(client.clone()), ours())
        .owns(Api::<Ingress>::all(client.clone()), ours())
        .owns(Api::<NetworkPolicy>::all(client.clone()), ours())
        .owns(Api::<Secret>::all(client.clone()), ours())
        .owns(Api::<ConfigMap>::all(client.clone()), ours())
        .graceful_shutdown_on(sless_runtime::shutdown::stopped(&stopped))
        .run(
            move |obj, ctx| {
                let m = m.clone();
                async move { m.timed("queueservice", queue_service::reconcile(obj, ctx)).await }
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let m = metrics;
    // The checkpoint ConfigMap, the one ConfigMap of a dataflow, carries no
    // label of ours and is not watched: its writes wake no reconcile.
    let flows = Controller::new(Api::<DataFlow>::all(client.clone()), config())
        .owns(Api::<Deployment>::all(client.clone()), ours())
        .owns(Api::<NetworkPolicy>::all(client.clone()), ours())
        .owns(Api::<Secret>::all(client), ours())
        .graceful_shutdown_on(sless_runtime::shutdown::stopped(&stopped))
        .run(
            move |obj, ctx| {
                let m = m.clone();
                async move { m.timed("dataflow", dataflow::reconcile(obj, ctx)).await }
            },
            error_policy,
            ctx,
        )
        .for_each(|_| async {});
    tokio::join!(queues, flows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reconciles_are_counted_by_controller_and_outcome() {
        let mut registry = Registry::default();
        let metrics = OperatorMetrics::register(&mut registry);
        metrics
            .timed("dataflow", async { Ok(Action::await_change()) })
            .await
            .unwrap();
        let _ = metrics.timed("dataflow", async { Err(Error::NoNamespace) }).await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"sless_operator_reconciles_total{controller="dataflow"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"sless_operator_reconcile_failures_total{controller="dataflow"} 1"#));
        assert!(text.contains(r#"sless_operator_reconcile_duration_seconds_count{controller="dataflow"} 2"#));
    }
}
