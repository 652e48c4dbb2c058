//! `sless serve`: production mode. On every replica the REST API on custom
//! resources, the DataFlow admission webhook and the internal metrics port;
//! on the leader also the operator's controllers and the worker control
//! plane (state in Redis) with the route publisher; until `shutdown`
//! resolves.

use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use sless::tenants::TenantArgs;
use sless_controlplane::config::ControlPlaneArgs;
use sless_controlplane::publisher::Debounce;
use sless_controlplane::store::redis::RedisStore;
use sless_operator::config::OperatorConfig;
use sless_operator::runner::{LeaderWork, OperatorMetrics, OperatorOptions};
use sless_runtime::shutdown::stopped;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Redis holding the control plane state shared by all replicas.
    #[arg(long, env = "SLESS_REDIS_URL")]
    redis_url: String,
    /// Prefix of every Redis key (before the `{activity}` hash tag), to share one Redis.
    #[arg(long, env = "SLESS_REDIS_NAMESPACE", default_value = "sless")]
    redis_namespace: String,
    /// Deadline of each Redis call.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    redis_timeout: std::time::Duration,
    #[command(flatten)]
    control_plane: ControlPlaneArgs,
    #[command(flatten)]
    operator: OperatorArgs,
}

#[derive(clap::Args)]
pub struct OperatorArgs {
    /// Address of the REST API (/api/v1), backed by the custom resources.
    #[arg(long, env = "SLESS_LISTEN", default_value = "0.0.0.0:9090")]
    listen: SocketAddr,
    /// Connections to the REST API: caps and timeouts. Behind an Ingress
    /// every connection comes from its proxies: raise or turn off
    /// (0) the per-client cap there.
    #[command(flatten)]
    limits: sless_runtime::http::ConnectionLimits,
    /// Each tenant's quotas and API rate.
    #[command(flatten)]
    tenant_limits: sless::api::limits::TenantLimits,
    /// A tenant's objects live in the namespace sless-fn-ID.
    #[command(flatten)]
    tenants: TenantArgs,
    /// Kubeconfig of the cluster; without it the in-cluster service account
    /// (or ~/.kube/config) is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Public host of the SQS endpoints: https://HOST/sqs/{tenant}.
    #[arg(long, env = "SQS_EXTERNAL_HOST", default_value = "sqs.kube5s.ru")]
    sqs_external_host: String,
    /// The region of queue ARNs. The gateway takes signatures scoped to any
    /// region, so clients may keep their SDK's default.
    #[arg(long, env = "SLESS_REGION", default_value = sless_sqs::DEFAULT_REGION, value_parser = sless_sqs::region_arg)]
    region: String,
    /// The SQS host's certificate: a kubernetes.io/tls Secret in
    /// --sqs-tls-namespace, copied into each tenant namespace for its
    /// Ingress. Endpoints say https:// only while it exists; without it,
    /// http://.
    #[arg(long, env = "SQS_TLS_SECRET")]
    sqs_tls_secret: Option<String>,
    /// Namespace of --sqs-tls-secret (the operator's own).
    #[arg(long, env = "SQS_TLS_NAMESPACE", default_value = "sless-system")]
    sqs_tls_namespace: String,
    /// The sless image, which tenants' queue engines (sless queue) and the
    /// dataflow processors (sless processor) run. Seed 001 names it
    /// PROCESSOR_IMAGE; SLESS_IMAGE is read when that is unset. Default
    /// ghcr.io/kube5s/sless:latest.
    #[arg(long, env = "PROCESSOR_IMAGE")]
    image: Option<String>,
    /// Image of a queue engine whose QueueService asks for `engine: elasticmq`.
    #[arg(
        long,
        env = "SQS_ELASTICMQ_IMAGE",
        default_value = "softwaremill/elasticmq-native:1.7.1"
    )]
    elasticmq_image: String,
    /// DNS name of the SQS gateway's Service, where tenant Ingresses route.
    #[arg(
        long,
        env = "SLESS_GATEWAY_HOST",
        default_value = "sless-gateway.sless-system.svc.cluster.local"
    )]
    gateway_host: String,
    /// Namespace of the gateway pods, the only pods that may reach engines.
    #[arg(long, env = "SLESS_GATEWAY_NAMESPACE", default_value = "sless-system")]
    gateway_namespace: String,
    /// Create a tenant's namespace sless-fn-TENANT when missing (false where
    /// the platform provisions tenant namespaces).
    #[arg(long, env = "SLESS_CREATE_NAMESPACES", default_value_t = true, action = clap::ArgAction::Set)]
    create_namespaces: bool,
    /// The cluster's own networks (Pods, Services, nodes) as CIDRs: no
    /// dataflow processor reaches them (each refuses them itself, and its
    /// NetworkPolicy leaves them out); its own namespace stays reachable.
    /// Repeatable, or comma-separated in the environment.
    #[arg(
        long = "cluster-network",
        value_name = "CIDR",
        env = "SLESS_CLUSTER_NETWORKS",
        value_delimiter = ','
    )]
    cluster_networks: Vec<sless_dataflow::egress::Cidr>,
    /// Namespace of the leader-election Lease (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "sless-system")]
    lease_namespace: String,
    /// This replica's identity in the Lease (default: a random id).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Address of the DataFlow admission webhook (HTTPS); served when
    /// --webhook-cert and --webhook-key are given.
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_listen: SocketAddr,
    /// PEM certificate of the webhook.
    #[arg(long, requires = "webhook_key")]
    webhook_cert: Option<PathBuf>,
    /// PEM private key of the webhook.
    #[arg(long, requires = "webhook_cert")]
    webhook_key: Option<PathBuf>,
    /// Address of /metrics (the API's and the operator's; it names tenants
    /// and dataflows, so keep it on an internal port) and /healthz. The
    /// REST API listener serves no metrics.
    #[arg(long, default_value = "0.0.0.0:9091")]
    metrics_listen: SocketAddr,
}

