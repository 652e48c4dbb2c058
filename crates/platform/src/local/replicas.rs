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
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sless_sqs::engine::Persistence;
use sless_sqs::engine::raft::network::PEER_TOKEN;
use sless_sqs::engine::raft::peers::Status;
use tokio::process::{Child, Command};

/// The replicas of a replicated queue service, by id.
const IDS: std::ops::RangeInclusive<u64> = 1..=3;
/// How many replicas a replicated queue service runs.
pub(super) const REPLICATED: u8 = 3;
/// A replica that died is started again at most this often…
const RESTART_EVERY: Duration = Duration::from_secs(1);
/// …and one that dies this soon after a start, this many times in a row,
/// has lost its port (another process took it): the set gets new ones.
const QUICK_DEATH: Duration = Duration::from_secs(5);
const QUICK_DEATHS: u32 = 3;
/// How long a call to a replica may take.
const CALL: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub(super) enum ReplicaError {
    #[error("cannot prepare {path}: {source}")]
    Files { path: PathBuf, source: std::io::Error },
    #[error("cannot find a free port: {0}")]
    Port(std::io::Error),
    #[error("cannot start {program} queue: {source}")]
    Spawn { program: PathBuf, source: std::io::Error },
    #[error("cannot make an HTTP client: {0}")]
    Client(reqwest::Error),
}

fn files(path: &Path) -> impl FnOnce(std::io::Error) -> ReplicaError + '_ {
    move |source| ReplicaError::Files {
        path: path.to_owned(),
        source,
    }
}

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
    quick_deaths: u32,
}

/// The three replicas of one queue service, killed when this is dropped.
pub(super) struct ReplicaSet {
    config: ReplicaConfig,
    members: Vec<Member>,
    peers: String,
    /// What the replicas present to each other; new for each set.
    peer_token: String,
    http: reqwest::Client,
    /// Whether replica 1 has reported the three as its voters (no change
    /// under way) since the set started or was last asked to shrink: until
    /// then losing one replica could stop the service.
    settled: bool,
}

/// What [`ReplicaSet::revive`] found.
pub(super) enum Revived {
    /// Every replica runs, or was started again.
    Running,
    /// A replica keeps dying at once: the set needs new ports.
    PortsLost,
}

/// The directory of a queue service's replicas.
fn root(persistence: &Persistence) -> PathBuf {
    persistence.journal.with_extension("replicas")
}

/// Where replica `id` keeps its files.
fn dir_of(persistence: &Persistence, id: u64) -> PathBuf {
    root(persistence).join(id.to_string())
}

/// Present while replicas 2 and 3 are (or may be) voters of the queue
/// service: made before they first start, removed before their files.
fn voters_mark(persistence: &Persistence) -> PathBuf {
    root(persistence).join("replicated")
}

/// Whether the queue service's voters may be three: it ran replicated and
/// has not shrunk since (a service deleted while replicated keeps its
/// stores, as seed 000 keeps a PVC).
pub(super) fn replicated_before(persistence: &Persistence) -> bool {
    voters_mark(persistence).exists()
}

/// Forgets replicas 2 and 3, which left the queue service: the mark goes
/// first, so that a crash between the two steps leaves files a later set
/// removes instead of replicas that would elect each other.
pub(super) fn forget_others(persistence: &Persistence) {
    let mark = voters_mark(persistence);
    match std::fs::remove_file(&mark) {
        Ok(()) => remove_others(persistence),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => remove_others(persistence),
        Err(e) => tracing::warn!(mark = %mark.display(), error = %e, "cannot forget the replicas"),
    }
}

fn remove_others(persistence: &Persistence) {
    for id in IDS.skip(1) {
        let dir = dir_of(persistence, id);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a replica's files");
        }
    }
}

/// Makes the replicas' directories: replica 1's links to the in-process
/// engine's files; 2 and 3 start empty unless they are voters already.
fn prepare_files(persistence: &Persistence) -> Result<(), ReplicaError> {
    let mark = voters_mark(persistence);
    if !mark.exists() {
        remove_others(persistence);
        let root = root(persistence);
        std::fs::create_dir_all(&root).map_err(files(&root))?;
        std::fs::write(&mark, b"").map_err(files(&mark))?;
        std::fs::File::open(&root)
            .and_then(|d| d.sync_all())
            .map_err(files(&root))?;
    }
    for id in IDS {
        let dir = dir_of(persistence, id);
        std::fs::create_dir_all(&dir).map_err(files(&dir))?;
    }
    let raft = persistence.journal.with_extension("raft");
    std::fs::create_dir_all(&raft).map_err(files(&raft))?;
    let link = dir_of(persistence, 1).join("queues.raft");
    if std::fs::symlink_metadata(&link).is_err() {
        let target = std::path::absolute(&raft).map_err(files(&raft))?;
        std::os::unix::fs::symlink(&target, &link).map_err(files(&link))?;
    }
    Ok(())
}

