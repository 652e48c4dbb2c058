//! PostgreSQL change data capture (`postgresql-cdc`): the published
//! tables' existing rows first (the initial snapshot), then their inserts,
//! updates, deletes and truncates in commit order, as Debezium-shaped
//! events (`before`, `after`, `op`, `source`).
//!
//! It streams a logical replication slot with the `pgoutput` plugin over a
//! replication connection ([`crate::sql::replication`]): changes arrive as
//! they commit, each handed out as it is decoded, so a transaction larger
//! than memory passes through. From PostgreSQL 14 on it asks for protocol
//! version 2 with `streaming`: the server sends a transaction that outgrows
//! its `logical_decoding_work_mem` while it runs, and the source keeps it
//! (in memory, then in a file) until its commit ([`streams`]).
//! Every change written downstream is confirmed to the server by a standby
//! status update as it is written, and only then: the slot's confirmed LSN
//! is the checkpoint, and a crash delivers again from the last confirmed
//! transaction (a transaction cut by the crash, from its start); nothing is
//! skipped.
//!
//! The snapshot (`snapshot: initial`, the default): when the slot is made,
//! it is made with `USE_SNAPSHOT` inside a repeatable-read transaction on
//! the replication connection, which then reads the tables (`op: r`
//! events) in exactly the state the slot streams from. The publication's
//! comment says "snapshot pending" until every snapshot row is written
//! downstream. A dataflow that starts and finds it pending (a crash in the
//! snapshot) keeps the slot, which has confirmed nothing yet, reads the
//! tables again whole in a new snapshot, and then streams from the slot's
//! start: rows written before the crash come again, and changes made since
//! the slot's start come after the new snapshot even where it already holds
//! them, so a consumer applying events in order ends with the tables'
//! state (at least once; no row and no delete is lost). A slot found
//! missing while the publication is there (dropped by hand) is made again
//! with a new snapshot; deletes made while there was no slot are not seen.
//! `never` streams from the slot's creation only; `initial_only` reads the
//! rows, keeps no slot, and then reads nothing more.
//!
//! A database server may be shared by tenants: a slot or publication name a
//! spec gives must begin with its tenant's prefix ([`name_prefix`]), and a
//! dataflow adopts or drops only the publication it made (marked with a
//! comment naming the dataflow) and the slot that goes with it. A database
//! role per tenant is still the real boundary.
//!
//! This file holds the component (its config, rules, the slot and
//! publication it owns, opening and the pipeline's calls), over 500 lines
//! with its tests; beside it are the reading task (`reading.rs`: snapshot,
//! stream, confirmations), the pgoutput decoder (`pgoutput.rs`) and the
//! keeping of transactions streamed in progress (`streams.rs`). The
//! replication protocol client is [`crate::sql::replication`].

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};

mod pgoutput;
mod reading;
mod streams;

use self::pgoutput::{lsn_text, parse_lsn};
use self::reading::{Inbox, Job, Order, Outbox, Shared, last_change, run};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::component::{either, non_empty};
use crate::context::PipelineContext;
use crate::sql::positions::{names_positions, reserved};
use crate::sql::replication;
use crate::sql::{Target, connect_to, quote};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};
use sless_runtime::sync::Unpoisoned;

/// Most tables one publication lists.
pub const MAX_TABLES: usize = 100;
/// Batches decoded ahead of the pipeline.
const READ_AHEAD: usize = 4;
/// The comment's words, after the owner's mark, while a snapshot is not
/// yet wholly written.
const SNAPSHOT_PENDING: &str = "snapshot pending";

/// What a new slot starts with (`snapshot`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// The tables' rows first, then their changes.
    #[default]
    Initial,
    /// Changes from the slot's creation on.
    Never,
    /// The tables' rows, and nothing after.
    InitialOnly,
}

/// `config` of a `postgresql-cdc` source.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresCdcConfig {
    pub connection_string: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    /// One table to capture (`name` or `schema.name`).
    pub table: Option<String>,
    /// Several tables, captured in one commit order.
    #[serde(default)]
    pub tables: Vec<String>,
    /// The replication slot; default `sless_` and a hash of the dataflow.
    pub slot_name: Option<String>,
    /// The publication; default the slot's name.
    pub publication_name: Option<String>,
    /// Accepted for specs written when the source polled; changes now
    /// stream as they commit.
    pub poll_interval: Option<u32>,
    /// Changes written and confirmed together. Default 1000.
    pub batch_size: Option<u32>,
    /// What a new slot starts with. Default `initial`.
    #[serde(default)]
    pub snapshot: SnapshotMode,
}

