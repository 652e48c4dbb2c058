//! ReportRuntime throughput through the control plane service on Redis,
//! as a ratio to `redis-benchmark` running the same Lua script with the same
//! keys and arguments, in the same run. Goal: ratio >= 0.7.
//!
//! Run: `cargo bench -p sless --bench report_runtime`
//! (Redis at `SLESS_BENCH_REDIS_URL`, default redis://127.0.0.1:6379).

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sless_controlplane::model::{ProxyCounters, RuntimeReport};
use sless_controlplane::proto::{AccessKey, RoutingSnapshot, TenantRoute};
use sless_controlplane::publisher::{self, Debounce};
use sless_controlplane::store::ControlStore;
use sless_controlplane::store::redis::RedisStore;
use sless_controlplane::worker::{AckCommand, RegisterCommand, Service, ServiceConfig};
use tokio_stream::StreamExt;

const CALLS: usize = 20_000;
const CONCURRENCY: usize = 50;
const ROUNDS: usize = 3;
const COUNTERS: usize = 10;

fn counters() -> Vec<ProxyCounters> {
    (0..COUNTERS)
        .map(|i| ProxyCounters {
            proxy_id: format!("tenant-{i:03}"),
            requests: 1000 + i as i64,
            errors: 3,
            in_flight: 2,
            bytes_in: 123_456,
            bytes_out: 654_321,
        })
        .collect()
}

async fn service_rate(service: &Arc<Service>, command: &RuntimeReport) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (service, command) = (service.clone(), command.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..CALLS / CONCURRENCY {
                service.report_runtime(command.clone()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(CALLS as f64 / started.elapsed().as_secs_f64())
}

fn redis_benchmark_rate(host: &str, port: &str, sha: &str, keys: &[String], args: &[String]) -> anyhow::Result<f64> {
    let output = std::process::Command::new("redis-benchmark")
        .args([
            "-h",
            host,
            "-p",
            port,
            "-c",
            &CONCURRENCY.to_string(),
            "-n",
            &CALLS.to_string(),
            "--csv",
        ])
        .arg("EVALSHA")
        .arg(sha)
        .arg(keys.len().to_string())
        .args(keys)
        .args(args)
        .output()
        .context("run redis-benchmark (package redis-tools)")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text.lines().last().unwrap_or_default();
    let rps = last
        .split(',')
        .nth(1)
        .map(|f| f.trim_matches('"').to_owned())
        .unwrap_or_default();
    rps.parse()
        .with_context(|| format!("cannot read redis-benchmark output: {text}"))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("SLESS_BENCH_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let hostport = url.trim_start_matches("redis://").trim_end_matches('/');
    let (host, port) = hostport.split_once(':').unwrap_or((hostport, "6379"));
    let namespace = format!("bench-{}", sless_runtime::random::id());
    let store = Arc::new(RedisStore::new(&url, &namespace, Duration::from_secs(2))?);
    let epoch = store.claim_ownership().await?;
    let (publisher, snapshots) = publisher::spawn(store.clone(), epoch, Debounce::default());
    let config = ServiceConfig::default();
    let service = Service::new(store.clone(), config.clone(), snapshots);

    // One worker, registered and acknowledged through the service.
    let session_id = service
        .register(RegisterCommand {
            supported_protocol_version: 1,
            worker_id: "bench-worker".into(),
            instance_id: "bench".into(),
            zone: String::new(),
            labels: vec![],
        })
        .await?
        .session_id;
    publisher.publish(RoutingSnapshot {
        routes: vec![TenantRoute {
            tenant: "tenant-000".into(),
            backend_address: "127.0.0.1:9324".into(),
            keys: vec![AccessKey {
                access_key_id: "AK".into(),
                secret_access_key: "SK".into(),
            }],
            ..Default::default()
        }],
    });
    let mut deliveries = service.watch("bench-worker".into(), session_id.clone())?;
    let Some(Ok(delivery)) = deliveries.next().await else {
        bail!("no snapshot delivered");
    };
    let id = delivery.snapshot.id;
    service
        .acknowledge(AckCommand {
            worker_id: "bench-worker".into(),
            session_id: session_id.clone(),
            version: id.version,
            ownership_epoch: id.ownership_epoch,
            checksum: id.checksum.to_vec(),
            applied: true,
            error_code: String::new(),
            error_message: String::new(),
            nonce: delivery.nonce,
        })
        .await?;

    // The same full report each call: an idempotent replay runs the whole
    // script (all checks and the write) every time, in both measurements.
    let command = RuntimeReport {
        worker_id: "bench-worker".into(),
        session_id: session_id.clone(),
        sequence: 1,
        snapshot_version: id.version,
        ownership_epoch: id.ownership_epoch,
        counters: counters(),
    };
    service.report_runtime(command.clone()).await?;
    let (keys, args) = store.replace_runtime_call(&command, config.session_ttl, config.max_stale_age);
    let client = redis::Client::open(url.as_str())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RedisStore::REPLACE_RUNTIME_SCRIPT)
        .query_async(&mut conn)
        .await?;

    let (mut best_service, mut best_baseline) = (0f64, 0f64);
    for round in 1..=ROUNDS {
        let baseline = redis_benchmark_rate(host, port, &sha, &keys, &args)?;
        let through_service = service_rate(&service, &command).await?;
        println!("round {round}: service {through_service:.0} ops/s, redis-benchmark {baseline:.0} ops/s");
        best_service = best_service.max(through_service);
        best_baseline = best_baseline.max(baseline);
    }
    println!(
        "ReportRuntime ({CALLS} calls, {CONCURRENCY} concurrent, {COUNTERS} counters): \
         service {best_service:.0} ops/s / redis-benchmark {best_baseline:.0} ops/s = ratio {:.2} (goal >= 0.70)",
        best_service / best_baseline
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}:*"))
        .query_async(&mut conn)
        .await?;
    if !keys.is_empty() {
        redis::cmd("DEL").arg(&keys).query_async::<()>(&mut conn).await?;
    }
    Ok(())
}