/// Production mode: the control plane on Redis, the operator on the
/// cluster, the webhook and the operator's metrics, until a signal.
pub async fn run(args: ServeArgs, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let config = args
        .control_plane
        .validate()
        .context("invalid control plane configuration")?;
    let store =
        RedisStore::new(&args.redis_url, &args.redis_namespace, args.redis_timeout).context("invalid --redis-url")?;
    let op = args.operator;
    let kube_config = match &op.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no Kubernetes configuration: run in a cluster, set KUBECONFIG or pass --kubeconfig")?,
    };
    let client = kube::Client::try_from(kube_config).context("cannot make a Kubernetes client")?;
    let mut tenants = sless::tenants::Tenants::default();
    op.tenants.load_into(&mut tenants)?;
    let tenants = std::sync::Arc::new(sless::tenants::Directory::new(tenants));
    let mut operator_metrics = None;
    let api_state = sless::api::AppState {
        platform: std::sync::Arc::new(sless_platform::kubernetes::KubePlatform::new(
            client.clone(),
            op.create_namespaces,
            op.region.clone(),
        )),
        tenants: tenants.clone(),
        metrics: sless::api::metrics::Metrics::with(|registry| {
            operator_metrics = Some(OperatorMetrics::register(registry));
        }),
        limits: op.tenant_limits,
        rate: std::sync::Arc::default(),
    };
    let metrics = operator_metrics.context("the operator's metrics were registered")?;
    let api_listener = tokio::net::TcpListener::bind(op.listen)
        .await
        .with_context(|| format!("cannot listen on {}", op.listen))?;
    let store: std::sync::Arc<dyn sless_controlplane::store::ControlStore> = std::sync::Arc::new(store);
    let probes = probes(store.clone(), client.clone());
    // Only the leader serves gateways and publishes routes (under a fresh
    // ownership epoch); followers serve the REST API and the webhook.
    let while_leading: LeaderWork = {
        let client = client.clone();
        std::sync::Arc::new(move |stopped| {
            Box::pin(sless_operator::routes::serve_control_plane(
                config.clone(),
                store.clone(),
                client.clone(),
                Debounce::default(),
                stopped,
            ))
        })
    };

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let operator = tokio::spawn(sless_operator::runner::run(
        client,
        OperatorOptions {
            config: OperatorConfig {
                sqs_external_host: op.sqs_external_host,
                region: op.region,
                image: image(op.image, std::env::var("SLESS_IMAGE").ok()),
                elasticmq_image: op.elasticmq_image,
                sqs_tls_secret: op.sqs_tls_secret,
                sqs_tls_namespace: op.sqs_tls_namespace,
                gateway_host: op.gateway_host,
                gateway_namespace: op.gateway_namespace,
                create_namespaces: op.create_namespaces,
                cluster_networks: op.cluster_networks,
                operator_namespace: op.lease_namespace.clone(),
            },
            lease_namespace: op.lease_namespace,
            identity: op.pod_name.unwrap_or_else(sless_runtime::random::id),
            while_leading: Some(while_leading),
        },
        metrics,
        stop_rx.clone(),
    ));
    let webhook = match (&op.webhook_cert, &op.webhook_key) {
        (Some(cert), Some(key)) => {
            let webhook = sless_operator::webhook::Webhook::bind(op.webhook_listen, cert, key)
                .await
                .context("cannot start the admission webhook")?;
            tracing::info!(addr = %webhook.addr, "DataFlow admission webhook serving");
            Some(tokio::spawn(webhook.serve(stopped(&stop_rx))))
        }
        _ => None,
    };
    let reloading = tokio::spawn(sless::tenants::reload(
        op.tenants.clone(),
        tenants,
        sless::tenants::RELOAD_EVERY,
        stop_rx.clone(),
    ));
    // The API's and the operator's metrics name tenants: internal port only.
    let app = sless::api::metrics_router(api_state.clone()).merge(probes);
    let listener = tokio::net::TcpListener::bind(op.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", op.metrics_listen))?;
    let metrics_server = tokio::spawn(
        axum::serve(listener, app)
            .with_graceful_shutdown(stopped(&stop_rx))
            .into_future(),
    );
    let api = tokio::spawn(sless_runtime::http::serve(
        api_listener,
        sless::api::router(api_state),
        // Half the process's descriptors; the rest for the operator's,
        // the control plane's and Redis's connections.
        op.limits.within(sless_runtime::http::descriptor_limit() / 2),
        stopped(&stop_rx),
    ));
    tracing::info!(api = %op.listen, metrics = %op.metrics_listen, "sless serve running");
    tokio::spawn(async move {
        shutdown.await;
        stop.send_replace(true);
    });
    operator.await?.context("operator failed")?;
    if let Some(webhook) = webhook {
        webhook.await??;
    }
    metrics_server.await??;
    api.await?;
    reloading.await?;
    Ok(())
}