impl PostgresCdcConfig {
    fn tables(&self) -> Vec<&str> {
        self.table.iter().chain(&self.tables).map(String::as_str).collect()
    }
}

/// A slot or publication name PostgreSQL accepts: `[a-z0-9_]{1,63}`.
fn valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn hex_digest(text: &str, bytes: usize) -> String {
    sless_runtime::hex::encode(&Sha256::digest(text.as_bytes())[..bytes])
}

/// The error of a slot the server invalidated (`wal_status` `lost`): the
/// changes it held back are gone, and capturing on from a new slot would
/// skip them silently, so the dataflow stops and says so.
fn slot_lost(slot: &str) -> ConnectorError {
    ConnectorError::Config(format!(
        "replication slot {slot} was invalidated by the PostgreSQL server: the WAL it held was removed \
         (max_slot_wal_keep_size), so the changes since the dataflow last confirmed a position are lost. \
         Delete and create the dataflow again to capture from now on, and copy the tables to catch up"
    ))
}

/// What a slot or publication name a spec gives must begin with: `sless_`,
/// 12 hex digits of the SHA-256 of `tenant`, and `_`. (The default names,
/// `sless_` and 20 hex digits, cannot begin so.)
pub fn name_prefix(tenant: &str) -> String {
    format!("sless_{}_", hex_digest(tenant, 6))
}

/// The slot and publication names of a dataflow, and whether they are its
/// defaults.
fn names(config: &PostgresCdcConfig, id: &str) -> (String, String) {
    let slot = config
        .slot_name
        .clone()
        .unwrap_or_else(|| format!("sless_{}", hex_digest(id, 10)));
    let publication = config.publication_name.clone().unwrap_or_else(|| slot.clone());
    (slot, publication)
}

/// The comment a dataflow puts on the publication it makes (letters, digits
/// and spaces: a literal as it is).
fn owner_mark(id: &str) -> String {
    format!("made by sless dataflow {}", hex_digest(id, 8))
}

/// What the comment on a dataflow's publication says: `None` when this
/// dataflow did not make it; else whether a snapshot is pending. Unmarked
/// (made before marks), it is this dataflow's when it has the dataflow's
/// default name, which only this dataflow derives.
fn owned(config: &PostgresCdcConfig, id: &str, comment: Option<&str>) -> Option<bool> {
    let mark = owner_mark(id);
    match comment {
        Some(c) if c == mark => Some(false),
        Some(c) if c.strip_prefix(mark.as_str()).and_then(|rest| rest.strip_prefix("; ")) == Some(SNAPSHOT_PENDING) => {
            Some(true)
        }
        Some(_) => None,
        None => (config.publication_name.is_none() && config.slot_name.is_none()).then_some(false),
    }
}

/// The comment a dataflow puts on its publication: its mark, and whether a
/// snapshot is pending (letters, digits, spaces and `;`: a literal as it is).
fn comment(id: &str, pending: bool) -> String {
    match pending {
        true => format!("{}; {SNAPSHOT_PENDING}", owner_mark(id)),
        false => owner_mark(id),
    }
}

/// The comment on `publication`: `None` when there is no such publication.
async fn publication_comment(
    client: &tokio_postgres::Client,
    publication: &str,
) -> Result<Option<Option<String>>, ConnectorError> {
    Ok(client
        .query_opt(
            "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(ConnectorError::query)?
        .map(|row| row.get::<_, Option<String>>(0)))
}

/// What a start does with the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Stream the slot (made now without a snapshot if missing).
    Stream,
    /// Make the slot with a snapshot, read it, then stream.
    SnapshotThenStream,
    /// Read a snapshot and nothing more (no slot).
    SnapshotOnly,
    /// The snapshot of `initial_only` is written: nothing to read.
    Finished,
}

