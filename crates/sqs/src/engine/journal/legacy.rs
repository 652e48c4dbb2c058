//! Journals of the earlier format, a SQLite database (`<name>.db`, WAL):
//! opening a journal that does not exist yet reads the database beside it
//! into the new log, then removes it.

use std::path::Path;

use rusqlite::Connection;

use super::{LOCK_WAIT, journal_error};
use crate::engine::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;

type Held = (Vec<StoredQueue>, Vec<(String, u64, StoredMessage)>);

/// The queues and messages of the SQLite journal at `path`, if there is one.
pub fn read(path: &Path) -> Result<Option<Held>, SqsError> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open(path).map_err(journal_error)?;
    // An engine of the earlier version still running on it makes this wait,
    // then fail, instead of migrating what it is still changing.
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
        .map_err(journal_error)?;
    conn.busy_timeout(LOCK_WAIT).map_err(journal_error)?;
    let queues = {
        let mut stmt = conn.prepare("SELECT meta FROM queues").map_err(journal_error)?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(journal_error)?;
        rows.map(|r| {
            let text = r.map_err(journal_error)?;
            serde_json::from_str(&text).map_err(journal_error)
        })
        .collect::<Result<Vec<StoredQueue>, SqsError>>()?
    };
    let messages = {
        let mut stmt = conn
            .prepare("SELECT queue, seq, message FROM messages ORDER BY seq")
            .map_err(journal_error)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
            })
            .map_err(journal_error)?;
        rows.map(|r| {
            let (queue, seq, text) = r.map_err(journal_error)?;
            let message: StoredMessage = serde_json::from_str(&text).map_err(journal_error)?;
            Ok((queue, u64::try_from(seq).unwrap_or_default(), message))
        })
        .collect::<Result<Vec<_>, SqsError>>()?
    };
    tracing::info!(
        journal = %path.display(),
        queues = queues.len(),
        messages = messages.len(),
        "migrating a SQLite queue journal to the log"
    );
    Ok(Some((queues, messages)))
}

/// Removes the SQLite journal at `path` and its WAL files, once what it
/// held is in the log.
pub fn remove(path: &Path) -> Result<(), SqsError> {
    for suffix in ["", "-wal", "-shm"] {
        match std::fs::remove_file(super::sibling(path, suffix)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(journal_error(e)),
            _ => {}
        }
    }
    Ok(())
}