/// A loopback address with a port that was free a moment ago.
fn free_loopback() -> Result<SocketAddr, ReplicaError> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map_err(ReplicaError::Port)
}

impl ReplicaSet {
    /// Starts the three replicas.
    pub(super) fn start(config: ReplicaConfig) -> Result<Self, ReplicaError> {
        prepare_files(&config.persistence)?;
        let mut members = Vec::new();
        for id in IDS {
            members.push(Member {
                id,
                sqs: free_loopback()?,
                peer: free_loopback()?,
                data_dir: dir_of(&config.persistence, id),
                child: None,
                started: Instant::now(),
                quick_deaths: 0,
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
                .timeout(CALL)
                .build()
                .map_err(ReplicaError::Client)?,
            settled: false,
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

    fn spawn(&mut self, i: usize) -> Result<(), ReplicaError> {
        let m = &self.members[i];
        let c = &self.config;
        let mut command = Command::new(&c.program);
        command
            .arg("queue")
            .args(["--listen", &m.sqs.to_string()])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--durability", c.persistence.durability.as_str()])
            .args(["--account-id", &c.account_id, "--region", &c.region])
            .args(["--base-url", &c.base_url])
            .args(["--peers", &self.peers, "--replica-id", &m.id.to_string()])
            .args(["--parent-pid", &std::process::id().to_string()])
            // Secrets in the environment, not in the arguments `ps` shows.
            .env("SLESS_ENGINE_TOKEN", &c.token)
            .env("SLESS_PEER_TOKEN", &self.peer_token)
            .stdin(Stdio::null())
            // A Ctrl-C at sless dev's terminal is for sless dev: the
            // replicas end when it has ended.
            .process_group(0)
            .kill_on_drop(true);
        let child = command.spawn().map_err(|source| ReplicaError::Spawn {
            program: c.program.clone(),
            source,
        })?;
        tracing::info!(replica = m.id, addr = %m.sqs, pid = child.id(), "queue engine replica started");
        let m = &mut self.members[i];
        m.child = Some(child);
        m.started = Instant::now();
        Ok(())
    }

    /// Starts again each replica whose process ended (killed, crashed).
    pub(super) fn revive(&mut self) -> Revived {
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            let ended = match m.child.as_mut().map(Child::try_wait) {
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Ok(None)) => None,
                Some(Err(e)) => Some(e.to_string()),
                None => Some("not running".into()),
            };
            let Some(how) = ended else { continue };
            if m.started.elapsed() < RESTART_EVERY {
                continue;
            }
            m.quick_deaths = if m.started.elapsed() < QUICK_DEATH {
                m.quick_deaths + 1
            } else {
                0
            };
            if m.quick_deaths >= QUICK_DEATHS {
                tracing::warn!(replica = m.id, ended = %how, "queue engine replica keeps ending at once; new ports");
                return Revived::PortsLost;
            }
            tracing::warn!(replica = m.id, ended = %how, "queue engine replica ended; starting it again");
            if let Err(e) = self.spawn(i) {
                tracing::warn!(error = %e, "cannot start a queue engine replica again; retrying");
            }
        }
        Revived::Running
    }

    /// Asks every replica for `voters` (whichever leads makes them so).
    async fn want_voters(&self, voters: &BTreeSet<u64>) {
        for m in &self.members {
            let asked = self
                .http
                .post(format!("http://{}/raft/voters", m.peer))
                .header(PEER_TOKEN, &self.peer_token)
                .json(voters)
                .send()
                .await;
            if let Err(e) = asked {
                tracing::debug!(replica = m.id, error = %e, "cannot reach a replica to set the voters");
            }
        }
    }

    /// Whether replica 1 reports exactly `voters` as the voters, no change
    /// under way.
    async fn first_reports(&self, voters: &[u64]) -> bool {
        let status = self
            .http
            .get(format!("http://{}/raft/status", self.members[0].peer))
            .header(PEER_TOKEN, &self.peer_token)
            .send()
            .await;
        match status {
            Ok(answer) => answer
                .json::<Status>()
                .await
                .is_ok_and(|s| s.voters == voters && !s.joint),
            Err(_) => false,
        }
    }

    /// Whether the three are the voters, asking for them (a shrink asked
    /// for before may be under way): only then can one be lost.
    pub(super) async fn settled(&mut self) -> bool {
        if !self.settled {
            let all: Vec<u64> = IDS.collect();
            self.want_voters(&all.iter().copied().collect()).await;
            self.settled = self.first_reports(&all).await;
        }
        self.settled
    }

    /// Moves the queue service towards replica 1 alone, and answers
    /// whether replica 1 is the only voter. Once it is, the set may stop:
    /// replica 1 holds everything committed (the change needed its ack).
    pub(super) async fn shrunk_to_first(&mut self) -> bool {
        self.settled = false;
        self.want_voters(&BTreeSet::from([1])).await;
        self.first_reports(&[1]).await
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
