//! Durability of a queue engine: an append-only log file of commands (see
//! [`log`]). Commands of concurrent requests are committed together (group
//! commit) by one writer thread, one write a group, which then applies them
//! to the machine in the order they were written and answers each with its
//! reply. With [`Durability::Disk`] each group is also synced (`fdatasync`)
//! before it is applied; with [`Durability::Process`] it is applied once the
//! write is in the kernel's page cache, which a crash of the engine does not
//! lose, and the writer syncs at most [`PROCESS_SYNC_MS`] later. Journals of
//! earlier formats (SQLite, see [`legacy`]; `SLESSQJ1`, see [`v1`]) are
//! migrated on open.

mod legacy;
pub(crate) mod log;
mod v1;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use sless_model::queue_service::{Durability, PROCESS_SYNC_MS};
use sless_runtime::sync::Unpoisoned;
use tokio::sync::oneshot;

use super::command::{Command, Reply};
use super::machine::{Identity, Machine};
use crate::error::SqsError;
use log::{Log, LogError, Opened};

/// Most commands folded into one commit.
const MAX_GROUP: usize = 512;
/// How long opening waits for another engine to release the journal.
const LOCK_WAIT: Duration = Duration::from_secs(5);

type Answer = oneshot::Sender<Result<Reply, SqsError>>;
type Request = (Command, Answer);

pub struct Journal {
    tx: mpsc::Sender<Request>,
    #[cfg(test)]
    probe: Arc<Probe>,
}

/// What tests set and read in the writer.
#[derive(Default)]
struct Probe {
    /// Makes every commit fail while set (tests inject journal failures).
    failing: AtomicBool,
    /// Syncs that reached the disk.
    syncs: AtomicU64,
}

fn journal_error(e: impl std::fmt::Display) -> SqsError {
    SqsError::internal(format!("queue journal: {e}"))
}

impl Journal {
    /// Opens the journal at `path` and the machine it holds. The engine
    /// holds the journal's lock (a file beside it) for as long as it runs.
    pub fn open(
        path: &Path,
        durability: Durability,
        identity: Identity,
    ) -> Result<(Self, Arc<Mutex<Machine>>), SqsError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(journal_error)?;
        }
        let lock = lock(path)?;
        migrate(path, &identity)?;
        let Opened { log, machine, torn } = Log::open(path, identity).map_err(journal_error)?;
        if torn {
            tracing::warn!(
                journal = %path.display(),
                "cut off the journal's torn last write (a crash during a commit that was not answered)"
            );
        }
        let machine = Arc::new(Mutex::new(machine));
        let (tx, rx) = mpsc::channel::<Request>();
        let probe = Arc::new(Probe::default());
        std::thread::Builder::new()
            .name("sqs-journal".into())
            .spawn({
                let probe = probe.clone();
                let machine = machine.clone();
                move || {
                    writer(log, &rx, durability, &machine, &probe);
                    drop(lock);
                }
            })
            .map_err(journal_error)?;
        let journal = Self {
            tx,
            #[cfg(test)]
            probe,
        };
        Ok((journal, machine))
    }

    /// Commits `command` behind everything submitted before, then applies
    /// it: its reply, or the error that kept it out (then it changed nothing).
    pub async fn submit(&self, command: Command) -> Result<Reply, SqsError> {
        let (done, wait) = oneshot::channel();
        // A stopped writer drops `done`, which is answered below.
        let _ = self.tx.send((command, done));
        wait.await
            .unwrap_or_else(|_| Err(SqsError::internal("queue journal stopped")))
    }

    #[cfg(test)]
    pub fn fail_commits(&self, fail: bool) {
        self.probe.failing.store(fail, Ordering::SeqCst);
    }

    #[cfg(test)]
    pub fn syncs(&self) -> u64 {
        self.probe.syncs.load(Ordering::SeqCst)
    }
}

