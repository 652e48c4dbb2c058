//! The files of a queue engine's store, and the stores of earlier versions.
//! Today an engine's changes are kept by its replicas' Raft log (see
//! `super::raft`), whose snapshots and records are framed as [`log`]
//! describes. An engine that finds a store of an earlier version beside
//! its replica's directory starts from what that store holds, once: the
//! journal (`SLESSQJ2`, see [`log`]; `SLESSQJ1`, see [`v1`]) or, before it,
//! SQLite (`<name>.db`, see [`legacy`]).

mod legacy;
pub(crate) mod log;
mod v1;

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::machine::{Identity, Machine};
use crate::error::SqsError;

/// How long opening waits for another engine to release a store.
const LOCK_WAIT: Duration = Duration::from_secs(5);

pub(crate) fn journal_error(e: impl std::fmt::Display) -> SqsError {
    SqsError::internal(format!("queue store: {e}"))
}

/// What the store of an earlier version at `journal` (or the SQLite
/// store beside it) holds, if there is one.
pub fn read_earlier(journal: &Path, identity: &Identity) -> Result<Option<Machine>, SqsError> {
    let sqlite = journal.with_extension("db");
    if journal.exists() {
        let machine = if v1::is_v1(journal).map_err(journal_error)? {
            let (queues, messages) = v1::read(journal).map_err(journal_error)?;
            Machine::with(identity.clone(), queues, messages)
        } else {
            let (machine, torn) = log::read_journal(journal, identity.clone()).map_err(journal_error)?;
            if torn {
                tracing::warn!(journal = %journal.display(), "the journal's torn last write is left out");
            }
            machine
        };
        return Ok(Some(machine));
    }
    Ok(legacy::read(&sqlite)?.map(|(queues, messages)| Machine::with(identity.clone(), queues, messages)))
}

/// Removes the store of an earlier version at `journal` (and beside it),
/// once what it held is kept elsewhere.
pub fn remove_earlier(journal: &Path) -> Result<(), SqsError> {
    for path in [journal.to_owned(), sibling(journal, "-lock")] {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(journal_error(e)),
            _ => {}
        }
    }
    legacy::remove(&journal.with_extension("db"))
}

/// `path` with `suffix` appended to its file name: the files beside a
/// store (its lock, a file being written, an older format's WAL).
pub(crate) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Takes the lock of the store at `path` (a file beside it), waiting up to
/// [`LOCK_WAIT`] for an engine that is exiting: two engines on one store
/// would overwrite each other's writes.
pub(crate) fn lock(path: &Path) -> Result<File, SqsError> {
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
