//! Durability of a queue engine: an append-only log file (see [`log`]).
//! Writes from concurrent requests are committed together (group commit) by
//! one writer thread, one write a group. With [`Durability::Disk`] each
//! group is also synced (`fdatasync`) before its requests are answered; with
//! [`Durability::Process`] they are answered once the write is in the
//! kernel's page cache, which a crash of the engine does not lose, and the
//! writer syncs at most [`PROCESS_SYNC_MS`] later. Journals of the earlier
//! SQLite format are migrated on open (see [`legacy`]).

mod legacy;
mod log;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use sless_model::queue_service::{Durability, PROCESS_SYNC_MS};
use tokio::sync::oneshot;

use super::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;
use log::{Log, LogError, Opened};

/// Most changes folded into one commit.
const MAX_GROUP: usize = 512;
/// How long opening waits for another engine to release the journal.
const LOCK_WAIT: Duration = Duration::from_secs(5);

pub enum Change {
    PutQueue(StoredQueue),
    DeleteQueue(String),
    PurgeQueue(String),
    PutMessage {
        queue: String,
        seq: u64,
        message: StoredMessage,
    },
    DeleteMessage {
        queue: String,
        seq: u64,
    },
}

type Request = (Vec<Change>, oneshot::Sender<Result<(), String>>);

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

/// A submitted write: [`Pending::committed`] resolves once it is durable.
pub struct Pending(oneshot::Receiver<Result<(), String>>);

fn journal_error(e: impl std::fmt::Display) -> SqsError {
    SqsError::internal(format!("queue journal: {e}"))
}

type Loaded = (Journal, Vec<StoredQueue>, Vec<(String, u64, StoredMessage)>);

impl Journal {
    /// Opens the journal at `path` and returns what it holds. The engine
    /// holds the journal's lock (a file beside it) for as long as it runs.
    pub fn open(path: &Path, durability: Durability) -> Result<Loaded, SqsError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(journal_error)?;
        }
        let lock = lock(path)?;
        let legacy = path.with_extension("db");
        if !path.exists() {
            let (queues, messages) = legacy::read(&legacy)?.unwrap_or_default();
            log::create(path, &queues, &messages).map_err(journal_error)?;
        }
        // Also after a crash between a migration's rename and this.
        legacy::remove(&legacy)?;
        let Opened {
            log,
            queues,
            messages,
            torn,
        } = Log::open(path).map_err(journal_error)?;
        if torn {
            tracing::warn!(
                journal = %path.display(),
                "cut off the journal's torn last write (a crash during a commit that was not answered)"
            );
        }
        let (tx, rx) = mpsc::channel::<Request>();
        let probe = Arc::new(Probe::default());
        std::thread::Builder::new()
            .name("sqs-journal".into())
            .spawn({
                let probe = probe.clone();
                move || {
                    writer(log, rx, durability, &probe);
                    drop(lock);
                }
            })
            .map_err(journal_error)?;
        Ok((
            Self {
                tx,
                #[cfg(test)]
                probe,
            },
            queues,
            messages,
        ))
    }

    /// Queues `changes` behind everything submitted before: the journal
    /// commits in submission order, so the engine submits under its lock.
    pub fn submit(&self, changes: Vec<Change>) -> Pending {
        let (done, wait) = oneshot::channel();
        // A stopped writer drops `done`, which `committed` reports.
        let _ = self.tx.send((changes, done));
        Pending(wait)
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

impl Pending {
    /// Returns once the changes are durable, or the error that kept them out.
    pub async fn committed(self) -> Result<(), SqsError> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "queue journal write failed");
                Err(SqsError::internal("the message store failed; retry"))
            }
            Err(_) => Err(SqsError::internal("queue journal stopped")),
        }
    }
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

fn writer(mut log: Log, rx: mpsc::Receiver<Request>, durability: Durability, probe: &Probe) {
    let sync_every = Duration::from_millis(PROCESS_SYNC_MS);
    // With `process` durability: since when answered writes wait for a sync.
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
        let mut count = group[0].0.len();
        while count < MAX_GROUP {
            match rx.try_recv() {
                Ok(next) => {
                    count += next.0.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let result = if probe.failing.load(Ordering::SeqCst) {
            Err("injected failure".to_owned())
        } else {
            log.commit(group.iter().flat_map(|(changes, _)| changes))
                .and_then(|()| match durability {
                    Durability::Disk => sync(&mut log, probe),
                    Durability::Process => Ok(()),
                })
                .map_err(|e: LogError| e.to_string())
        };
        let written = result.is_ok();
        for (_, done) in group {
            let _ = done.send(result.clone());
        }
        if durability == Durability::Process && written {
            let since = *unsynced.get_or_insert_with(Instant::now);
            if since.elapsed() >= sync_every {
                deferred_sync(&mut log, probe);
                unsynced = None;
            }
        }
        log.compact_if_due();
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
