//! SQS data-plane benchmarks, each a ratio to a baseline of the same run:
//!
//! 1. queue engine send+receive+delete rate vs moto_server (PyPI `moto[server]`)
//!    on this machine (goal >= 10x);
//! 2. throughput through the SigV4 gateway vs direct engine access (goal >= 0.85),
//!    with the p50 latency the gateway adds.
//!
//! Idle RSS per tenant is in `density.rs`.
//!
//! Run: `cargo bench -p sless --bench sqs` (needs python3 with moto[server]).

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

#[path = "support.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use sless_sqs::ENGINE_TOKEN as ENGINE_TOKEN_HEADER;
use sless_sqs::client::{Client, MAX_ANSWER_BYTES};
use sless_sqs::engine::server::EngineServer;
use sless_sqs::engine::{Engine, EngineConfig};
use sless_sqs::gateway::Gateway;
use sless_sqs::gateway::worker::WorkerConfig;
use support::{ACCESS, ENGINE_TOKEN, Process, REGION, SECRET, free_port, wait_up};

const WORKERS: usize = 16;
const CYCLES_PER_WORKER: usize = 150;

/// The one SQS client, signing as an SDK signs. Direct engine calls carry
/// the engine's token, as the gateway's do; the gateway and moto ignore it
/// from clients.
fn client() -> anyhow::Result<Client> {
    let token = HeaderMap::from_iter([(
        HeaderName::from_static(ENGINE_TOKEN_HEADER),
        HeaderValue::from_static(ENGINE_TOKEN),
    )]);
    let http = reqwest::Client::builder().default_headers(token).build()?;
    Ok(Client::new(http, ACCESS, SECRET, REGION))
}

async fn call(client: &Client, endpoint: &str, action: &str, body: Value) -> anyhow::Result<Value> {
    client
        .call(endpoint, action, &body, MAX_ANSWER_BYTES)
        .await
        .with_context(|| format!("{action} failed"))
}

/// send + receive + delete cycles per second with `WORKERS` concurrent clients.
async fn cycle_rate(endpoint: &str) -> anyhow::Result<f64> {
    let client = client()?;
    let queue = call(&client, endpoint, "CreateQueue", json!({"QueueName": "bench"})).await?["QueueUrl"]
        .as_str()
        .context("no QueueUrl")?
        .to_owned();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..WORKERS {
        let (client, endpoint, queue) = (client.clone(), endpoint.to_owned(), queue.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..CYCLES_PER_WORKER {
                call(
                    &client,
                    &endpoint,
                    "SendMessage",
                    json!({"QueueUrl": queue, "MessageBody": format!("m{i}")}),
                )
                .await?;
                let got = call(
                    &client,
                    &endpoint,
                    "ReceiveMessage",
                    json!({"QueueUrl": queue, "MaxNumberOfMessages": 1}),
                )
                .await?;
                if let Some(handle) = got["Messages"][0]["ReceiptHandle"].as_str() {
                    call(
                        &client,
                        &endpoint,
                        "DeleteMessage",
                        json!({"QueueUrl": queue, "ReceiptHandle": handle}),
                    )
                    .await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok((WORKERS * CYCLES_PER_WORKER) as f64 / started.elapsed().as_secs_f64())
}

/// Median latency of sequential SendMessage calls.
async fn p50_latency(endpoint: &str) -> anyhow::Result<Duration> {
    let client = client()?;
    let queue = call(&client, endpoint, "CreateQueue", json!({"QueueName": "latency"})).await?["QueueUrl"]
        .as_str()
        .context("no QueueUrl")?
        .to_owned();
    let mut samples = Vec::new();
    for i in 0..500 {
        let t = Instant::now();
        call(
            &client,
            endpoint,
            "SendMessage",
            json!({"QueueUrl": queue, "MessageBody": format!("l{i}")}),
        )
        .await?;
        samples.push(t.elapsed());
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

async fn engine_vs_moto() -> anyhow::Result<()> {
    let (ours, moto) = (free_port()?, free_port()?);
    let _engine = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["queue", "--listen", &format!("127.0.0.1:{ours}")])
            .env("SLESS_LOG", "warn"),
    )?;
    let _moto = Process::spawn(
        Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &moto.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .context("python3 -m moto.server (pip install 'moto[server]')")?;
    let (ours, moto) = (format!("http://127.0.0.1:{ours}"), format!("http://127.0.0.1:{moto}"));
    wait_up(&format!("{ours}/health")).await?;
    wait_up(&format!("{moto}/moto-api/")).await?;
    let moto_rate = cycle_rate(&moto).await?;
    let our_rate = cycle_rate(&ours).await?;
    println!(
        "engine send+receive+delete: sless {our_rate:.0} cycles/s, moto_server {moto_rate:.0} cycles/s \
         = {:.1}x (goal >= 10x)",
        our_rate / moto_rate
    );
    Ok(())
}

async fn gateway_vs_direct() -> anyhow::Result<()> {
    let engine = Engine::in_memory(EngineConfig {
        account_id: "bench".into(),
        region: REGION.into(),
        base_url: "http://unused".into(),
    });
    // As in sless dev: the engine takes only its gateway's token.
    let engine_server = EngineServer::start(engine, "127.0.0.1:0".parse()?, Some(ENGINE_TOKEN.into())).await?;
    let control_plane = support::control_plane_routing(engine_server.addr).await?;
    let gateway = Gateway::bind(
        "127.0.0.1:0".parse()?,
        None,
        WorkerConfig {
            control_planes: vec![format!("http://{control_plane}")],
            worker_id: "bench-gateway".into(),
            instance_id: "bench".into(),
            tls: None,
        },
    )
    .await?;
    let gateway_url = gateway.public_url().to_owned();
    tokio::spawn(gateway.run(std::future::pending()));
    wait_up(&format!("{gateway_url}/healthz")).await?;
    let direct = format!("http://{}", engine_server.addr);
    let through = format!("{gateway_url}/sqs/bench");
    let direct_rate = cycle_rate(&direct).await?;
    let gateway_rate = cycle_rate(&through).await?;
    let (direct_p50, gateway_p50) = (p50_latency(&direct).await?, p50_latency(&through).await?);
    println!(
        "gateway: {gateway_rate:.0} cycles/s through the gateway, {direct_rate:.0} direct = ratio {:.2} (goal >= 0.85); \
         p50 SendMessage {:.0} µs vs {:.0} µs direct: +{:.0} µs",
        gateway_rate / direct_rate,
        gateway_p50.as_secs_f64() * 1e6,
        direct_p50.as_secs_f64() * 1e6,
        (gateway_p50.as_secs_f64() - direct_p50.as_secs_f64()) * 1e6
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    engine_vs_moto().await?;
    gateway_vs_direct().await?;
    Ok(())
}
