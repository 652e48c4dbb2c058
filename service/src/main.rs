//! The `sless` command line. `serve.rs` beside it wires production mode.

mod serve;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sless::dev::{Dev, DevOptions};
use sless::tenants::TenantArgs;
use sless_controlplane::config::ControlPlaneArgs;
use tracing_subscriber::EnvFilter;

/// Per-thread caches without glibc's arena locks: the gateway and the
/// engines allocate and free small buffers on every request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sless",
    version,
    about = "Managed SQS-compatible queues and data pipelines, ordered with terraform apply"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole platform in one process on this machine: REST API and
    /// local platform, with state in an embedded store. No Kubernetes, no Redis.
    Dev(Box<DevArgs>),
    /// Production mode: the worker control plane with its state in Redis and
    /// the kubernetes operator (QueueService and DataFlow controllers under a
    /// leader Lease, the DataFlow admission webhook), for several replicas.
    Serve(Box<serve::ServeArgs>),
    /// Run one SQS-compatible queue engine: a tenant's queue backend.
    Queue(QueueArgs),
    /// Run the SQS gateway: SigV4-verifying edge at /sqs/{tenant}, fed by the control plane.
    Gateway(GatewayArgs),
    /// Run one dataflow (source -> transformations -> sinks) in this process,
    /// as the kubernetes operator's Deployment does.
    Processor(ProcessorArgs),
    /// Print the CustomResourceDefinitions of QueueService and DataFlow as YAML.
    Crds(CrdsArgs),
}

