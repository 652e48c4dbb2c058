//! `sless dev`: the whole platform in one process, state in a data dir.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use tokio::net::TcpListener;

use sless_runtime::shutdown::stopped;

use crate::api::{self, AppState, metrics::Metrics};
use crate::tenants::{Directory, TenantArgs, TenantConfigError, Tenants};
use sless_controlplane::config::ControlPlaneConfig;
use sless_controlplane::local_pki::LocalPki;
use sless_controlplane::publisher::Debounce;
use sless_controlplane::server::{ControlPlane, ServerError};
use sless_controlplane::store::memory::MemoryStore;
use sless_platform::local::GatewayLink;
use sless_platform::local::LocalPlatform;
use sless_platform::local::db::{Store, StoreError};
use sless_sqs::gateway::Gateway;
use sless_sqs::gateway::proxy::InProcessEngines;
use sless_sqs::gateway::worker::{ClientTls, WorkerConfig};

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Tenants(#[from] TenantConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("API server failed: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    ControlPlane(#[from] ServerError),
    #[error("SQS gateway failed: {0}")]
    Gateway(std::io::Error),
    #[error(
        "sless dev makes its control plane's certificates at each start; --control-plane-tls mtls is for sless serve"
    )]
    OwnTls,
    #[error(transparent)]
    Pki(#[from] sless_controlplane::local_pki::PkiError),
}

/// The gateway's worker id in dev: queue services are Ready once it ACKs.
pub const GATEWAY_WORKER_ID: &str = "dev-gateway";

#[derive(Debug, Clone)]
pub struct DevOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Tenants besides the dev tenant.
    pub tenants: TenantArgs,
    /// Tenant created on first start, with a generated token kept in the store.
    pub dev_tenant: String,
    /// The worker control plane; in dev its state is in memory.
    pub control_plane: ControlPlaneConfig,
    /// Address of the SQS gateway.
    pub gateway_listen: SocketAddr,
    /// Public base URL of the gateway (default `http://ADDR`).
    pub gateway_public_url: Option<String>,
    /// The region in queue ARNs.
    pub region: String,
    /// Connections to the API and to the gateway: caps and timeouts.
    pub limits: sless_runtime::http::ConnectionLimits,
    /// Each tenant's quotas and API rate.
    pub tenant_limits: crate::api::limits::TenantLimits,
    /// What one tenant may send through the SQS gateway.
    pub rates: sless_sqs::gateway::limits::TenantRates,
    /// Where dataflows may connect: everything by default (dev runs on the
    /// developer's own machine), less `--egress-deny`.
    pub egress: sless_dataflow::egress::EgressArgs,
    /// What dataflows may keep on disk and hold in memory.
    pub budget: sless_dataflow::budget::BudgetArgs,
    /// How queue engines of several replicas run, and how many a queue
    /// service gets when it does not say.
    pub replicas: sless_platform::local::ReplicaOptions,
}

/// A prepared instance: the store is open and the port is bound.
pub struct Dev {
    pub api_addr: SocketAddr,
    pub dev_tenant: String,
    pub dev_token: String,
    pub control_plane_addr: SocketAddr,
    /// Public base URL of the SQS gateway.
    pub gateway_url: String,
    control_plane: ControlPlane,
    gateway: Gateway,
    listener: TcpListener,
    limits: sless_runtime::http::ConnectionLimits,
    platform: Arc<LocalPlatform>,
    state: AppState,
}

const DEV_TOKEN_SETTING: &str = "dev-tenant-token";

fn random_token() -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sless_runtime::random::bytes::<32>())
}

