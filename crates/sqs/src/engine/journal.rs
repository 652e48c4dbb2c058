//! Durability of a queue engine: a SQLite journal in WAL mode with
//! `synchronous=FULL`. Writes from concurrent requests are committed together
//! (group commit) by one writer thread; a request is answered only after its
//! changes are on disk.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use rusqlite::{Connection, params};
use tokio::sync::oneshot;

use super::error::SqsError;
use super::records::{StoredMessage, StoredQueue};

/// Most changes folded into one transaction.
const MAX_GROUP: usize = 512;
/// How long opening waits for another engine to release the journal.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// Makes every commit fail while set (tests inject journal failures).
    #[cfg(test)]
    failing: Arc<AtomicBool>,
}

/// A submitted write: [`Pending::committed`] resolves once it is durable.
pub struct Pending(oneshot::Receiver<Result<(), String>>);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, meta TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL, seq INTEGER NOT NULL, message TEXT NOT NULL, PRIMARY KEY (queue, seq)
) WITHOUT ROWID;
";

fn sql_error(e: impl std::fmt::Display) -> SqsError {
    SqsError::internal(format!("queue journal: {e}"))
}

type Loaded = (Journal, Vec<StoredQueue>, Vec<(String, u64, StoredMessage)>);

impl Journal {
    /// Opens the journal at `path` and returns what it holds.
    pub fn open(path: &Path) -> Result<Loaded, SqsError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(sql_error)?;
        }
        let conn = Connection::open(path).map_err(sql_error)?;
        let in_use = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy) => SqsError::internal(format!(
                "queue journal: {} is in use by another queue engine",
                path.display()
            )),
            _ => sql_error(e),
        };
        // Set before the first read, so the lock taken then is held for the
        // connection's life: a second engine on the same journal fails (after
        // waiting LOCK_WAIT for one that is exiting) instead of writing beside
        // this one. It also keeps the WAL index in memory, not in a shared
        // file, and takes no file lock per commit.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
            .map_err(sql_error)?;
        conn.busy_timeout(LOCK_WAIT).map_err(sql_error)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(in_use)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(in_use)?;
        conn.execute_batch(SCHEMA).map_err(in_use)?;
        let queues = {
            let mut stmt = conn.prepare("SELECT meta FROM queues").map_err(sql_error)?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0)).map_err(sql_error)?;
            rows.map(|r| {
                let text = r.map_err(sql_error)?;
                serde_json::from_str(&text).map_err(sql_error)
            })
            .collect::<Result<Vec<StoredQueue>, SqsError>>()?
        };
        let messages = {
            let mut stmt = conn
                .prepare("SELECT queue, seq, message FROM messages ORDER BY seq")
                .map_err(sql_error)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
                })
                .map_err(sql_error)?;
            rows.map(|r| {
                let (queue, seq, text) = r.map_err(sql_error)?;
                let message: StoredMessage = serde_json::from_str(&text).map_err(sql_error)?;
                Ok((queue, u64::try_from(seq).unwrap_or_default(), message))
            })
            .collect::<Result<Vec<_>, SqsError>>()?
        };
        let (tx, rx) = mpsc::channel::<Request>();
        let failing = Arc::new(AtomicBool::new(false));
        std::thread::Builder::new()
            .name("sqs-journal".into())
            .spawn({
                let failing = failing.clone();
                move || writer(conn, rx, &failing)
            })
            .map_err(sql_error)?;
        Ok((
            Self {
                tx,
                #[cfg(test)]
                failing,
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
        self.failing.store(fail, Ordering::SeqCst);
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

/// Applies one change. Statements are prepared once per connection and
/// kept: parsing the SQL again would cost more than many an insert.
fn apply(tx: &rusqlite::Transaction<'_>, change: &Change) -> rusqlite::Result<()> {
    let run = |sql: &str, params: &[&dyn rusqlite::ToSql]| tx.prepare_cached(sql)?.execute(params).map(drop);
    match change {
        Change::PutQueue(q) => run(
            "INSERT OR REPLACE INTO queues (name, meta) VALUES (?1, ?2)",
            params![q.name, json(q)],
        ),
        Change::DeleteQueue(name) => {
            run("DELETE FROM queues WHERE name = ?1", params![name])?;
            run("DELETE FROM messages WHERE queue = ?1", params![name])
        }
        Change::PurgeQueue(name) => run("DELETE FROM messages WHERE queue = ?1", params![name]),
        Change::PutMessage { queue, seq, message } => run(
            "INSERT OR REPLACE INTO messages (queue, seq, message) VALUES (?1, ?2, ?3)",
            params![queue, i64::try_from(*seq).unwrap_or(i64::MAX), json(message)],
        ),
        Change::DeleteMessage { queue, seq } => run(
            "DELETE FROM messages WHERE queue = ?1 AND seq = ?2",
            params![queue, i64::try_from(*seq).unwrap_or(i64::MAX)],
        ),
    }
}

/// These types serialise infallibly (string keys, no custom serialisers).
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

fn writer(mut conn: Connection, rx: mpsc::Receiver<Request>, failing: &AtomicBool) {
    while let Ok(first) = rx.recv() {
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
        let result = (|| {
            if failing.load(Ordering::SeqCst) {
                return Err(rusqlite::Error::InvalidQuery);
            }
            let tx = conn.transaction()?;
            for (changes, _) in &group {
                for change in changes {
                    apply(&tx, change)?;
                }
            }
            tx.commit()
        })()
        .map_err(|e| e.to_string());
        for (_, done) in group {
            let _ = done.send(result.clone());
        }
    }
}