#[derive(clap::Args)]
struct CrdsArgs {
    /// Write one file per CRD into this directory instead of printing them.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Args)]
struct ProcessorArgs {
    /// The dataflow spec as JSON (the operator's ConfigMap, secrets resolved).
    #[arg(long, env = "SLESS_SPEC_PATH", default_value = "/etc/dataflow/spec.json")]
    spec_path: PathBuf,
    /// Namespace of the DataFlow: of its checkpoint ConfigMap and its metrics labels.
    #[arg(long, env = "SLESS_NAMESPACE")]
    namespace: String,
    /// Name of the DataFlow.
    #[arg(long, env = "SLESS_NAME")]
    name: String,
    /// Keep the read position in this file instead of the ConfigMap
    /// dataflow-NAME-checkpoint (which needs in-cluster config or KUBECONFIG).
    #[arg(long)]
    checkpoint_file: Option<PathBuf>,
    /// The tenant's key for the positions exactly-once sinks store (64 hex
    /// digits; the operator mounts it). Without it, exactly once is refused.
    #[arg(long, env = "SLESS_POSITIONS_KEY_FILE")]
    positions_key_file: Option<PathBuf>,
    /// Where the dataflow keeps what does not fit in memory (streamed
    /// transactions of a CDC source): a directory of its own under it.
    #[arg(long, default_value = "/var/lib/sless/spill")]
    spill_dir: PathBuf,
    #[command(flatten)]
    budget: sless_dataflow::budget::BudgetArgs,
    /// Address of /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics_listen: SocketAddr,
    /// Where connectors may connect (default: anywhere but loopback,
    /// link-local, unspecified and multicast) and read TLS files (default
    /// /etc/dataflow-tls, where the operator mounts them).
    #[command(flatten)]
    egress: sless_dataflow::egress::EgressArgs,
}

#[derive(clap::Args)]
struct GatewayArgs {
    /// Address to serve tenants on.
    #[arg(long, default_value = "127.0.0.1:9324")]
    listen: SocketAddr,
    /// Public base URL clients use (default http://LISTEN).
    #[arg(long)]
    public_url: Option<String>,
    /// Control plane URL: http://HOST:PORT (loopback) or https://HOST:PORT
    /// (mTLS). Several, comma-separated, are tried in turn: only the
    /// leading `sless serve` replica serves.
    #[arg(long, env = "SLESS_CONTROL_PLANE", value_delimiter = ',', required = true)]
    control_plane: Vec<String>,
    /// This worker's id; under mTLS it must match the certificate's SPIFFE id.
    #[arg(long, env = "SLESS_WORKER_ID")]
    worker_id: String,
    /// PEM CA of the control plane's certificate (mTLS).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// PEM client certificate (mTLS).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// PEM client key (mTLS).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// Server name to verify in the control plane's certificate (default: its host).
    #[arg(long)]
    tls_domain: Option<String>,
    /// Connections from tenants' clients: caps and timeouts.
    #[command(flatten)]
    limits: sless_runtime::http::ConnectionLimits,
    /// Address of /metrics (per-tenant requests by action and outcome,
    /// latency, bytes). It names tenants: keep it on an internal port.
    #[arg(long, default_value = "0.0.0.0:9091")]
    metrics_listen: SocketAddr,
    /// What one tenant may send through this gateway.
    #[command(flatten)]
    rates: sless_sqs::gateway::limits::TenantRates,
}

#[derive(clap::Args)]
struct QueueArgs {
    /// Address to serve the SQS API on.
    #[arg(long, default_value = "127.0.0.1:9324")]
    listen: SocketAddr,
    /// Keep messages durably in this directory; without it, messages live in memory only.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// When a change is acknowledged: `disk` once synced to disk (survives
    /// a crash of the machine), `process` once written to the log
    /// (survives a crash of this process; synced within 100 ms).
    #[arg(long, default_value = "disk", requires = "data_dir", value_parser = durability_arg)]
    durability: sless_model::queue_service::Durability,
    /// Account id in queue URLs and ARNs.
    #[arg(long, default_value = "000000000000")]
    account_id: String,
    /// Region in queue ARNs.
    #[arg(long, default_value = sless_sqs::DEFAULT_REGION, value_parser = sless_sqs::region_arg)]
    region: String,
    /// Public base URL of queue URLs (default: http://LISTEN).
    #[arg(long)]
    base_url: Option<String>,
    /// Serve only requests carrying this token in x-sless-engine-token (the
    /// gateway's, from the routing snapshot). Without it the engine serves
    /// anyone who reaches it: keep it on loopback or behind a network policy.
    #[arg(long, env = "SLESS_ENGINE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Every replica of this queue service and its peer address,
    /// `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`: the replicas keep the queues
    /// together and any of them serves requests (a follower passes them to
    /// the leader). Replica 1 starts the queue service; the others join it.
    #[arg(long, requires_all = ["replica_id", "data_dir", "peer_token"])]
    peers: Option<String>,
    /// This replica's id among --peers (on Kubernetes, its pod's ordinal).
    #[arg(long, env = "SLESS_REPLICA_ID", requires = "peers")]
    replica_id: Option<u64>,
    /// Address of this replica's peer port (default: its address in --peers).
    #[arg(long, requires = "peers")]
    peer_listen: Option<SocketAddr>,
    /// The token the replicas present to each other.
    #[arg(long, env = "SLESS_PEER_TOKEN", hide_env_values = true)]
    peer_token: Option<String>,
    /// On SIGTERM, how long to go on serving after the leadership is handed
    /// over, before new connections are refused: long enough for the load
    /// balancers in front (a Kubernetes Service's endpoints) to stop
    /// sending here. Then the requests in flight are answered.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    drain: std::time::Duration,
    /// End with the process of this id (`sless dev` starting its replicas):
    /// stop within a moment of its end, even by `kill -9`, never left behind.
    #[arg(long, hide = true)]
    parent_pid: Option<i32>,
}

/// The replicas `--peers` names: `1=HOST:PORT,2=HOST:PORT`.
fn parse_peers(text: &str) -> anyhow::Result<std::collections::BTreeMap<u64, String>> {
    let mut peers = std::collections::BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("--peers: {part:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .with_context(|| format!("--peers: {id:?} is not a replica id (1, 2, 3…)"))?;
        if addr
            .rsplit_once(':')
            .is_none_or(|(_, port)| port.parse::<u16>().is_err())
        {
            anyhow::bail!("--peers: {addr:?} is not HOST:PORT");
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            anyhow::bail!("--peers: replica {id} is named twice");
        }
    }
    if !peers.contains_key(&1) {
        anyhow::bail!("--peers must name replica 1, which starts the queue service");
    }
    Ok(peers)
}

#[derive(clap::Args)]
struct DevArgs {
    /// Address of the REST API.
    #[arg(long, env = "SLESS_LISTEN", default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Directory of the embedded state store; created if missing.
    #[arg(long, env = "SLESS_DATA_DIR", default_value = "sless-data")]
    data_dir: PathBuf,
    #[command(flatten)]
    tenants: TenantArgs,
    /// Tenant created on first start, whose generated token is printed at start.
    #[arg(long, default_value = "dev")]
    dev_tenant: String,
    /// Address of the SQS gateway; endpoints are http://ADDR/sqs/{tenant}.
    #[arg(long, env = "SLESS_GATEWAY_LISTEN", default_value = "127.0.0.1:9324")]
    gateway_listen: SocketAddr,
    /// Public base URL of the gateway, if clients reach it by another name.
    #[arg(long)]
    gateway_public_url: Option<String>,
    /// The region in queue ARNs. The gateway accepts signatures scoped to
    /// any region, so clients may keep their SDK's default.
    #[arg(long, default_value = sless_sqs::DEFAULT_REGION, value_parser = sless_sqs::region_arg)]
    region: String,
    /// Connections to the API and the SQS gateway: caps and timeouts (each
    /// server has its own).
    #[command(flatten)]
    limits: sless_runtime::http::ConnectionLimits,
    /// Each tenant's quotas and API rate.
    #[command(flatten)]
    tenant_limits: sless::api::limits::TenantLimits,
    /// What one tenant may send through the SQS gateway.
    #[command(flatten)]
    rates: sless_sqs::gateway::limits::TenantRates,
    #[command(flatten)]
    control_plane: ControlPlaneArgs,
    /// Where dataflows may connect (default: anywhere; dev runs on your own
    /// machine) and read TLS files (default DATA_DIR/tls).
    #[command(flatten)]
    egress: sless_dataflow::egress::EgressArgs,
    /// What dataflows may keep on disk (under DATA_DIR/spill) and hold in
    /// memory, per tenant and in all.
    #[command(flatten)]
    budget: sless_dataflow::budget::BudgetArgs,
    /// Replicas of a queue service that does not say: 1 runs its engine in
    /// this process; 3 run three `sless queue` processes that keep its
    /// queues together and go on serving when one is killed (this process
    /// starts it again).
    #[arg(long, default_value_t = 1, value_parser = replicas_arg)]
    replicas: u8,
}

fn replicas_arg(value: &str) -> Result<u8, String> {
    value
        .parse()
        .ok()
        .filter(|r| sless_model::queue_service::REPLICAS.contains(r))
        .ok_or_else(|| format!("must be 1 or 3 (got {value})"))
}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SLESS_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, not in files and log collectors.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops sless");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let control_plane = args
        .control_plane
        .validate()
        .context("invalid control plane configuration")?;
    let dev = Dev::prepare(DevOptions {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        tenants: args.tenants,
        dev_tenant: args.dev_tenant,
        control_plane,
        gateway_listen: args.gateway_listen,
        gateway_public_url: args.gateway_public_url,
        region: args.region,
        limits: args.limits,
        tenant_limits: args.tenant_limits,
        rates: args.rates,
        egress: args.egress,
        budget: args.budget,
        replicas: sless_platform::local::ReplicaOptions {
            program: Some(std::env::current_exe().context("cannot find the sless executable")?),
            default: args.replicas,
        },
    })
    .await
    .context("cannot start sless dev")?;
    let endpoint = format!("http://{}", dev.api_addr);
    // The banner is the command's output for its user, not a log line: it
    // goes to stdout once, and it is the one place the dev token is shown.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "sless dev is running\n  API:           {endpoint}/api/v1\n  SQS gateway:   {}/sqs/{{tenant}}\n  control plane: {}\n  tenant:        {}\n  token:         {}\n  data dir:      {}\n\nexport SLESS_ENDPOINT={endpoint}\nexport SLESS_TOKEN={}",
        dev.gateway_url,
        dev.control_plane_addr,
        dev.dev_tenant,
        dev.dev_token,
        args.data_dir.display(),
        dev.dev_token,
    )?;
    out.flush()?;
    drop(out);
    tracing::info!(api = %endpoint, "sless dev started");
    dev.run(shutdown_signal()).await?;
    Ok(())
}