impl Dev {
    pub async fn prepare(opts: DevOptions) -> Result<Self, DevError> {
        let store = Store::open(&opts.data_dir).await?;
        // The dev tenant's token is generated once and kept, so a restart
        // does not invalidate the environment of a running terraform.
        let dev_token = store.setting_or_insert(DEV_TOKEN_SETTING, random_token()).await?;
        let mut tenants = Tenants::default();
        tenants.add(&opts.dev_tenant, &dev_token)?;
        opts.tenants.load_into(&mut tenants)?;
        let listener = TcpListener::bind(opts.listen).await.map_err(|source| DevError::Bind {
            addr: opts.listen,
            source,
        })?;
        let api_addr = listener.local_addr().map_err(DevError::Serve)?;
        // mTLS on loopback too, with certificates of this run only: the
        // snapshots carry every tenant's keys.
        let mut config = opts.control_plane;
        if config.tls.is_some() {
            return Err(DevError::OwnTls);
        }
        let pki = LocalPki::new(GATEWAY_WORKER_ID)?;
        config.tls = Some(pki.server);
        config.identity = pki.identity;
        let control_plane = ControlPlane::start(config, Arc::new(MemoryStore::new()), Debounce::default()).await?;
        let gateway = Gateway::bind(
            opts.gateway_listen,
            opts.gateway_public_url,
            WorkerConfig {
                control_planes: vec![format!("https://{}", control_plane.local_addr)],
                worker_id: GATEWAY_WORKER_ID.into(),
                instance_id: sless_runtime::random::id(),
                tls: Some(ClientTls::Fixed(pki.worker)),
            },
        )
        .await
        .map_err(DevError::Gateway)?;
        // The process's descriptors are shared: a quarter each for the
        // API's, the gateway's and the engines' connections, the rest for
        // journals, the store and the dataflows' connections.
        let share = sless_runtime::http::descriptor_limit() / 4;
        let limits = opts.limits.within(share);
        // The engines run in this process: the gateway calls them directly.
        let engines = InProcessEngines::default();
        let gateway = gateway
            .with_in_process_engines(engines.clone())
            .with_limits(limits)
            .with_tenant_rates(opts.rates);
        let gateway_url = gateway.public_url().to_owned();
        let egress = sless_dataflow::egress::EgressPolicy::dev(
            opts.egress.allow,
            opts.egress.deny,
            Some(opts.egress.tls_dir.unwrap_or_else(|| opts.data_dir.join("tls"))),
        );
        let platform = LocalPlatform::new(
            store,
            opts.data_dir.clone(),
            GatewayLink {
                publisher: control_plane.publisher.clone(),
                published: control_plane.service.published(),
                control: control_plane.service.store(),
                worker_id: GATEWAY_WORKER_ID.into(),
                public_url: gateway_url.clone(),
                region: opts.region,
                engines,
                engine_connections: sless_sqs::engine::server::connections(share),
            },
            Arc::new(egress),
            sless_dataflow::budget::Budgets::new(opts.data_dir.join("spill"), opts.budget),
            opts.replicas,
        );
        let state = AppState {
            platform: platform.clone(),
            tenants: Arc::new(Directory::new(tenants)),
            metrics: Metrics::new(),
            limits: opts.tenant_limits,
            rate: Arc::default(),
        };
        Ok(Self {
            api_addr,
            dev_tenant: opts.dev_tenant,
            dev_token,
            control_plane_addr: control_plane.local_addr,
            gateway_url,
            control_plane,
            gateway,
            listener,
            limits,
            platform,
            state,
        })
    }

    /// Serves until `shutdown` resolves, then drains in-flight requests.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<(), DevError> {
        self.platform.reconcile_now().await;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // The control plane stops last: its worker, the gateway, would
        // otherwise see it go and try to reconnect while stopping.
        let (stop_cp_tx, stop_cp_rx) = tokio::sync::watch::channel(false);
        let reconciler = tokio::spawn(self.platform.run(stopped(&stop_rx)));
        let control_plane = tokio::spawn(self.control_plane.serve(stopped(&stop_cp_rx)));
        let gateway = tokio::spawn(self.gateway.run(stopped(&stop_rx)));
        let app = api::router(self.state.clone()).merge(api::metrics_router(self.state));
        sless_runtime::http::serve(self.listener, app, self.limits, async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
        .await;
        let _ = reconciler.await;
        let gateway = gateway.await;
        let _ = stop_cp_tx.send(true);
        match gateway {
            Ok(result) => result.map_err(DevError::Gateway)?,
            Err(e) => tracing::error!(error = %e, "gateway task failed"),
        }
        match control_plane.await {
            Ok(result) => result?,
            Err(e) => tracing::error!(error = %e, "control plane task failed"),
        }
        Ok(())
    }
}
