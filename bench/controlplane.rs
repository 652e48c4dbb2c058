//! The worker control plane at scale: one replica (memory store, plaintext
//! loopback) in a child process, 10,000 simulated workers in this one,
//! sharing the machine's two cores:
//!
//! 1. all register and watch; a new snapshot (100 routes) is published and
//!    the time until each worker has it is taken: p50, p99, max (goal: p99
//!    under 1 s);
//! 2. the replica's RSS per idle watcher (its RSS before any worker as the
//!    baseline) and its CPU per delivery, beside go-control-plane's
//!    published ~3.9 µs per SotW response;
//! 3. a reconnect storm: every worker drops its connection and all come
//!    back at once; errors other than `Unavailable` (retried) are counted
//!    (goal: none), and the time until all have the snapshot again.
//!
//! Run: `cargo bench -p sless --bench controlplane`.

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

#[path = "support.rs"]
mod support;

// The replica runs in this binary's child: the allocator `sless` has.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use sless_controlplane::proto::worker_control_plane_client::WorkerControlPlaneClient;
use sless_controlplane::proto::{self, AccessKey, RoutingSnapshot, TenantRoute};
use sless_runtime::sync::Unpoisoned;
use tonic::transport::{Channel, Endpoint};

const WORKERS: usize = 10_000;
/// Streams per HTTP/2 connection stay under the server's limit of 256.
const PER_CONNECTION: usize = 200;
const ROUTES: usize = 100;

/// The child: serves a control plane, prints its address, publishes a new
/// snapshot for every line read from stdin, and says so.
async fn serve() -> anyhow::Result<()> {
    let mut config = support::control_plane_config()?;
    // Simulated workers do not heartbeat: their sessions outlive the run.
    config.service.session_ttl = Duration::from_secs(3600);
    config.service.stream_poll_interval = Duration::from_secs(1);
    let control_plane = sless_controlplane::server::ControlPlane::start(
        config,
        Arc::new(sless_controlplane::store::memory::MemoryStore::new()),
        sless_controlplane::publisher::Debounce::default(),
    )
    .await?;
    println!("{}", control_plane.local_addr);
    let publisher = control_plane.publisher.clone();
    tokio::spawn(control_plane.serve(std::future::pending()));
    // Publishing is synchronous: a thread reads the parent's lines.
    tokio::task::spawn_blocking(move || {
        for (generation, _line) in (1u64..).zip(std::io::stdin().lock().lines()) {
            publisher.publish(RoutingSnapshot {
                routes: (0..ROUTES)
                    .map(|t| TenantRoute {
                        tenant: format!("tenant-{t}"),
                        backend_address: format!("10.0.{}.{}:9324", generation % 250, t % 250),
                        backend_token: format!("token-{generation}-{t}"),
                        keys: vec![AccessKey {
                            access_key_id: format!("SQSAKtenant{t}_AAAAAAAA"),
                            secret_access_key: "c2VjcmV0LWtleS1vZi10aGUtYmVuY2htYXJr".into(),
                        }],
                        ..Default::default()
                    })
                    .collect(),
            });
            println!("published");
        }
    })
    .await?;
    Ok(())
}

/// The control-plane child process.
struct Server {
    process: support::Process,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    addr: String,
}

impl Server {
    fn start() -> anyhow::Result<Self> {
        let mut process = support::Process::spawn(
            Command::new(std::env::current_exe()?)
                .env("SLESS_BENCH_ROLE", "control-plane")
                .env("SLESS_LOG", "error")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        )?;
        let stdin = process.child().stdin.take().context("stdin")?;
        let mut stdout = std::io::BufReader::new(process.child().stdout.take().context("stdout")?);
        let mut addr = String::new();
        stdout.read_line(&mut addr)?;
        Ok(Self {
            process,
            stdin,
            stdout,
            addr: format!("http://{}", addr.trim()),
        })
    }

    /// Publishes a new snapshot; when it was published.
    fn publish(&mut self) -> anyhow::Result<Instant> {
        writeln!(self.stdin, "publish")?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        anyhow::ensure!(line.trim() == "published", "the control plane said {line:?}");
        Ok(Instant::now())
    }
}