fn durability_arg(value: &str) -> Result<sless_model::queue_service::Durability, String> {
    value.parse().map_err(|e: sless_model::FieldError| e.message)
}

/// Resolves once the process `parent` is no longer this one's parent: it
/// ended, and the orphan was handed to another. (Polled rather than
/// `PR_SET_PDEATHSIG`, which fires when the *thread* that started this
/// process ends, and a runtime's threads may come and go.)
async fn parent_gone(parent: i32) {
    use rustix::process::{Pid, getppid};
    while getppid() == Pid::from_raw(parent) {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

async fn queue(args: QueueArgs) -> anyhow::Result<()> {
    use sless_sqs::engine::Persistence;
    use sless_sqs::engine::{Engine, EngineConfig, server::EngineServer};
    let persistence = args.data_dir.as_ref().map(|d| Persistence {
        journal: d.join("queues.journal"),
        durability: args.durability,
    });
    let config = EngineConfig {
        account_id: args.account_id,
        region: args.region,
        base_url: args.base_url.unwrap_or_else(|| format!("http://{}", args.listen)),
    };
    let durability = persistence.as_ref().map(|p| p.durability.as_str());
    let replication = match (args.peers, args.replica_id, args.peer_token) {
        (Some(peers), Some(me), Some(token)) => {
            let peers = parse_peers(&peers)?;
            let own = peers
                .get(&me)
                .with_context(|| format!("--replica-id {me} is not among --peers"))?;
            let listen = match args.peer_listen {
                Some(listen) => listen,
                None => own
                    .parse()
                    .with_context(|| format!("--peer-listen is needed: {own} is not an IP address and port"))?,
            };
            Some((sless_sqs::engine::raft::Replication { me, peers, token }, listen))
        }
        _ => None,
    };
    let engine = Engine::open_replica(config, persistence.as_ref(), replication)
        .await
        .context("cannot open the queue store")?;
    if let Some(addr) = engine.peer_addr() {
        tracing::info!(addr = %addr, "serving the other replicas");
    }
    let server = EngineServer::start(engine.clone(), args.listen, args.token)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(addr = %server.addr, durability = durability.unwrap_or("memory"), "queue engine serving");
    match args.parent_pid {
        Some(parent) => tokio::select! {
            () = shutdown_signal() => {}
            () = parent_gone(parent) => {
                tracing::warn!(parent, "the process that started this one ended; stopping");
                return Ok(());
            }
        },
        None => shutdown_signal().await,
    }
    stop_queue(&engine, server, args.drain).await;
    Ok(())
}

/// Stops a queue engine without failing a client's call: a leader hands
/// its leadership over, the engine serves `drain` longer (followers pass
/// requests to the new leader), then refuses new connections and answers
/// the requests in flight, and its replica stops last.
async fn stop_queue(
    engine: &sless_sqs::engine::Engine,
    server: sless_sqs::engine::server::EngineServer,
    drain: std::time::Duration,
) {
    match engine.hand_over().await {
        Some(leader) => tracing::info!(leader, "stopping; replica {leader} leads the queue service"),
        None => tracing::info!("stopping"),
    }
    tokio::time::sleep(drain).await;
    server.stop().await;
    engine.stop().await;
}

async fn gateway(args: GatewayArgs) -> anyhow::Result<()> {
    use sless_sqs::gateway::Gateway;
    use sless_sqs::gateway::worker::{ClientTls, WorkerConfig};
    let tls = match (args.tls_ca, args.tls_cert, args.tls_key) {
        (None, None, None) => None,
        (Some(ca), Some(cert), Some(key)) => Some(ClientTls::Files {
            ca,
            cert,
            key,
            domain: args.tls_domain,
        }),
        _ => anyhow::bail!("mTLS needs all of --tls-ca, --tls-cert and --tls-key"),
    };
    // A wrong path fails now, not at every connection.
    if let Some(tls) = &tls {
        tls.load().await.map_err(|e| anyhow::anyhow!("{}", e.message()))?;
    }
    let worker = WorkerConfig {
        control_planes: args.control_plane,
        worker_id: args.worker_id,
        instance_id: sless_runtime::random::id(),
        tls,
    };
    let gateway = Gateway::bind(args.listen, args.public_url, worker)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?
        .with_limits(args.limits.within(sless_runtime::http::descriptor_limit() / 4 * 3))
        .with_tenant_rates(args.rates);
    let metrics = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_listen))?;
    let metrics =
        tokio::spawn(axum::serve(metrics, sless_sqs::gateway::metrics_router(gateway.counters())).into_future());
    tracing::info!(addr = %gateway.addr, public_url = gateway.public_url(), metrics = %args.metrics_listen, "SQS gateway serving");
    gateway.run(shutdown_signal()).await?;
    metrics.abort();
    Ok(())
}

