//! A queue service of three replicas in `sless dev`: three `sless queue`
//! processes on loopback ports, each with its files in a directory of its
//! own, that keep the tenant's queues together. Any of them can be killed;
//! the others go on serving and the platform starts it again.
//!
//! Replica 1's files are the ones the in-process engine of a single-replica
//! service uses (its directory is linked into replica 1's), so a service
//! grows from one replica to three, and shrinks back, on the same queues.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use sless_sqs::engine::Persistence;
use tokio::process::{Child, Command};

/// How many replicas a replicated queue service runs.
pub(super) const REPLICAS: u64 = 3;
/// A replica that died is started again at most this often.
const RESTART_EVERY: Duration = Duration::from_secs(1);
/// How long a call to a replica's peer port may take.
const PEER_CALL: Duration = Duration::from_secs(2);

/// What every replica of one queue service is started with.
pub(super) struct ReplicaConfig {
    /// The `sless` executable.
    pub program: PathBuf,
    /// Replica 1's files: the in-process engine's.
    pub persistence: Persistence,
    pub account_id: String,
    pub region: String,
    pub base_url: String,
    /// The token the gateway presents.
    pub token: String,
}

/// One `sless queue` process and what it needs to be started again.
struct Member {
    id: u64,
    sqs: SocketAddr,
    peer: SocketAddr,
    data_dir: PathBuf,
    child: Option<Child>,
    started: Instant,
}

/// The three replicas of one queue service, killed when this is dropped.
pub(super) struct ReplicaSet {
    config: ReplicaConfig,
    members: Vec<Member>,
    peers: String,
    /// What the replicas present to each other; new for each set.
    peer_token: String,
    http: reqwest::Client,
    /// Whether most replicas have answered their health check since they
    /// were started: until then the service is starting, not failed.
    up: bool,
}

/// Where replica `id` keeps its files.
fn dir_of(persistence: &Persistence, id: u64) -> PathBuf {
    persistence.journal.with_extension("replicas").join(id.to_string())
}

/// Whether the replicas other than 1 have files: the queue service ran
/// replicated, and its voters are the three until it shrinks again.
pub(super) fn others_have_files(persistence: &Persistence) -> bool {
    (2..=REPLICAS).any(|id| dir_of(persistence, id).exists())
}

/// Removes the files of the replicas other than 1, which left the queue
/// service: a later set starts them anew.
pub(super) fn forget_others(persistence: &Persistence) {
    for id in 2..=REPLICAS {
        let dir = dir_of(persistence, id);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a replica's files");
        }
    }
}

/// Replica `id`'s data directory, made if missing; replica 1's links to
/// the in-process engine's files.
fn data_dir(persistence: &Persistence, id: u64) -> Result<PathBuf, String> {
    let journal = &persistence.journal;
    let dir = dir_of(persistence, id);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    if id == 1 {
        let raft = journal.with_extension("raft");
        let link = dir.join("queues.raft");
        std::fs::create_dir_all(&raft).map_err(|e| format!("cannot make {}: {e}", raft.display()))?;
        if std::fs::symlink_metadata(&link).is_err() {
            let target = std::path::absolute(&raft).map_err(|e| format!("{}: {e}", raft.display()))?;
            std::os::unix::fs::symlink(&target, &link)
                .map_err(|e| format!("cannot link {} to {}: {e}", link.display(), target.display()))?;
        }
    }
    Ok(dir)
}

/// A loopback address with a port that was free a moment ago.
fn free_loopback() -> Result<SocketAddr, String> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

impl ReplicaSet {
    /// Starts the three replicas.
    pub(super) fn start(config: ReplicaConfig) -> Result<Self, String> {
        let mut members = Vec::new();
        for id in 1..=REPLICAS {
            members.push(Member {
                id,
                sqs: free_loopback()?,
                peer: free_loopback()?,
                data_dir: data_dir(&config.persistence, id)?,
                child: None,
                started: Instant::now(),
            });
        }
        let peers = members
            .iter()
            .map(|m| format!("{}={}", m.id, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut set = Self {
            config,
            members,
            peers,
            peer_token: sless_sqs::credentials::engine_token(),
            http: reqwest::Client::builder()
                .timeout(PEER_CALL)
                .build()
                .unwrap_or_default(),
            up: false,
        };
        for i in 0..set.members.len() {
            set.spawn(i)?;
        }
        Ok(set)
    }

    /// What it was started with; another value restarts it.
    pub(super) fn persistence(&self) -> &Persistence {
        &self.config.persistence
    }

    /// The replicas' SQS addresses, as a route's members.
    pub(super) fn backend(&self) -> String {
        self.members
            .iter()
            .map(|m| m.sqs.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let c = &self.config;
        let mut command = Command::new(&c.program);
        command
            .arg("queue")
            .args(["--listen", &m.sqs.to_string()])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--durability", c.persistence.durability.as_str()])
            .args([
                "--account-id",
                &c.account_id,
                "--region",
                &c.region,
                "--base-url",
                &c.base_url,
            ])
            .args(["--peers", &self.peers, "--replica-id", &m.id.to_string()])
            .args(["--parent-pid", &std::process::id().to_string()])
            // Secrets in the environment, not in the arguments `ps` shows.
            .env("SLESS_ENGINE_TOKEN", &c.token)
            .env("SLESS_PEER_TOKEN", &self.peer_token)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {} queue: {e}", c.program.display()))?;
        tracing::info!(replica = m.id, addr = %m.sqs, pid = child.id(), "queue engine replica started");
        let m = &mut self.members[i];
        m.child = Some(child);
        m.started = Instant::now();
        Ok(())
    }

    /// Starts again each replica whose process ended (killed, crashed).
    pub(super) fn revive(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            let ended = match m.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(e.to_string()),
                None => Some("not running".into()),
            };
            if let Some(how) = ended
                && m.started.elapsed() >= RESTART_EVERY
            {
                tracing::warn!(replica = m.id, ended = %how, "queue engine replica ended; starting it again");
                self.spawn(i)?;
            }
        }
        Ok(())
    }

    /// Whether most replicas have answered their health check once.
    pub(super) async fn started(&mut self) -> bool {
        if !self.up {
            let mut answering = 0;
            for m in &self.members {
                let url = format!("http://{}/health", m.sqs);
                if self.http.get(url).send().await.is_ok_and(|r| r.status().is_success()) {
                    answering += 1;
                }
            }
            self.up = answering * 2 > self.members.len();
        }
        self.up
    }

    /// Moves the queue service towards replica 1 alone: asks every replica
    /// to make it the only voter (whichever leads does), and answers
    /// whether replica 1 says it is. Once it is, the set may stop: replica
    /// 1 holds everything committed.
    pub(super) async fn shrunk_to_first(&self) -> bool {
        let only_first = BTreeSet::from([1u64]);
        for m in &self.members {
            let asked = self
                .http
                .post(format!("http://{}/raft/voters", m.peer))
                .header("x-sless-peer-token", &self.peer_token)
                .json(&only_first)
                .send()
                .await;
            if let Err(e) = asked {
                tracing::debug!(replica = m.id, error = %e, "cannot reach a replica to lower the voters");
            }
        }
        let status = self
            .http
            .get(format!("http://{}/raft/status", self.members[0].peer))
            .header("x-sless-peer-token", &self.peer_token)
            .send()
            .await;
        let Ok(status) = status else { return false };
        let status: serde_json::Value = status.json().await.unwrap_or_default();
        status["voters"] == serde_json::json!([1]) && status["joint"] == false
    }

    /// Stops the replicas; their files stay.
    pub(super) async fn stop(mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill().await;
            }
        }
    }
}