/// What the workers saw: the newest version each holds, and when it came.
struct Seen {
    version: Vec<AtomicU64>,
    at_us: Vec<AtomicU64>,
    /// Errors by gRPC code, and the Unavailable ones retried.
    unavailable: AtomicU64,
    other_errors: AtomicU64,
    /// The other errors' codes and a message of each.
    other_kinds: std::sync::Mutex<std::collections::BTreeMap<String, (u64, String)>>,
    epoch: Instant,
}

impl Seen {
    fn new() -> Self {
        Self {
            version: (0..WORKERS).map(|_| AtomicU64::new(0)).collect(),
            at_us: (0..WORKERS).map(|_| AtomicU64::new(0)).collect(),
            unavailable: AtomicU64::new(0),
            other_errors: AtomicU64::new(0),
            other_kinds: Default::default(),
            epoch: Instant::now(),
        }
    }

    /// Waits until every worker holds `version` or newer; the delays after
    /// `since`, sorted.
    async fn all_have(&self, version: u64, since: Instant, limit: Duration) -> anyhow::Result<Vec<Duration>> {
        let deadline = Instant::now() + limit;
        loop {
            let behind = self
                .version
                .iter()
                .filter(|v| v.load(Ordering::Relaxed) < version)
                .count();
            if behind == 0 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "{behind} workers lack version {version}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let base = since.duration_since(self.epoch);
        let mut delays: Vec<Duration> = self
            .at_us
            .iter()
            .map(|at| Duration::from_micros(at.load(Ordering::Relaxed)).saturating_sub(base))
            .collect();
        delays.sort();
        Ok(delays)
    }
}

/// One simulated worker: registers, watches and acknowledges what it gets
/// until `stop`; an `Unavailable` start is retried after a jittered pause.
async fn worker(
    mut client: WorkerControlPlaneClient<Channel>,
    i: usize,
    seen: Arc<Seen>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let worker_id = format!("bench-worker-{i}");
    let mut pause = Duration::from_millis(100);
    loop {
        let session = async {
            let registration = client
                .register_worker(proto::RegisterWorkerRequest {
                    supported_protocol_version: 1,
                    worker_id: worker_id.clone(),
                    instance_id: format!("instance-{i}"),
                    zone: String::new(),
                    labels: Vec::new(),
                })
                .await?
                .into_inner();
            let mut stream = client
                .watch_snapshots(proto::WatchSnapshotsRequest {
                    worker_id: worker_id.clone(),
                    session_id: registration.session_id.clone(),
                })
                .await?
                .into_inner();
            while let Some(delivery) = stream.message().await? {
                let snapshot = delivery.snapshot.clone().unwrap_or_default();
                seen.at_us[i].store(seen.epoch.elapsed().as_micros() as u64, Ordering::Relaxed);
                seen.version[i].store(snapshot.version, Ordering::Relaxed);
                client
                    .acknowledge_snapshot(proto::AcknowledgeSnapshotRequest {
                        worker_id: worker_id.clone(),
                        session_id: registration.session_id.clone(),
                        snapshot: Some(snapshot),
                        applied: true,
                        error_code: String::new(),
                        error_message: String::new(),
                        nonce: delivery.nonce,
                    })
                    .await?;
            }
            Ok::<_, tonic::Status>(())
        };
        let outcome = tokio::select! {
            outcome = session => outcome,
            _ = stop.wait_for(|s| *s) => return,
        };
        match outcome {
            Err(status) if status.code() == tonic::Code::Unavailable => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Err(status) => {
                seen.other_errors.fetch_add(1, Ordering::Relaxed);
                let mut kinds = seen.other_kinds.lock_unpoisoned();
                let entry = kinds
                    .entry(format!("{:?}", status.code()))
                    .or_insert_with(|| (0, status.message().to_owned()));
                entry.0 += 1;
            }
            Ok(()) => {}
        }
        let jitter = Duration::from_millis(u64::from(rand::random::<u16>() % 100));
        tokio::select! {
            () = tokio::time::sleep(pause + jitter) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Starts every worker over fresh connections.
async fn start_workers(
    addr: &str,
    seen: &Arc<Seen>,
) -> anyhow::Result<(tokio::sync::watch::Sender<bool>, Vec<tokio::task::JoinHandle<()>>)> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::with_capacity(WORKERS);
    let mut channel = None;
    for i in 0..WORKERS {
        if i % PER_CONNECTION == 0 {
            channel = Some(Endpoint::from_shared(addr.to_owned())?.connect_lazy());
        }
        let client = WorkerControlPlaneClient::new(channel.clone().context("channel")?);
        tasks.push(tokio::spawn(worker(client, i, seen.clone(), stopped.clone())));
    }
    Ok((stop, tasks))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn bench() -> anyhow::Result<()> {
    let mut server = Server::start()?;
    let pid = server.process.id();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = support::rss_kib(pid)?;
    let seen = Arc::new(Seen::new());

    let first = server.publish()?;
    let started = Instant::now();
    let (stop, tasks) = start_workers(&server.addr, &seen).await?;
    let joined = seen.all_have(1, first, Duration::from_secs(120)).await?;
    let join_time = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_idle = support::rss_kib(pid)?;

    let cpu_before = support::cpu_time(pid);
    let published = server.publish()?;
    let delays = seen.all_have(2, published, Duration::from_secs(60)).await?;
    let cpu = support::cpu_time(pid) - cpu_before;
    println!(
        "{WORKERS} workers registered and watching in {:.1} s (last first snapshot {:.0} ms after publishing)",
        join_time.as_secs_f64(),
        ms(*joined.last().context("no worker")?)
    );
    println!(
        "a new snapshot ({ROUTES} routes) to all {WORKERS}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (goal: p99 < 1000 ms)",
        ms(percentile(&delays, 0.5)),
        ms(percentile(&delays, 0.99)),
        ms(*delays.last().context("no worker")?)
    );
    println!(
        "control plane: {:.1} KiB RSS per idle watcher ({:.0} MB idle with {WORKERS}, {:.0} MB with none); \
         {:.1} µs CPU per delivery with its ACK vs go-control-plane's ~3.9 µs per SotW response = {:.1}x",
        rss_idle.saturating_sub(rss_before) as f64 / WORKERS as f64,
        rss_idle as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        cpu.as_secs_f64() * 1e6 / WORKERS as f64,
        cpu.as_secs_f64() * 1e6 / WORKERS as f64 / 3.9
    );

    // The storm: every connection drops, every worker comes back at once.
    stop.send_replace(true);
    for task in tasks {
        let _ = task.await;
    }
    // Errors of the first join, apart from the storm's.
    let join_errors = (
        seen.unavailable.swap(0, Ordering::Relaxed),
        seen.other_errors.swap(0, Ordering::Relaxed),
        std::mem::take(&mut *seen.other_kinds.lock_unpoisoned()),
    );
    println!(
        "first join: {} Unavailable (retried), {} other errors {:?}",
        join_errors.0, join_errors.1, join_errors.2
    );
    let storm_start = Instant::now();
    let (stop, tasks) = start_workers(&server.addr, &seen).await?;
    // The next version reaches each worker only through its new session.
    let version = 3;
    server.publish()?;
    let back = seen.all_have(version, storm_start, Duration::from_secs(120)).await?;
    println!(
        "reconnect storm of all {WORKERS} at once: all resynced in {:.1} s (p99 {:.0} ms); {} Unavailable \
         (retried), {} other errors (goal: none) {:?}",
        storm_start.elapsed().as_secs_f64(),
        ms(percentile(&back, 0.99)),
        seen.unavailable.load(Ordering::Relaxed),
        seen.other_errors.load(Ordering::Relaxed),
        seen.other_kinds.lock_unpoisoned()
    );
    stop.send_replace(true);
    for task in tasks {
        let _ = task.await;
    }
    drop(server);
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    if std::env::var("SLESS_BENCH_ROLE").as_deref() == Ok("control-plane") {
        return runtime.block_on(serve());
    }
    runtime.block_on(bench())
}
