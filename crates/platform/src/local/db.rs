//! The embedded, crash-safe state store of `sless dev`: one SQLite database
//! in WAL mode with `synchronous=FULL`, so a write that returned survives
//! `kill -9` and power loss. Objects are kept as JSON documents keyed by
//! (kind, tenant, name).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sless_runtime::sync::Unpoisoned;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored document is corrupt: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("cannot prepare the data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("store task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("an object with this name already exists")]
    AlreadyExists,
    #[error("stored setting {0} is corrupt")]
    CorruptSetting(String),
}

/// One stored object.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<S, T> {
    pub tenant: String,
    pub name: String,
    pub spec: S,
    pub status: T,
    /// RFC 3339.
    pub created_at: String,
    /// Bumped on every spec change, so a reconciler can tell stale work.
    pub generation: i64,
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS objects (
    kind       TEXT    NOT NULL,
    tenant     TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    spec       TEXT    NOT NULL,
    status     TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    generation INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (kind, tenant, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
";

impl Store {
    /// Opens (creating if needed) the database under `data_dir`, off the
    /// async runtime (opening may recover a WAL).
    pub async fn open(data_dir: &Path) -> Result<Self, StoreError> {
        let data_dir = data_dir.to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(&data_dir)).await?
    }

    fn open_blocking(data_dir: &Path) -> Result<Self, StoreError> {
        let dir_err = |source| StoreError::DataDir {
            path: data_dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(dir_err)?;
        restrict_permissions(data_dir).map_err(dir_err)?;
        let conn = Connection::open(data_dir.join("sless.db"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock cannot leave a half-written
            // transaction behind (SQLite rolls it back), so poison is harmless.
            let mut guard = conn.lock_unpoisoned();
            f(&mut guard)
        })
        .await?
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        self.run(|c| Ok(c.query_row("SELECT 1", [], |_| Ok(()))?)).await
    }

    pub async fn insert<S, T>(&self, kind: &'static str, record: Record<S, T>) -> Result<(), StoreError>
    where
        S: Serialize,
        T: Serialize,
    {
        let spec = serde_json::to_string(&record.spec)?;
        let status = serde_json::to_string(&record.status)?;
        self.run(move |c| {
            let inserted = c.execute(
                "INSERT INTO objects (kind, tenant, name, spec, status, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT DO NOTHING",
                params![kind, record.tenant, record.name, spec, status, record.created_at],
            )?;
            if inserted == 0 {
                return Err(StoreError::AlreadyExists);
            }
            Ok(())
        })
        .await
    }

    pub async fn get<S, T>(
        &self,
        kind: &'static str,
        tenant: &str,
        name: &str,
    ) -> Result<Option<Record<S, T>>, StoreError>
    where
        S: DeserializeOwned + Send + 'static,
        T: DeserializeOwned + Send + 'static,
    {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            let row = c
                .query_row(
                    "SELECT tenant, name, spec, status, created_at, generation FROM objects
                     WHERE kind = ?1 AND tenant = ?2 AND name = ?3",
                    params![kind, tenant, name],
                    raw_row,
                )
                .optional()?;
            row.map(decode).transpose()
        })
        .await
    }

    /// Objects of `kind`, of one tenant or (with `None`) of all, by name.
    pub async fn list<S, T>(&self, kind: &'static str, tenant: Option<&str>) -> Result<Vec<Record<S, T>>, StoreError>
    where
        S: DeserializeOwned + Send + 'static,
        T: DeserializeOwned + Send + 'static,
    {
        let tenant = tenant.map(str::to_owned);
        self.run(move |c| {
            let mut stmt = c.prepare(
                "SELECT tenant, name, spec, status, created_at, generation FROM objects
                 WHERE kind = ?1 AND (?2 IS NULL OR tenant = ?2) ORDER BY tenant, name",
            )?;
            let rows = stmt.query_map(params![kind, tenant], raw_row)?;
            rows.map(|row| decode(row?)).collect()
        })
        .await
    }

    /// Replaces the spec and bumps the generation; with `status`, also sets
    /// the status in the same write (what the new generation is until its
    /// reconciler says otherwise: no reader sees the new spec with the old
    /// one's status). Returns false when the object does not exist.
    pub async fn update_spec<S: Serialize, T: Serialize>(
        &self,
        kind: &'static str,
        tenant: &str,
        name: &str,
        spec: &S,
        status: Option<&T>,
    ) -> Result<bool, StoreError> {
        let spec = serde_json::to_string(spec)?;
        let status = status.map(serde_json::to_string).transpose()?;
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            Ok(c.execute(
                "UPDATE objects SET spec = ?4, generation = generation + 1, status = coalesce(?5, status) \
                 WHERE kind = ?1 AND tenant = ?2 AND name = ?3",
                params![kind, tenant, name, spec, status],
            )? == 1)
        })
        .await
    }

    /// Writes a status computed for `generation`; a status computed for an
    /// older spec is dropped. Returns whether it was written.
    pub async fn update_status<T: Serialize>(
        &self,
        kind: &'static str,
        tenant: &str,
        name: &str,
        generation: i64,
        status: &T,
    ) -> Result<bool, StoreError> {
        let status = serde_json::to_string(status)?;
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            Ok(c.execute(
                "UPDATE objects SET status = ?5 WHERE kind = ?1 AND tenant = ?2 AND name = ?3 AND generation = ?4",
                params![kind, tenant, name, generation, status],
            )? == 1)
        })
        .await
    }

    /// Returns false when the object did not exist.
    pub async fn delete(&self, kind: &'static str, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let (tenant, name) = (tenant.to_owned(), name.to_owned());
        self.run(move |c| {
            Ok(c.execute(
                "DELETE FROM objects WHERE kind = ?1 AND tenant = ?2 AND name = ?3",
                params![kind, tenant, name],
            )? == 1)
        })
        .await
    }

    pub async fn setting(&self, key: String) -> Result<Option<String>, StoreError> {
        self.run(move |c| {
            Ok(
                c.query_row("SELECT value FROM settings WHERE key = ?1", params![key], |r| r.get(0))
                    .optional()?,
            )
        })
        .await
    }

    pub async fn put_setting(&self, key: String, value: String) -> Result<(), StoreError> {
        self.run(move |c| {
            c.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn delete_setting(&self, key: String) -> Result<(), StoreError> {
        self.run(move |c| {
            c.execute("DELETE FROM settings WHERE key = ?1", params![key])?;
            Ok(())
        })
        .await
    }

    /// Stores `value` under `key` unless a value is there; returns the value
    /// that is stored afterwards.
    pub async fn setting_or_insert(&self, key: impl Into<String>, value: String) -> Result<String, StoreError> {
        let key = key.into();
        self.run(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                params![key, value],
            )?;
            let stored = tx.query_row("SELECT value FROM settings WHERE key = ?1", params![key], |r| r.get(0))?;
            tx.commit()?;
            Ok(stored)
        })
        .await
    }
}

