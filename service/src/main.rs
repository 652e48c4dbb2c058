//! The `sless` command line.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sless::dev::{Dev, DevOptions};
use tracing_subscriber::EnvFilter;

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
    Dev(DevArgs),
    /// Run the production control plane against a Kubernetes cluster and Redis.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct DevArgs {
    /// Address of the REST API.
    #[arg(long, env = "SLESS_LISTEN", default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Directory of the embedded state store; created if missing.
    #[arg(long, env = "SLESS_DATA_DIR", default_value = "sless-data")]
    data_dir: PathBuf,
    /// TOML file of tenants: [[tenant]] id = "acme", token = "..." (or token_sha256 = "<hex>").
    #[arg(long, env = "SLESS_TENANTS_FILE")]
    tenants_file: Option<PathBuf>,
    /// Extra tenant as ID=TOKEN (token at least 16 characters); repeatable.
    #[arg(long = "tenant", value_name = "ID=TOKEN")]
    tenants: Vec<String>,
    /// Tenant created on first start, whose generated token is printed at start.
    #[arg(long, default_value = "dev")]
    dev_tenant: String,
}

#[derive(clap::Args)]
struct ServeArgs {}

fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("SLESS_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
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
    let dev = Dev::prepare(DevOptions {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        tenants_file: args.tenants_file,
        tenant_flags: args.tenants,
        dev_tenant: args.dev_tenant,
    })
    .await
    .context("cannot start sless dev")?;
    let endpoint = format!("http://{}", dev.api_addr);
    // The banner is the command's output for its user, not a log line: it
    // goes to stdout once, and it is the one place the dev token is shown.
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "sless dev is running\n  API:      {endpoint}/api/v1\n  tenant:   {}\n  token:    {}\n  data dir: {}\n\nexport SLESS_ENDPOINT={endpoint}\nexport SLESS_TOKEN={}",
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Dev(args) => dev(args).await,
        Command::Serve(ServeArgs {}) => {
            anyhow::bail!("the kubernetes platform is not part of this build yet; use `sless dev`")
        }
    }
}