/// Brings a journal of an earlier format at `path` (or, when there is none,
/// a SQLite one beside it) to the current format.
fn migrate(path: &Path, identity: &Identity) -> Result<(), SqsError> {
    let legacy = path.with_extension("db");
    if !path.exists() {
        let (queues, messages) = legacy::read(&legacy)?.unwrap_or_default();
        log::create(path, &Machine::with(identity.clone(), queues, messages)).map_err(journal_error)?;
    } else if v1::is_v1(path).map_err(journal_error)? {
        let (queues, messages) = v1::read(path).map_err(journal_error)?;
        let count = messages.len();
        log::create(path, &Machine::with(identity.clone(), queues, messages)).map_err(journal_error)?;
        tracing::info!(journal = %path.display(), messages = count, "migrated the queue journal to its current format");
    }
    // Also after a crash between a migration's rename and this.
    legacy::remove(&legacy)
}

/// `path` with `suffix` appended to its file name: the files beside a
/// journal (its lock, a compaction in progress, an older format's WAL).
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Takes the lock of the journal at `path`, waiting up to [`LOCK_WAIT`] for
/// an engine that is exiting: two engines on one journal would number their
/// messages alike and overwrite each other's. The lock is a file of its own
/// because compaction replaces the journal's file.
fn lock(path: &Path) -> Result<File, SqsError> {
    let file = File::create(sibling(path, "-lock")).map_err(journal_error)?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(TryLockError::WouldBlock) => {
                return Err(journal_error(format!(
                    "{} is in use by another queue engine",
                    path.display()
                )));
            }
            Err(TryLockError::Error(e)) => return Err(journal_error(e)),
        }
    }
}

fn writer(mut log: Log, rx: &mpsc::Receiver<Request>, durability: Durability, machine: &Mutex<Machine>, probe: &Probe) {
    let sync_every = Duration::from_millis(PROCESS_SYNC_MS);
    // With `process` durability: since when applied commands wait for a sync.
    let mut unsynced: Option<Instant> = None;
    loop {
        let first = match unsynced {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(since) => rx.recv_timeout((since + sync_every).saturating_duration_since(Instant::now())),
        };
        let first = match first {
            Ok(first) => first,
            Err(RecvTimeoutError::Timeout) => {
                deferred_sync(&mut log, probe);
                unsynced = None;
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        let written = if probe.failing.load(Ordering::SeqCst) {
            Err("injected failure".to_owned())
        } else {
            log.commit(group.iter().map(|(command, _)| command))
                .and_then(|()| match durability {
                    Durability::Disk => sync(&mut log, probe),
                    Durability::Process => Ok(()),
                })
                .map_err(|e: LogError| e.to_string())
        };
        if let Err(e) = written {
            tracing::error!(error = %e, "queue journal write failed");
            for (_, answer) in group {
                let _ = answer.send(Err(SqsError::internal("the message store failed; retry")));
            }
            continue;
        }
        {
            let mut machine = machine.lock_unpoisoned();
            for (command, answer) in group {
                let _ = answer.send(machine.apply(command));
            }
            log.compact_if_due(&machine);
        }
        if durability == Durability::Process {
            let since = *unsynced.get_or_insert_with(Instant::now);
            if since.elapsed() >= sync_every {
                deferred_sync(&mut log, probe);
                unsynced = None;
            }
        }
    }
    // The engine is closing: what it answered is made durable now.
    if unsynced.is_some() {
        deferred_sync(&mut log, probe);
    }
}

fn sync(log: &mut Log, probe: &Probe) -> Result<(), LogError> {
    log.sync()?;
    probe.syncs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The deferred sync of `process` durability. Its requests were answered
/// already; a failure poisons the log, so later writes are refused.
fn deferred_sync(log: &mut Log, probe: &Probe) {
    if let Err(e) = sync(log, probe) {
        tracing::error!(error = %e, "syncing the queue journal failed; it takes no more writes");
    }
}