fn plan(mode: SnapshotMode, slot_exists: bool, pending: Option<bool>) -> Plan {
    match mode {
        SnapshotMode::Never => Plan::Stream,
        // A pending snapshot, a new dataflow, or a slot lost by hand: the
        // rows since the last confirmed change are read again whole.
        SnapshotMode::Initial if pending == Some(true) || !slot_exists => Plan::SnapshotThenStream,
        SnapshotMode::Initial => Plan::Stream,
        SnapshotMode::InitialOnly if pending == Some(false) => Plan::Finished,
        SnapshotMode::InitialOnly => Plan::SnapshotOnly,
    }
}

pub struct PostgresCdcSource {
    mark: Arc<SnapshotMark>,
    batch: usize,
    shared: Arc<Shared>,
    records: tokio::sync::Mutex<Inbox>,
    task: tokio::task::JoinHandle<()>,
}

/// How long a dropped source may take to confirm what is written before
/// its connection is cut.
const CLOSING: Duration = Duration::from_secs(5);

impl Drop for PostgresCdcSource {
    fn drop(&mut self) {
        // The task confirms what is written (a restart would read it
        // again) and closes the replication connection, which frees the
        // slot; cut after CLOSING if the server does not take it.
        self.shared.closing.notify_one();
        let task = self.task.abort_handle();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(CLOSING).await;
                    task.abort();
                });
            }
            Err(_) => task.abort(),
        }
    }
}

impl Component for PostgresCdcSource {
    const KIND: &'static str = "postgresql-cdc";
    type Config = PostgresCdcConfig;

    fn check(c: &PostgresCdcConfig, path: &str, errors: &mut ValidationErrors) {
        either(
            non_empty(&c.connection_string),
            &c.connection_string_secret_ref,
            path,
            "connectionString",
            errors,
        );
        let tables = c.tables();
        if tables.is_empty() {
            errors.push(FieldError::invalid(
                format!("{path}.tables"),
                "table or tables is required",
            ));
        } else if tables.len() > MAX_TABLES {
            errors.push(FieldError::invalid(
                format!("{path}.tables"),
                format!("at most {MAX_TABLES} tables"),
            ));
        }
        let named = c.table.iter().map(|t| (format!("{path}.table"), t));
        let listed = c
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("{path}.tables[{i}]"), t));
        for (field, table) in named.chain(listed) {
            if quote(table).is_err() {
                errors.push(FieldError::invalid(
                    field,
                    "must be name or schema.name, each [A-Za-z_][A-Za-z0-9_]*",
                ));
            } else if names_positions(table) {
                errors.push(FieldError::invalid(field, reserved(table)));
            }
        }
        for (field, value) in [("slotName", &c.slot_name), ("publicationName", &c.publication_name)] {
            if value.as_deref().is_some_and(|v| !valid_name(v)) {
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    "must be [a-z0-9_], 1 to 63 characters",
                ));
            }
        }
        if c.poll_interval == Some(0) {
            errors.push(FieldError::invalid(
                format!("{path}.pollInterval"),
                "must be at least 1 second",
            ));
        }
        if c.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
    }

    fn check_scope(c: &PostgresCdcConfig, scope: &str, path: &str, errors: &mut ValidationErrors) {
        let prefix = name_prefix(scope);
        for (field, value) in [("slotName", &c.slot_name), ("publicationName", &c.publication_name)] {
            if let Some(name) = value.as_deref().filter(|name| !name.starts_with(&prefix)) {
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    format!("{name:?} must begin with {prefix}: slot and publication names are scoped to the tenant"),
                ));
            }
        }
    }
}