/// The probes of a replica. `/readyz` (the Deployment's readiness) asks
/// only the Kubernetes API, all the REST API and the webhook need: Redis
/// holds only the control plane's state, so while it is down the API, the
/// console and the webhook stay in their Services; the control plane
/// answers `Unavailable` and gateways serve from their tables.
/// `/readyz/control-plane` says whether Redis answers, for monitoring.
/// Reasons stay in the log.
fn probes(store: std::sync::Arc<dyn sless_controlplane::store::ControlStore>, client: kube::Client) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    let ready = move || {
        let client = client.clone();
        async move {
            match client.apiserver_version().await {
                Ok(_) => (StatusCode::OK, "ready"),
                Err(e) => {
                    tracing::warn!(error = %e, "not ready: the Kubernetes API does not answer");
                    (StatusCode::SERVICE_UNAVAILABLE, "kubernetes api unreachable")
                }
            }
        }
    };
    let control_plane = move || {
        let store = store.clone();
        async move {
            match store.ping().await {
                Ok(()) => (StatusCode::OK, "ready"),
                Err(e) => {
                    tracing::warn!(error = %e, "the control plane cannot serve: Redis does not answer");
                    (StatusCode::SERVICE_UNAVAILABLE, "redis unreachable")
                }
            }
        }
    };
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/readyz/control-plane", get(control_plane))
}

/// The image of `--image`/PROCESSOR_IMAGE, else of its alias SLESS_IMAGE,
/// else the published one.
fn image(flag: Option<String>, alias: Option<String>) -> String {
    flag.or(alias)
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| "ghcr.io/kube5s/sless:latest".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use sless_controlplane::store::redis::RedisStore;
    use sless_testkit::redis::RedisServer;

    use super::{image, probes};

    /// A Kubernetes API that answers only `/version` (all readiness asks).
    async fn api_server() -> (String, tokio::task::JoinHandle<()>) {
        let app = axum::Router::new().route(
            "/version",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({
                    "major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "", "gitTreeState": "",
                    "buildDate": "", "goVersion": "", "compiler": "", "platform": "linux/amd64"
                }))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        (
            url,
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }),
        )
    }

    async fn status(app: &axum::Router, path: &str) -> u16 {
        use tower::ServiceExt;
        let request = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
        app.clone().oneshot(request).await.unwrap().status().as_u16()
    }

    /// A Redis outage takes no replica out of the API's and the webhook's
    /// Services: readiness stays, the control plane's own probe says why
    /// it cannot serve, and recovers with Redis. Only the Kubernetes API
    /// going away makes a replica unready.
    #[tokio::test]
    async fn redis_down_leaves_the_replica_ready_and_only_the_control_plane_unavailable() {
        sless_runtime::tls::install_default_provider();
        let mut redis = RedisServer::start();
        let store = RedisStore::new(&redis.url(), "probes", Duration::from_millis(500)).unwrap();
        let (url, api) = api_server().await;
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let app = probes(Arc::new(store), client);
        assert_eq!(
            (
                status(&app, "/readyz").await,
                status(&app, "/readyz/control-plane").await
            ),
            (200, 200)
        );
        redis.kill();
        assert_eq!(
            (
                status(&app, "/readyz").await,
                status(&app, "/readyz/control-plane").await
            ),
            (200, 503)
        );
        redis.restart();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while status(&app, "/readyz/control-plane").await != 200 {
            assert!(
                std::time::Instant::now() < deadline,
                "the control plane never saw Redis back"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        api.abort();
        let _ = api.await;
        assert_eq!(
            status(&app, "/readyz").await,
            503,
            "without the Kubernetes API nothing can serve"
        );
    }

    #[test]
    fn the_seeds_processor_image_wins_over_its_alias() {
        let some = |s: &str| Some(s.to_owned());
        assert_eq!(image(some("seed/proc:1"), some("alias:2")), "seed/proc:1");
        assert_eq!(image(None, some("alias:2")), "alias:2");
        assert_eq!(image(None, None), "ghcr.io/kube5s/sless:latest");
    }
}
