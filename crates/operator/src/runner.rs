//! Runs the operator in `sless serve`: competes for the leader Lease, and
//! while it holds it runs the QueueService and DataFlow controllers
//! (`kube::runtime::Controller`, watching the children they own). Counts
//! reconciles, failures and their duration for `/metrics`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
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

use super::config::OperatorConfig;
use super::context::{Context, Error, error_policy};
use super::crd::dataflow::DataFlow;
use super::crd::queue_service::QueueService;
use super::leader::LeaderElector;
use super::{dataflow, queue_service};

const LEASE_NAME: &str = "sless-operator";
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
}

/// Runs until `shutdown` is set; gives the Lease up on the way out.
pub async fn run(
    client: Client,
    opts: OperatorOptions,
    metrics: Arc<OperatorMetrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), kube::Error> {
    let elector = LeaderElector::new(
        Api::namespaced(client.clone(), &opts.lease_namespace),
        LEASE_NAME,
        &opts.identity,
        LEASE_DURATION,
    );
    let ctx = Arc::new(Context::new(client, opts.config, Some(opts.identity.clone())));
    loop {
        // A candidate until it holds the Lease.
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot reach the leader Lease"),
            }
            tokio::select! {
                () = tokio::time::sleep(CANDIDATE_RETRY) => {}
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            }
        }
        tracing::info!(identity = %opts.identity, "leading: controllers start");
        metrics.leader.set(1);
        let (stop, stopped) = watch::channel(false);
        let controllers = tokio::spawn(controllers(ctx.clone(), metrics.clone(), stopped));
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
                Err(e) if renewed.elapsed() >= LEASE_DURATION => {
                    tracing::warn!(error = %e, "cannot renew the leader Lease");
                    break true;
                }
                Err(e) => tracing::warn!(error = %e, "leader Lease renewal failed; retrying"),
            }
        };
        stop.send_replace(true);
        let _ = controllers.await;
        metrics.leader.set(0);
        if !lost {
            return elector.release().await;
        }
        tracing::warn!(identity = %opts.identity, "lost the leader Lease: controllers stopped");
    }
}

async fn controllers(ctx: Arc<Context>, metrics: Arc<OperatorMetrics>, stopped: watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let config = watcher::Config::default;
    let m = metrics.clone();
    let queues = Controller::new(Api::<QueueService>::all(client.clone()), config())
        .owns(Api::<Deployment>::all(client.clone()), config())
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
    let flows = Controller::new(Api::<DataFlow>::all(client.clone()), config())
        .owns(Api::<Deployment>::all(client.clone()), config())
        .owns(Api::<ConfigMap>::all(client), config())
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