/// Removes the spill directories releases before this one made for the
/// slot under the system's temporary directory (`sless-cdc-<slot>-N`),
/// which only a clean stop removed.
async fn remove_old_spill(slot: &str) {
    let prefix = format!("sless-cdc-{slot}-");
    let _ = tokio::task::spawn_blocking(move || {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let ours = entry
                .file_name()
                .to_str()
                .and_then(|name| name.strip_prefix(&prefix))
                .is_some_and(|rest| rest.bytes().all(|b| b.is_ascii_digit()));
            if ours {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    })
    .await;
}

async fn target(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<Target, ConnectorError> {
    let dsn = config
        .connection_string
        .as_deref()
        .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
    Target::of(dsn, &ctx.egress).await
}

/// A slot's confirmed position, if it exists.
async fn slot_position(client: &tokio_postgres::Client, slot: &str) -> Result<Option<u64>, ConnectorError> {
    let Some(row) = client
        .query_opt(
            "SELECT confirmed_flush_lsn::text, plugin::text, wal_status = 'lost' \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(ConnectorError::query)?
    else {
        return Ok(None);
    };
    let plugin: Option<String> = row.get(1);
    if plugin.as_deref() != Some("pgoutput") {
        return Err(ConnectorError::Config(format!(
            "replication slot {slot} exists and is not a pgoutput slot"
        )));
    }
    if row.get::<_, Option<bool>>(2) == Some(true) {
        return Err(slot_lost(slot));
    }
    Ok(Some(
        row.get::<_, Option<String>>(0)
            .as_deref()
            .and_then(parse_lsn)
            .unwrap_or(0),
    ))
}

async fn drop_slot(client: &tokio_postgres::Client, slot: &str) -> Result<(), ConnectorError> {
    // A run still stopping may hold the slot a moment longer.
    let mut attempts = 0;
    loop {
        match client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) && attempts < 20 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(ConnectorError::query(e)),
        }
    }
}

/// The LSN of a `CREATE_REPLICATION_SLOT` answer (its consistent point).
fn consistent_point(rows: &replication::Rows) -> Result<u64, ConnectorError> {
    rows.rows
        .first()
        .and_then(|row| row.get(1).cloned().flatten())
        .as_deref()
        .and_then(parse_lsn)
        .ok_or_else(|| ConnectorError::Closed("CREATE_REPLICATION_SLOT answered no consistent point".into()))
}

#[async_trait]
impl super::Open for PostgresCdcSource {
    const RESUMABLE: bool = true;

    async fn open(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let target = target(config, ctx).await?;
        let client = connect_to(&target).await?;
        let level: String = client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(ConnectorError::query)?
            .get(0);
        if level != "logical" {
            return Err(ConnectorError::Config(format!(
                "change data capture needs wal_level = logical on the PostgreSQL server, which has {level}: \
                 ALTER SYSTEM SET wal_level = logical, then restart it"
            )));
        }
        let (slot, publication) = names(config, &ctx.id);
        let prefix = name_prefix(ctx.tenant());
        for (field, given) in [
            ("slotName", &config.slot_name),
            ("publicationName", &config.publication_name),
        ] {
            if given.as_deref().is_some_and(|name| !name.starts_with(&prefix)) {
                return Err(ConnectorError::Config(format!(
                    "{field} must begin with {prefix}: slot and publication names are scoped to the tenant"
                )));
            }
        }
        let tables = config.tables();
        if let Some(table) = tables.iter().find(|t| names_positions(t)) {
            return Err(ConnectorError::Config(reserved(table)));
        }
        // What an earlier run of this dataflow spilled is nobody's now.
        ctx.budget.remove_spill().await?;
        remove_old_spill(&slot).await;
        let table_list = tables
            .iter()
            .map(|t| quote(t))
            .collect::<Result<Vec<_>, _>>()?
            .join(", ");
        let publication_quoted = quote(&publication)?;
        let existing = publication_comment(&client, &publication).await?;
        let pending = match &existing {
            Some(c) => Some(owned(config, &ctx.id, c.as_deref()).ok_or_else(|| {
                ConnectorError::Config(format!(
                    "publication {publication} exists and was not made by this dataflow"
                ))
            })?),
            None => None,
        };
        let mut position = slot_position(&client, &slot).await?;
        // A slot with no publication of this dataflow's is someone else's.
        if existing.is_none() && position.is_some() {
            return Err(ConnectorError::Config(format!(
                "replication slot {slot} exists and was not made by this dataflow"
            )));
        }
        let plan = plan(config.snapshot, position.is_some(), pending);
        if matches!(plan, Plan::SnapshotOnly | Plan::Finished) && position.is_some() {
            // initial_only (a spec changed to it) holds no WAL.
            drop_slot(&client, &slot).await?;
            position = None;
        }
        let snapshot = matches!(plan, Plan::SnapshotThenStream | Plan::SnapshotOnly);
        let statement = match existing {
            Some(_) => format!("ALTER PUBLICATION {publication_quoted} SET TABLE {table_list}"),
            None => format!("CREATE PUBLICATION {publication_quoted} FOR TABLE {table_list}"),
        };
        // One transaction: a publication is never left without its mark,
        // and "snapshot pending" is there before the slot it is about.
        client
            .batch_execute(&format!(
                "BEGIN; {statement}; COMMENT ON PUBLICATION {publication_quoted} IS '{}'; COMMIT",
                comment(&ctx.id, snapshot)
            ))
            .await
            .map_err(ConnectorError::query)?;
        let batch = config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1) as usize;
        let skip = match &ctx.resume {
            Some(text) => Some(Order::parse(text).ok_or_else(|| {
                ConnectorError::Config(format!(
                    "the sink's stored position {text:?} is not a change capture position"
                ))
            })?),
            None => None,
        };
        let shared = Arc::new(Shared {
            done: AtomicU64::new(0),
            idle: AtomicU64::new(0),
            error: Mutex::new(None),
            reply: Notify::new(),
            wrote: Notify::new(),
            closing: Notify::new(),
        });
        let (sender, records) = mpsc::channel(READ_AHEAD);
        let sender = Outbox {
            out: sender,
            pending: Vec::with_capacity(batch),
            limit: batch,
        };
        let mark = Arc::new(SnapshotMark {
            client: Arc::new(client),
            publication: publication_quoted,
            written: comment(&ctx.id, false),
        });
        let job = match plan {
            Plan::Finished => None,
            _ => {
                let mut repl = replication::connect(&target).await?;
                if snapshot {
                    repl.query("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ").await?;
                }
                let start = match position {
                    Some(confirmed) => confirmed,
                    None if plan == Plan::SnapshotOnly => 0,
                    None => {
                        let how = if snapshot { "USE_SNAPSHOT" } else { "NOEXPORT_SNAPSHOT" };
                        let made = repl
                            .query(&format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput {how}"))
                            .await?;
                        consistent_point(&made)?
                    }
                };
                shared.done.store(start, Ordering::Relaxed);
                tracing::info!(dataflow = %ctx.id, %slot, start = %lsn_text(start), ?plan, "change data capture started");
                Some(Job {
                    repl,
                    plan,
                    tables: tables.iter().map(|t| (*t).to_owned()).collect(),
                    slot: slot.clone(),
                    publication: publication.clone(),
                    start,
                    batch,
                    mark: mark.clone(),
                    skip,
                    spill_dir: ctx.budget.spill_dir.clone(),
                    spill: ctx.budget.spill.clone(),
                })
            }
        };
        let task = tokio::spawn(run(job, sender, shared.clone()));
        Ok(Self {
            mark,
            batch,
            shared,
            records: tokio::sync::Mutex::new(Inbox {
                records,
                leftover: std::collections::VecDeque::new(),
            }),
            task,
        })
    }

    async fn release(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<(), ConnectorError> {
        let client = connect_to(&target(config, ctx).await?).await?;
        let (slot, publication) = names(config, &ctx.id);
        // Only what this dataflow made: another's slot and publication stay.
        match publication_comment(&client, &publication).await? {
            Some(comment) if owned(config, &ctx.id, comment.as_deref()).is_some() => {}
            _ => {
                tracing::info!(dataflow = %ctx.id, %slot, "no slot or publication of this dataflow's to drop");
                return Ok(());
            }
        }
        drop_slot(&client, &slot).await?;
        client
            .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote(&publication)?))
            .await
            .map_err(ConnectorError::query)?;
        tracing::info!(dataflow = %ctx.id, %slot, "change data capture slot and publication dropped");
        Ok(())
    }
}

