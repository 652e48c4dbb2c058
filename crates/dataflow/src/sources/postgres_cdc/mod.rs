//! PostgreSQL change data capture (`postgresql-cdc`): the published
//! tables' existing rows (the initial snapshot) and their inserts,
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
//! The snapshot (`snapshot: initial`, the default): on PostgreSQL 14 and
//! later the tables are read in chunks by key while the stream runs, with
//! watermarks ([`chunks`]), and a crash goes on after the last snapshot
//! row written. The publication's comment says "snapshot pending" until
//! every snapshot row is written downstream; a dataflow that starts and
//! finds it pending goes on with the snapshot. Tables the tenant asks to be
//! read again (`DataFlowSpec::snapshots`, each request read once) are read
//! the same way, beside the stream ([`chunks::asked_again`]).
//!
//! Before PostgreSQL 14 (no logical messages for watermarks), and for
//! `initial_only` (no stream), the slot is made with `USE_SNAPSHOT` inside
//! a repeatable-read transaction on the replication connection, which then
//! reads the tables whole (`op: r` events) in exactly the state the slot
//! streams from. A dataflow that finds that snapshot pending (a crash in
//! it) keeps the slot, which has confirmed nothing yet, reads the tables
//! again whole in a new snapshot, and then streams from the slot's start:
//! rows written before the crash come again, and changes made since the
//! slot's start come after the new snapshot even where it already holds
//! them, so a consumer applying events in order ends with the tables'
//! state (at least once; no row and no delete is lost).
//!
//! A slot found missing while the publication is there (dropped by hand)
//! is made again with a new snapshot; deletes made while there was no slot
//! are not seen.
//! `never` streams from the slot's creation only; `initial_only` reads the
//! rows, keeps no slot, and then reads nothing more.
//!
//! A database server may be shared by tenants: a slot or publication name a
//! spec gives must begin with its tenant's prefix ([`name_prefix`]), and a
//! dataflow adopts or drops only the publication it made (marked with a
//! comment naming the dataflow) and the slot that goes with it. A database
//! role per tenant is still the real boundary.
//!
//! This file holds the component: its config and rules, opening (the slot
//! and publication it owns) and the pipeline's calls. Beside it, by
//! concern: the names and ownership marks (`names.rs`), the slot and what
//! a start does with it (`slot.rs`), the snapshot in chunks (`chunks.rs`)
//! and whole (`snapshot.rs`), the
//! reading task (`reading.rs`: the replication stream handed out in
//! batches, and confirmations), the pgoutput decoder (`pgoutput.rs`), the
//! transactions streamed in progress (`streams.rs`), and change positions
//! (`position.rs`). The replication protocol client is
//! [`crate::sql::replication`].

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tokio::sync::{Notify, mpsc};

mod chunks;
mod names;
mod pgoutput;
mod position;
mod reading;
mod slot;
mod snapshot;
mod streams;

use self::chunks::{Chunking, Cursor, DEFAULT_CHUNK, MAX_CHUNK};
pub use self::names::name_prefix;
use self::names::{comment, names, owned, publication_comment, valid_name};
use self::pgoutput::{Domains, lsn_text};
use self::position::{Order, last_change};
use self::reading::{Inbox, Job, Outbox, Shared, run};
use self::slot::{Plan, consistent_point, drop_slot, plan, slot_position};
use self::snapshot::SnapshotMark;
use self::streams::remove_old_spill;
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
    /// Rows a chunk of the snapshot reads (PostgreSQL 14 on). Default 5000.
    pub snapshot_chunk_size: Option<u32>,
}

impl PostgresCdcConfig {
    /// The captured tables as the config names them.
    pub fn tables(&self) -> Vec<&str> {
        self.table.iter().chain(&self.tables).map(String::as_str).collect()
    }
}

