//! Runs the real `sless` binary on a loopback port for black-box tests.

pub mod kafka;
pub mod pg;
pub mod pg_tls;
pub mod sqs;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

pub use sless_testkit::TempDir;

pub const TOKEN_A: &str = "tenant-a-token-0123456789";
pub const TOKEN_B: &str = "tenant-b-token-0123456789";

/// Sends SIGTERM and waits (at most 20 s) for the process to exit.
pub fn terminate(child: &mut Child) -> ExitStatus {
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "SIGTERM ignored");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A running `sless dev`, killed on drop.
pub struct DevServer {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// The generated token of the `dev` tenant.
    pub dev_token: String,
    /// `host:port` of the worker control plane.
    pub control_plane: String,
}

impl DevServer {
    /// Starts `sless dev` on a free port with tenants `a` and `b`.
    pub fn start(data_dir: &Path) -> Self {
        Self::start_with_gateway(data_dir, "127.0.0.1:0")
    }

    /// As [`Self::start`], with the SQS gateway on `gateway` (to keep its
    /// address across a restart).
    pub fn start_with_gateway(data_dir: &Path, gateway: &str) -> Self {
        Self::start_with(data_dir, gateway, &[])
    }

    /// As [`Self::start_with_gateway`], with more flags of `sless dev`.
    pub fn start_with(data_dir: &Path, gateway: &str, flags: &[&str]) -> Self {
        Self::start_in(Command::new(env!("CARGO_BIN_EXE_sless")), data_dir, gateway, flags)
    }

    /// As [`Self::start`], allowed `descriptors` open files (util-linux's
    /// prlimit, which execs it: the child is `sless` itself).
    pub fn start_with_descriptors(data_dir: &Path, descriptors: u64) -> Self {
        let mut command = Command::new("prlimit");
        command
            .arg(format!("--nofile={descriptors}:{descriptors}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_sless"));
        Self::start_in(command, data_dir, "127.0.0.1:0", &[])
    }

    fn start_in(mut command: Command, data_dir: &Path, gateway: &str, flags: &[&str]) -> Self {
        let mut child = command
            .args([
                "dev",
                "--listen",
                "127.0.0.1:0",
                "--control-plane-listen",
                "127.0.0.1:0",
                "--gateway-listen",
                gateway,
                "--data-dir",
            ])
            .arg(data_dir)
            .args(["--tenant", &format!("a={TOKEN_A}"), "--tenant", &format!("b={TOKEN_B}")])
            .args(flags)
            .env(
                "SLESS_LOG",
                std::env::var("SLESS_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sless");
        let stdout = child.stdout.take().unwrap();
        let (mut endpoint, mut dev_token, mut control_plane) = (None, None, None);
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(v) = line.trim().strip_prefix("control plane:") {
                control_plane = Some(v.trim().to_owned());
            }
            if let Some(v) = line.strip_prefix("export SLESS_ENDPOINT=") {
                endpoint = Some(v.to_owned());
            }
            if let Some(v) = line.strip_prefix("export SLESS_TOKEN=") {
                dev_token = Some(v.to_owned());
                break;
            }
        }
        Self {
            child,
            endpoint: endpoint.expect("banner has SLESS_ENDPOINT"),
            dev_token: dev_token.expect("banner has SLESS_TOKEN"),
            control_plane: control_plane.expect("banner has the control plane address"),
        }
    }

    /// The process's resident memory, in bytes.
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status");
        kib * 1024
    }

    /// The process's soft limit of open files.
    pub fn descriptor_limit(&self) -> usize {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    }

    /// How many descriptors the process holds open.
    pub fn open_descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .unwrap()
            .count()
    }

    /// The loopback TCP ports the process listens on (its API, gateway,
    /// control plane and each engine's), from /proc.
    pub fn listening_ports(&self) -> Vec<u16> {
        let pid = self.child.id();
        let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter_map(|target| {
                let target = target.to_string_lossy().into_owned();
                Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
            })
            .collect();
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap();
        let mut ports: Vec<u16> = table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // State 0A is LISTEN; the inode is the tenth field.
                if fields.get(3) != Some(&"0A") || !inodes.contains(*fields.get(9)?) {
                    return None;
                }
                let (_, port) = fields.get(1)?.split_once(':')?;
                u16::from_str_radix(port, 16).ok()
            })
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The process id of `sless dev`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        terminate(&mut self.child)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.endpoint)
    }

    pub fn client(&self, token: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            base: self.endpoint.clone(),
            token: token.to_owned(),
        }
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An authenticated JSON client of one tenant.
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let json = if text.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
        };
        (status, json)
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::POST, path, Some(body)).await
    }

    /// Creates a dataflow, which must be accepted (201).
    pub async fn create_dataflow(&self, spec: serde_json::Value) {
        let (status, body) = self.post("/api/v1/dataflows", spec).await;
        assert_eq!(status, 201, "{body}");
    }

    /// The dataflow's view once its phase is `phase`; panics with the last
    /// view after `within`.
    pub async fn wait_for_phase(&self, name: &str, phase: &str, within: std::time::Duration) -> serde_json::Value {
        let deadline = std::time::Instant::now() + within;
        loop {
            let view = self.get(&format!("/api/v1/dataflows/{name}")).await.1;
            if view["phase"] == phase {
                return view;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} never became {phase}: {view}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    pub async fn put(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::PATCH, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (u16, serde_json::Value) {
        self.send(reqwest::Method::DELETE, path, None).await
    }
}

/// A valid PostgreSQL → PostgreSQL dataflow body.
pub fn pg_dataflow(name: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "source": {"type": "postgresql", "config": {"connectionString": "postgres://127.0.0.1/test", "table": "orders"}},
        "sink": {"type": "postgresql", "config": {"connectionString": "postgres://127.0.0.1/test", "table": "orders_copy", "autoCreateTable": true}},
        "transformations": [{"type": "mask", "config": {"fields": ["card"]}}]
    })
}