async fn processor(args: ProcessorArgs) -> anyhow::Result<()> {
    use sless_dataflow::processor::{ProcessorOptions, run};
    run(
        ProcessorOptions {
            spec_path: args.spec_path,
            namespace: args.namespace,
            name: args.name,
            checkpoint_file: args.checkpoint_file,
            positions_key_file: args.positions_key_file,
            spill_dir: args.spill_dir,
            budget: args.budget,
            metrics_listen: args.metrics_listen,
            egress: sless_dataflow::egress::EgressPolicy::restricted(
                args.egress.allow,
                args.egress.deny,
                Some(
                    args.egress
                        .tls_dir
                        .unwrap_or_else(|| PathBuf::from(sless_dataflow::egress::PROCESSOR_TLS_DIR)),
                ),
            ),
        },
        shutdown_signal(),
    )
    .await
    .context("dataflow processor failed")
}

fn crds(args: CrdsArgs) -> anyhow::Result<()> {
    use sless_operator::crd::{definitions, render};
    let mut stdout = std::io::stdout().lock();
    for (file, crd) in definitions() {
        let yaml = render(&crd)?;
        match &args.out {
            Some(dir) => {
                let path = dir.join(file);
                std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
            }
            None => stdout.write_all(yaml.as_bytes())?,
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    sless_runtime::tls::install_default_provider();
    let descriptors = sless_runtime::http::raise_descriptor_limit();
    tracing::debug!(descriptors, "descriptor limit");
    match cli.command {
        Command::Dev(args) => dev(*args).await,
        Command::Serve(args) => serve::run(*args, shutdown_signal()).await,
        Command::Queue(args) => queue(args).await,
        Command::Gateway(args) => gateway(args).await,
        Command::Processor(args) => processor(args).await,
        Command::Crds(args) => crds(args),
    }
}

#[cfg(test)]
mod tests {
    /// Every subcommand's flags are consistent: two flattened groups giving
    /// one argument id (a field name they share) would panic `sless dev`
    /// at start in a debug build.
    #[test]
    fn the_command_line_is_consistent() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