pub struct PostgresCdcSource {
    mark: Arc<SnapshotMark>,
    chunks: Option<Arc<Chunking>>,
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
        if c.snapshot_chunk_size.is_some_and(|n| !(1..=MAX_CHUNK).contains(&n)) {
            errors.push(FieldError::invalid(
                format!("{path}.snapshotChunkSize"),
                format!("must be 1 to {MAX_CHUNK}"),
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

async fn target(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<Target, ConnectorError> {
    let dsn = config
        .connection_string
        .as_deref()
        .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
    Target::of(dsn, &ctx.egress).await
}

/// Where a start's chunked snapshot begins, and where its slot began: the
/// tables asked for again (`again`), else from the first table on a new
/// slot, else after what the exactly-once sink holds (`written`) or where
/// the dataflow's checkpoint says.
async fn snapshot_from(
    ctx: &PipelineContext,
    tables: &[String],
    slot_exists: bool,
    written: Option<(Order, Option<Cursor>)>,
    again: Option<(Cursor, Option<u64>)>,
) -> Result<(Cursor, Option<u64>), ConnectorError> {
    Ok(match (again, slot_exists) {
        (Some(again), _) => again,
        (None, true) => chunks::resume(ctx.checkpoint.as_ref(), tables, written, &ctx.snapshots).await?,
        (None, false) => (Cursor::of(tables, &ctx.snapshots), None),
    })
}

/// The chunked snapshot of a start from `cursor`, saved before anything
/// is read (for a new slot, before the slot is made).
async fn chunking(
    config: &PostgresCdcConfig,
    ctx: &PipelineContext,
    slot: &str,
    mark: &Arc<SnapshotMark>,
    (cursor, since): (Cursor, Option<u64>),
    domains: &Domains,
) -> Result<Arc<Chunking>, ConnectorError> {
    tracing::info!(dataflow = %ctx.id, tables = ?cursor.tables, after = cursor.after.is_some(), "snapshot in chunks");
    let size = config.snapshot_chunk_size.unwrap_or(DEFAULT_CHUNK).clamp(1, MAX_CHUNK);
    let store = ctx.checkpoint.clone();
    let chunking = Arc::new(Chunking::new(
        slot,
        size,
        store,
        mark.clone(),
        cursor,
        since,
        domains.clone(),
    ));
    chunking.start().await?;
    Ok(chunking)
}

/// Each domain's base type on the server (through domains over domains).
async fn domains(client: &tokio_postgres::Client) -> Result<Domains, ConnectorError> {
    let rows = client
        .query(
            "WITH RECURSIVE d(oid, base) AS ( \
               SELECT oid, typbasetype FROM pg_type WHERE typtype = 'd' \
               UNION ALL SELECT d.oid, t.typbasetype FROM d JOIN pg_type t ON t.oid = d.base WHERE t.typtype = 'd') \
             SELECT d.oid, d.base FROM d JOIN pg_type t ON t.oid = d.base WHERE t.typtype <> 'd'",
            &[],
        )
        .await
        .map_err(ConnectorError::query)?;
    Ok(Domains::new(rows.iter().map(|row| (row.get(0), row.get(1))).collect()))
}

/// Reading tables again while the stream runs needs watermarks, which
/// logical messages carry from PostgreSQL 14 on.
async fn needs_watermarks(client: &tokio_postgres::Client) -> Result<(), ConnectorError> {
    let version: String = client
        .query_one("SHOW server_version_num", &[])
        .await
        .map_err(ConnectorError::query)?
        .get(0);
    match version.parse::<u32>() {
        Ok(v) if v >= 140_000 => Ok(()),
        _ => Err(ConnectorError::Config(format!(
            "reading tables again (a snapshot request) needs PostgreSQL 14 or later, whose logical messages \
             carry the snapshot's watermarks; this server is version {version}"
        ))),
    }
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
        let domains = domains(&client).await?;
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
        let mut plan = plan(config.snapshot, position.is_some(), pending, !ctx.snapshots.is_empty());
        if matches!(plan, Plan::SnapshotOnly | Plan::Finished) && position.is_some() {
            // initial_only (a spec changed to it) holds no WAL.
            drop_slot(&client, &slot).await?;
            position = None;
        }
        let table_names: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
        let again = match (plan, position) {
            (Plan::Stream, Some(confirmed)) => {
                chunks::asked_again(ctx.checkpoint.as_ref(), &table_names, &ctx.snapshots, confirmed).await?
            }
            _ => None,
        };
        if let Some((cursor, _)) = &again {
            needs_watermarks(&client).await?;
            tracing::info!(dataflow = %ctx.id, tables = ?cursor.tables, request = cursor.requested, "tables asked for again");
            plan = Plan::SnapshotThenStream;
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
        let (skip, resumed) = match &ctx.resume {
            Some(text) => {
                let (order, cursor) = chunks::parse_resume(text).ok_or_else(|| {
                    ConnectorError::Config(format!(
                        "the sink's stored position {text:?} is not a change capture position"
                    ))
                })?;
                (Some(order), Some((order, cursor)))
            }
            None => (None, None),
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
        let mut chunks = None;
        let job = match plan {
            Plan::Finished => None,
            _ => {
                let mut repl = replication::connect(&target).await?;
                // From PostgreSQL 14 the snapshot is read in chunks while
                // the stream runs; before, in the slot's exported snapshot.
                let chunked = plan == Plan::SnapshotThenStream && repl.server_major >= 14;
                let exported = snapshot && !chunked;
                if exported {
                    repl.query("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ").await?;
                }
                let chunking = match chunked {
                    true => {
                        let from = snapshot_from(ctx, &table_names, position.is_some(), resumed, again).await?;
                        Some(chunking(config, ctx, &slot, &mark, from, &domains).await?)
                    }
                    false => None,
                };
                let start = match position {
                    Some(confirmed) => confirmed,
                    None if plan == Plan::SnapshotOnly => 0,
                    None => {
                        let how = if exported { "USE_SNAPSHOT" } else { "NOEXPORT_SNAPSHOT" };
                        let made = repl
                            .query(&format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput {how}"))
                            .await?;
                        let since = consistent_point(&made)?;
                        if let Some(chunking) = &chunking {
                            chunking.slot_made(since).await?;
                        }
                        since
                    }
                };
                let mut job_chunks = None;
                if let Some(chunking) = chunking {
                    chunks = Some(chunking.clone());
                    job_chunks = Some((chunking, replication::connect(&target).await?));
                }
                shared.done.store(start, Ordering::Relaxed);
                tracing::info!(dataflow = %ctx.id, %slot, start = %lsn_text(start), ?plan, chunked, "change data capture started");
                Some(Job {
                    repl,
                    plan,
                    tables: table_names,
                    slot: slot.clone(),
                    publication: publication.clone(),
                    start,
                    batch,
                    mark: mark.clone(),
                    skip,
                    spill_dir: ctx.budget.spill_dir.clone(),
                    spill: ctx.budget.spill.clone(),
                    chunks: job_chunks,
                    domains,
                })
            }
        };
        let task = tokio::spawn(run(job, sender, shared.clone()));
        Ok(Self {
            mark,
            chunks,
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
        if let (Some(chunks), Some(newest)) = (&self.chunks, last_change(done)) {
            chunks.written(newest).await?;
        }
        Ok(())
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        let last = last_change(done)?;
        Some(match &self.chunks {
            Some(chunks) => chunks.resume_text(last),
            None => last.text(),
        })
    }
}