type RawRow = (String, String, String, String, String, i64);

fn raw_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn decode<S: DeserializeOwned, T: DeserializeOwned>(
    (tenant, name, spec, status, created_at, generation): RawRow,
) -> Result<Record<S, T>, StoreError> {
    Ok(Record {
        tenant,
        name,
        spec: serde_json::from_str(&spec)?,
        status: serde_json::from_str(&status)?,
        created_at,
        generation,
    })
}

/// The data directory holds tenants' secret keys: owner access only.
fn restrict_permissions(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tenant: &str, name: &str, spec: u32) -> Record<u32, String> {
        Record {
            tenant: tenant.into(),
            name: name.into(),
            spec,
            status: "new".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            generation: 1,
        }
    }

    #[tokio::test]
    async fn crud_and_generation_fencing() {
        let dir = tempdir();
        let store = Store::open(&dir).await.unwrap();
        store.insert("k", record("t1", "a", 1)).await.unwrap();
        store.insert("k", record("t2", "a", 2)).await.unwrap();
        assert!(matches!(
            store.insert("k", record("t1", "a", 3)).await,
            Err(StoreError::AlreadyExists)
        ));

        let listed: Vec<Record<u32, String>> = store.list("k", Some("t1")).await.unwrap();
        assert_eq!(listed, vec![record("t1", "a", 1)]);
        assert_eq!(store.list::<u32, String>("k", None).await.unwrap().len(), 2);

        assert!(store.update_spec("k", "t1", "a", &5u32, None::<&()>).await.unwrap());
        // A status computed for generation 1 is stale now.
        assert!(!store.update_status("k", "t1", "a", 1, &"old").await.unwrap());
        assert!(store.update_status("k", "t1", "a", 2, &"fresh").await.unwrap());
        let got: Record<u32, String> = store.get("k", "t1", "a").await.unwrap().unwrap();
        assert_eq!((got.spec, got.status.as_str(), got.generation), (5, "fresh", 2));
        // A spec with the status it starts from, in one write.
        assert!(
            store
                .update_spec("k", "t1", "a", &6u32, Some(&"restarting"))
                .await
                .unwrap()
        );
        let got: Record<u32, String> = store.get("k", "t1", "a").await.unwrap().unwrap();
        assert_eq!((got.spec, got.status.as_str(), got.generation), (6, "restarting", 3));

        assert!(store.delete("k", "t1", "a").await.unwrap());
        assert!(!store.delete("k", "t1", "a").await.unwrap());
        assert!(store.get::<u32, String>("k", "t1", "a").await.unwrap().is_none());
        drop(store);

        // Reopening sees what was committed.
        let store = Store::open(&dir).await.unwrap();
        assert_eq!(
            store.list::<u32, String>("k", None).await.unwrap(),
            vec![record("t2", "a", 2)]
        );
        assert_eq!(store.setting_or_insert("s", "one".into()).await.unwrap(), "one");
        assert_eq!(store.setting_or_insert("s", "two".into()).await.unwrap(), "one");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sless-store-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
