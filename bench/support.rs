//! What the benchmarks share: child processes stopped on drop, free ports,
//! readiness waits, RSS, and a control plane that routes one tenant.

#![allow(dead_code)] // each benchmark uses part of it

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use sless_controlplane::proto::{AccessKey, RoutingSnapshot, TenantRoute};
use sless_controlplane::publisher::Debounce;
use sless_controlplane::server::ControlPlane;
use sless_controlplane::store::memory::MemoryStore;

pub const ACCESS: &str = "SQSAKbench_AAAAAAAA";
pub const SECRET: &str = "YmVuY2gtc2VjcmV0LWtleS0wMTIzNDU2Nzg5";
pub const REGION: &str = "us-east-1";
pub const ENGINE_TOKEN: &str = "bench-engine-token";
/// What the bench's replicas present to each other (16 bytes at least).
pub const PEER_TOKEN: &str = "bench-peer-token-0123456789";

/// A child process in a process group of its own, stopped with everything
/// it started (nginx's workers) when dropped, on success or failure: a
/// worker left running would hold the bench's output pipe open, and
/// whatever reads that output would wait for ever.
pub struct Process(Child);

impl Process {
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        command.process_group(0).spawn().map(Self)
    }

    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The group's id is the leader's pid: SIGTERM lets nginx stop its
        // workers; whatever is left after 2 s is killed.
        let group = format!("-{}", self.0.id());
        let signal = |name: &str| {
            let _ = Command::new("kill")
                .args([name, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        signal("-TERM");
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        signal("-KILL");
        let _ = self.0.wait();
    }
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `url` answers 2xx.
pub async fn wait_up(url: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        if reqwest::get(url).await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("{url} did not come up")
}

pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
}

/// `pid` and its descendants (nginx's workers are its master's children).
fn process_tree(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    let mut i = 0;
    while i < all.len() {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", all[i]))
            .into_iter()
            .flatten()
            .flatten();
        for task in tasks {
            let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            all.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
        i += 1;
    }
    all
}

/// The numeric fields of `/proc/{pid}/stat` after the command's closing
/// parenthesis (the state is the first): the 3rd field of the whole line
/// onwards.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// CPU time (user + system) `pid` and its descendants have used so far.
pub fn cpu_time(pid: u32) -> Duration {
    process_tree(pid).into_iter().map(own_cpu_time).sum()
}

/// The CPU time `pid` itself has used, without its children.
pub fn own_cpu_time(pid: u32) -> Duration {
    // Linux's USER_HZ: 100 on every architecture it runs on here.
    const TICKS: f64 = 100.0;
    // utime and stime, the 14th and 15th fields of the whole line.
    let ticks = stat_fields(pid).and_then(|fields| Some(fields.get(10)? + fields.get(11)?));
    Duration::from_secs_f64(ticks.unwrap_or(0) as f64 / TICKS)
}

/// The parent of `pid`, the 4th field of its stat line.
pub fn parent(pid: u32) -> Option<u32> {
    u32::try_from(*stat_fields(pid)?.first()?).ok()
}

/// The settings of a plaintext loopback control plane on a free port.
pub fn control_plane_config() -> anyhow::Result<sless_controlplane::config::ControlPlaneConfig> {
    Ok(sless_controlplane::config::ControlPlaneArgs {
        listen: "127.0.0.1:0".parse()?,
        heartbeat_interval: Duration::from_secs(10),
        session_ttl: Duration::from_secs(35),
        max_stale_age: Duration::from_secs(30),
        max_message_bytes: 4 << 20,
        max_runtime_counters: 100_000,
        tls: sless_controlplane::config::TlsMode::Disabled,
        server_cert: None,
        server_key: None,
        client_ca: None,
        spiffe_trust_domain: None,
        spiffe_environment: None,
    }
    .validate()?)
}

/// A plaintext loopback control plane (memory store) serving in this
/// process, routing tenant `bench` with [`ACCESS`] to `engine`.
pub async fn control_plane_routing(engine: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    control_plane_routing_to(&engine.to_string()).await
}

/// As [`control_plane_routing`], to `backend`: one engine's address, or
/// the replicas' with commas between.
pub async fn control_plane_routing_to(backend: &str) -> anyhow::Result<std::net::SocketAddr> {
    let mut config = control_plane_config()?;
    config.service.stream_poll_interval = Duration::from_millis(100);
    let control_plane = ControlPlane::start(config, Arc::new(MemoryStore::new()), Debounce::default()).await?;
    let addr = control_plane.local_addr;
    control_plane.publisher.publish(RoutingSnapshot {
        routes: vec![TenantRoute {
            tenant: "bench".into(),
            backend_address: backend.to_owned(),
            backend_token: ENGINE_TOKEN.into(),
            keys: vec![AccessKey {
                access_key_id: ACCESS.into(),
                secret_access_key: SECRET.into(),
            }],
            ..Default::default()
        }],
    });
    tokio::spawn(control_plane.serve(std::future::pending()));
    Ok(addr)
}

/// A `sless queue` engine process taking only [`ENGINE_TOKEN`], keeping
/// its journal in a directory with a durability (`disk`, `process`) if given.
pub async fn engine(journal: Option<(&Path, &str)>) -> anyhow::Result<(Process, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_sless"));
    command
        .args(["queue", "--listen", &addr.to_string(), "--token", ENGINE_TOKEN])
        .env("SLESS_LOG", "warn");
    if let Some((dir, durability)) = journal {
        command.arg("--data-dir").arg(dir).args(["--durability", durability]);
    }
    let process = Process::spawn(&mut command)?;
    wait_up(&format!("http://{addr}/health")).await?;
    Ok((process, addr))
}

/// Three `sless queue` replicas of one queue service, each keeping its
/// files in `dir`/1, 2, 3 with `durability`, taking only [`ENGINE_TOKEN`];
/// returned once all three are voters and agree on a leader. Their SQS
/// addresses, replica 1's (which started the service) first.
pub async fn engine_replicas(dir: &Path, durability: &str) -> anyhow::Result<Vec<(Process, SocketAddr)>> {
    const IDS: [u64; 3] = [1, 2, 3];
    let mut sqs = Vec::new();
    let mut peers = Vec::new();
    for _ in IDS {
        sqs.push(SocketAddr::from(([127, 0, 0, 1], free_port()?)));
        peers.push(SocketAddr::from(([127, 0, 0, 1], free_port()?)));
    }
    let members = IDS
        .iter()
        .zip(&peers)
        .map(|(id, peer)| format!("{id}={peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut replicas = Vec::new();
    for (i, id) in IDS.into_iter().enumerate() {
        let data = dir.join(id.to_string());
        std::fs::create_dir_all(&data).with_context(|| format!("cannot make {}", data.display()))?;
        let process = Process::spawn(
            Command::new(env!("CARGO_BIN_EXE_sless"))
                .args(["queue", "--listen", &sqs[i].to_string()])
                .arg("--data-dir")
                .arg(&data)
                .args(["--durability", durability])
                .args(["--peers", &members, "--replica-id", &id.to_string()])
                // Secrets in the environment, as the platform passes them.
                .env("SLESS_ENGINE_TOKEN", ENGINE_TOKEN)
                .env("SLESS_PEER_TOKEN", PEER_TOKEN)
                .env("SLESS_LOG", "warn"),
        )?;
        replicas.push((process, sqs[i]));
    }
    for (_, addr) in &replicas {
        wait_up(&format!("http://{addr}/health")).await?;
    }
    wait_voters(&mut replicas, &peers, &IDS).await?;
    Ok(replicas)
}

/// Waits until every replica's peer port reports `ids` as the voters, no
/// change of them under way, and the same leader: replica 1 starts the
/// service alone and its leader adds the others, so until then a send
/// would be committed by fewer replicas than measured.
async fn wait_voters(replicas: &mut [(Process, SocketAddr)], peers: &[SocketAddr], ids: &[u64]) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut leaders = Vec::new();
        let mut last = String::new();
        for peer in peers {
            let status = http
                .get(format!("http://{peer}/raft/status"))
                .header("x-sless-peer-token", PEER_TOKEN)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status);
            let status: Value = match status {
                Ok(response) => response.json().await.unwrap_or_default(),
                Err(e) => Value::String(e.to_string()),
            };
            if status["voters"] == json!(ids) && status["joint"] == json!(false) {
                leaders.push(status["leader"].as_u64());
            } else {
                last = format!("{peer}: {status}");
            }
        }
        if leaders.len() == peers.len() && leaders[0].is_some() && leaders.iter().all(|l| *l == leaders[0]) {
            return Ok(());
        }
        for (process, addr) in replicas.iter_mut() {
            if let Some(status) = process.child().try_wait()? {
                bail!("the replica serving {addr} ended ({status})");
            }
        }
        if std::time::Instant::now() > deadline {
            bail!("the replicas are not all voters under one leader after 60 s; last seen {last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A `sless gateway` process fed by a control plane in this process.
pub async fn gateway(engine: SocketAddr) -> anyhow::Result<(Process, String)> {
    gateway_to(&engine.to_string()).await
}

/// As [`gateway`], to `backend`: one engine's address, or the replicas'
/// with commas between (the gateway asks them in turn).
pub async fn gateway_to(backend: &str) -> anyhow::Result<(Process, String)> {
    let control_plane = control_plane_routing_to(backend).await?;
    let port = free_port()?;
    let process = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["gateway", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--control-plane", &format!("http://{control_plane}")])
            .args(["--worker-id", "bench-gateway"])
            .env("SLESS_LOG", "warn"),
    )?;
    let url = format!("http://127.0.0.1:{port}");
    wait_up(&format!("{url}/healthz")).await?;
    Ok((process, format!("{url}/sqs/bench")))
}

/// The queue `name` on `engine`, made directly; its URL.
pub async fn create_queue(engine: SocketAddr, name: &str) -> anyhow::Result<String> {
    let response = reqwest::Client::new()
        .post(format!("http://{engine}/"))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", "AmazonSQS.CreateQueue")
        .header("x-sless-engine-token", ENGINE_TOKEN)
        .body(json!({"QueueName": name}).to_string())
        .send()
        .await?;
    let value: Value = response.json().await?;
    Ok(value["QueueUrl"].as_str().context("no QueueUrl")?.to_owned())
}

/// A tenant of [`dev`]: its API token, its Ready in-memory queue service's
/// endpoint and keys, and the URL of its queue `bench`.
pub struct DevTenant {
    pub token: String,
    pub endpoint: String,
    pub access: String,
    pub secret: String,
    pub queue: String,
}

/// `sless dev` (with `flags`, its data in `dir`) serving `tenants`, each
/// with a Ready in-memory queue service `main` holding a queue `bench`;
/// the process, its REST API's base URL and the tenants.
pub async fn dev(dir: &Path, flags: &[&str], tenants: &[&str]) -> anyhow::Result<(Process, String, Vec<DevTenant>)> {
    let (api, gateway) = (free_port()?, free_port()?);
    let token = |tenant: &str| format!("bench-dev-token-{tenant}-abcdefgh");
    let mut command = Command::new(env!("CARGO_BIN_EXE_sless"));
    command
        .args(["dev", "--listen", &format!("127.0.0.1:{api}")])
        .args(["--control-plane-listen", "127.0.0.1:0"])
        .args(["--gateway-listen", &format!("127.0.0.1:{gateway}")])
        .arg("--data-dir")
        .arg(dir)
        .args(flags)
        .env("SLESS_LOG", "warn")
        .stdout(Stdio::null());
    for tenant in tenants {
        command.args(["--tenant", &format!("{tenant}={}", token(tenant))]);
    }
    let process = Process::spawn(&mut command)?;
    let api = format!("http://127.0.0.1:{api}/api/v1");
    wait_up(&format!("{api}/../../healthz")).await?;
    let mut ready = Vec::new();
    for tenant in tenants {
        ready.push(dev_tenant(&api, token(tenant)).await?);
    }
    Ok((process, api, ready))
}

async fn dev_tenant(api: &str, token: String) -> anyhow::Result<DevTenant> {
    let client = reqwest::Client::new();
    client
        .post(format!("{api}/queue-services"))
        .bearer_auth(&token)
        .json(&json!({"name": "main", "persistence": false}))
        .send()
        .await?
        .error_for_status()?;
    let view = loop {
        let view: Value = client
            .get(format!("{api}/queue-services/main"))
            .bearer_auth(&token)
            .send()
            .await?
            .json()
            .await?;
        if view["phase"] == "Ready" {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let text = |key: &str| view[key].as_str().map(str::to_owned).context("queue service view");
    let (endpoint, access, secret) = (text("endpoint")?, text("accessKey")?, text("secretKey")?);
    let body = json!({"QueueName": "bench"}).to_string();
    let headers = sless_sqs::sigv4::signed_json_headers(
        &endpoint,
        "CreateQueue",
        body.as_bytes(),
        &access,
        &secret,
        sless_sqs::DEFAULT_REGION,
    )
    .context("signing")?;
    let created: Value = client
        .post(&endpoint)
        .headers(headers)
        .body(body)
        .send()
        .await?
        .json()
        .await?;
    let queue = created["QueueUrl"].as_str().context("no QueueUrl")?.to_owned();
    Ok(DevTenant {
        token,
        endpoint,
        access,
        secret,
        queue,
    })
}