/// The snapshot's rows are all written: a restart streams on instead of
/// reading them again.
struct SnapshotMark {
    client: Arc<tokio_postgres::Client>,
    /// The publication, quoted.
    publication: String,
    /// Its comment once the snapshot is written.
    written: String,
}

impl SnapshotMark {
    async fn written(&self) -> Result<(), ConnectorError> {
        self.client
            .batch_execute(&format!(
                "COMMENT ON PUBLICATION {} IS '{}'",
                self.publication, self.written
            ))
            .await
            .map_err(ConnectorError::query)?;
        tracing::info!(publication = %self.publication, "snapshot written");
        Ok(())
    }
}

#[async_trait]
impl Source for PostgresCdcSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        let mut inbox = self.records.lock().await;
        if inbox.leftover.is_empty() {
            match inbox.records.recv().await {
                Some(chunk) => inbox.leftover.extend(chunk),
                None => {
                    return Err(self
                        .shared
                        .error
                        .lock_unpoisoned()
                        .take()
                        .unwrap_or_else(|| ConnectorError::Closed("the replication stream ended".into())));
                }
            }
        }
        // Up to a batch, with what else is decoded already.
        while inbox.leftover.len() < self.batch
            && let Ok(chunk) = inbox.records.try_recv()
        {
            inbox.leftover.extend(chunk);
        }
        let take = inbox.leftover.len().min(self.batch);
        Ok(inbox.leftover.drain(..take).collect())
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        let newest = done
            .iter()
            .filter_map(|p| match p {
                Position::Change { confirms, .. } => Some(*confirms),
                _ => None,
            })
            .max();
        if let Some(newest) = newest
            && self.shared.done.fetch_max(newest, Ordering::AcqRel) < newest
        {
            self.shared.wrote.notify_one();
        }
        if done.contains(&Position::SnapshotRow { last: true }) {
            self.mark.written().await?;
        }
        Ok(())
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        last_change(done).map(Order::text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_snapshot_is_read_again_and_initial_only_finishes_once_written() {
        use SnapshotMode::{Initial, InitialOnly, Never};
        // (mode, slot exists, publication's snapshot pending: None = no publication)
        let cases = [
            (Initial, false, None, Plan::SnapshotThenStream),
            (Initial, true, Some(false), Plan::Stream),
            (Initial, true, Some(true), Plan::SnapshotThenStream),
            (Initial, false, Some(false), Plan::SnapshotThenStream),
            (Never, false, None, Plan::Stream),
            (Never, true, Some(true), Plan::Stream),
            (InitialOnly, false, None, Plan::SnapshotOnly),
            (InitialOnly, false, Some(true), Plan::SnapshotOnly),
            (InitialOnly, false, Some(false), Plan::Finished),
            (InitialOnly, true, Some(false), Plan::Finished),
        ];
        for (mode, slot, pending, want) in cases {
            assert_eq!(plan(mode, slot, pending), want, "{mode:?} {slot} {pending:?}");
        }
    }

    #[test]
    fn only_this_dataflows_marks_are_its_own() {
        let config: PostgresCdcConfig = serde_json::from_value(serde_json::json!({"table": "t"})).unwrap();
        let named: PostgresCdcConfig =
            serde_json::from_value(serde_json::json!({"table": "t", "publicationName": "p"})).unwrap();
        assert_eq!(owned(&config, "a/f", Some(&comment("a/f", false))), Some(false));
        assert_eq!(owned(&config, "a/f", Some(&comment("a/f", true))), Some(true));
        assert_eq!(owned(&config, "a/g", Some(&comment("a/f", true))), None);
        assert_eq!(owned(&config, "a/f", Some("made by someone")), None);
        assert_eq!(
            owned(&config, "a/f", None),
            Some(false),
            "unmarked with the default name"
        );
        assert_eq!(owned(&named, "a/f", None), None, "unmarked with a name a spec gave");
        let snapshot: PostgresCdcConfig =
            serde_json::from_value(serde_json::json!({"table": "t", "snapshot": "initial_only"})).unwrap();
        assert_eq!(snapshot.snapshot, SnapshotMode::InitialOnly);
        assert!(
            serde_json::from_value::<PostgresCdcConfig>(serde_json::json!({"table": "t", "snapshot": "always"}))
                .is_err()
        );
    }

    #[test]
    fn default_names_are_valid_and_differ_by_dataflow() {
        let config: PostgresCdcConfig = serde_json::from_value(serde_json::json!({"table": "t"})).unwrap();
        let (a, pa) = names(&config, "a/flow");
        let (b, _) = names(&config, "b/flow");
        assert!(valid_name(&a) && valid_name(&b) && a != b);
        assert_eq!(a, pa);
        assert!(!valid_name("Bad-Name") && !valid_name("") && !valid_name(&"x".repeat(64)));
    }
}
