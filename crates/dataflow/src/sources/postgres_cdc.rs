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
//! (in memory, then in a file) until its commit ([`super::pgoutput_streams`]).
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
//! Over 500 lines as one component's file (its config, rules, the slot and
//! publication it owns, the snapshot, reading and confirming), as every
//! component is one file; the pgoutput decoder and the replication client
//! are files of their own.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, mpsc};

use super::pgoutput::{Decoder, lsn_text, parse_lsn, snapshot_event, value_of};
use super::pgoutput_streams::{Step, Streams};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::component::{either, non_empty};
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sql::replication::{self, ChangeStream, KEEPALIVE_ASK, ReplicationError, StatusWriter, Streamed};
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
    Sha256::digest(text.as_bytes())[..bytes]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
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

/// What the reading task and the pipeline's calls share.
struct Shared {
    /// Every change before this LSN is written downstream.
    done: AtomicU64,
    /// Where the slot may move with nothing in flight: the WAL a keepalive
    /// said was sent when every change handed out was written.
    idle: AtomicU64,
    /// Why the reading task ended.
    error: Mutex<Option<ConnectorError>>,
    /// The server asked for a status update.
    reply: Notify,
    /// `done` moved.
    wrote: Notify,
    /// The source is dropped: confirm what is written, and end.
    closing: Notify,
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

/// What the reading task does.
struct Job {
    repl: replication::Connection,
    plan: Plan,
    tables: Vec<String>,
    slot: String,
    publication: String,
    /// The slot's confirmed position, or its consistent point when made now.
    start: u64,
    batch: usize,
    mark: Arc<SnapshotMark>,
    /// What an exactly-once sink holds already.
    skip: Option<Order>,
}

/// Reads the snapshot and the stream into `out` until it fails; the error
/// is kept for [`Source::read`], which sees the channel close after the
/// records sent before it.
async fn run(job: Option<Job>, mut out: Outbox, shared: Arc<Shared>) {
    let ended = match job {
        Some(job) => read_all(job, &mut out, &shared).await,
        None => Ok(()),
    };
    match ended {
        Err(e) => {
            *shared.error.lock_unpoisoned() = Some(e);
        }
        // Read everything there is to read: hand out nothing more.
        Ok(()) => {
            let _out = out;
            std::future::pending::<()>().await;
        }
    }
}

/// Records on their way to [`Source::read`], a batch's worth at a time:
/// one channel message (and one wake-up of the reader) a batch, not a record.
struct Outbox {
    out: mpsc::Sender<Vec<Record>>,
    pending: Vec<Record>,
    /// A batch.
    limit: usize,
}

impl Outbox {
    async fn push(&mut self, message: Value, position: Position) -> Result<(), ConnectorError> {
        self.pending.push(Record {
            message: Message::new(message),
            position,
        });
        if self.pending.len() >= self.limit {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what is pending (waiting while the reader is behind).
    async fn flush(&mut self) -> Result<(), ConnectorError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(self.limit));
        self.out.send(chunk).await.map_err(|_| ConnectorError::Stopped)
    }
}

/// What [`Source::read`] takes records from.
struct Inbox {
    records: mpsc::Receiver<Vec<Record>>,
    /// Records of a chunk beyond the last batch handed out.
    leftover: std::collections::VecDeque<Record>,
}

async fn read_all(mut job: Job, out: &mut Outbox, shared: &Shared) -> Result<(), ConnectorError> {
    if matches!(job.plan, Plan::SnapshotThenStream | Plan::SnapshotOnly) {
        let any = snapshot(&mut job, out).await?;
        job.repl.query("COMMIT").await?;
        if !any {
            // No row whose writing completes it: it is complete.
            job.mark.written().await?;
        }
        if job.plan == Plan::SnapshotOnly {
            return Ok(());
        }
    }
    // Protocol 2 streams a transaction larger than the server's
    // logical_decoding_work_mem while it runs (PostgreSQL 14 on), instead of
    // the server spilling it to disk and sending it at its commit.
    let protocol = if job.repl.server_major >= 14 {
        "proto_version '2', streaming 'on'"
    } else {
        "proto_version '1'"
    };
    let options = format!("{protocol}, publication_names '{}'", job.publication);
    let streams = Streams::new(std::env::temp_dir().join(format!("sless-cdc-{}-{}", job.slot, rand::random::<u32>())));
    let (stream, status) = match job.repl.start_replication(&job.slot, job.start, &options).await {
        Ok(started) => started,
        Err(ReplicationError::Server { code, message }) if code == "55000" => {
            return Err(ConnectorError::Closed(message));
        }
        Err(e) => return Err(e.into()),
    };
    let confirming = confirm(status, job.start, shared);
    tokio::pin!(confirming);
    tokio::select! {
        read = stream_changes(stream, job.start, job.skip, streams, out, shared) => match read {
            // The source is dropped: confirm what it wrote first.
            Err(ConnectorError::Stopped) => confirming.await,
            other => other,
        },
        confirmed = &mut confirming => confirmed,
    }
}

/// Reads the tables in the snapshot of the open transaction, handing each
/// row out as an `op: r` event; the last one's position completes the
/// snapshot. Whether there was a row.
async fn snapshot(job: &mut Job, out: &mut Outbox) -> Result<bool, ConnectorError> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut held: Option<Value> = None;
    let mut rows_read = 0u64;
    for (i, table) in job.tables.iter().enumerate() {
        let quoted = quote(table)?;
        // Names as the catalog has them (the table as written may rely
        // on the search path). Quoted names are [A-Za-z0-9_."] only.
        let named = job
            .repl
            .query(&format!(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.oid = '{quoted}'::regclass"
            ))
            .await?;
        let (schema, name) = match named.rows.first().map(|r| r.as_slice()) {
            Some([Some(schema), Some(name)]) => (schema.clone(), name.clone()),
            _ => return Err(ConnectorError::Config(format!("table {table} not found"))),
        };
        let cursor = format!("sless_snapshot_{i}");
        job.repl
            .query(&format!("DECLARE {cursor} NO SCROLL CURSOR FOR SELECT * FROM {quoted}"))
            .await?;
        loop {
            let fetched = job
                .repl
                .query(&format!("FETCH FORWARD {} FROM {cursor}", job.batch))
                .await?;
            if fetched.rows.is_empty() {
                break;
            }
            for row in fetched.rows {
                let mut object = Map::with_capacity(row.len());
                for ((column, oid), value) in fetched.columns.iter().zip(row) {
                    let value = value.map_or(Value::Null, |text| value_of(*oid, &text));
                    object.insert(column.clone(), value);
                }
                let event = snapshot_event(&schema, &name, Value::Object(object), job.start, now_ms);
                if let Some(previous) = held.replace(event) {
                    out.push(previous, Position::SnapshotRow { last: false }).await?;
                }
                rows_read += 1;
            }
        }
        job.repl.query(&format!("CLOSE {cursor}")).await?;
    }
    tracing::info!(slot = %job.slot, rows = rows_read, "snapshot read");
    match held {
        Some(last) => {
            out.push(last, Position::SnapshotRow { last: true }).await?;
            out.flush().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The changes being handed out. A change confirms its transaction only
/// when it is the last one: the others carry the end of the transaction
/// before, so a crash in the middle of a transaction delivers it again from
/// its start. Changes at or before `skip` (what an exactly-once sink holds
/// already) are not handed out.
struct Changes {
    decoder: Decoder,
    decoded: Vec<Value>,
    /// The newest change and its order, held until the next one or its
    /// commit shows whether it is its transaction's last.
    held: Option<(Value, Order)>,
    /// The end of the last transaction read, and of the last one handed out.
    read_upto: u64,
    handed_upto: u64,
    next: Order,
    skip: Option<Order>,
}

impl Changes {
    /// Decodes one pgoutput message and hands out what it completes.
    async fn feed(&mut self, lsn: u64, data: &[u8], out: &mut Outbox) -> Result<(), ConnectorError> {
        let end = self
            .decoder
            .feed(lsn, data, &mut self.decoded)
            .map_err(|e| ConnectorError::Closed(e.to_string()))?;
        if let Some(commit) = self.decoder.commit_lsn()
            && commit != self.next.commit
        {
            self.next = Order { commit, index: 0 };
        }
        let skip = self.skip;
        for change in self.decoded.drain(..) {
            if let Some((previous, order)) = self.held.replace((change, self.next))
                && skip.is_none_or(|skip| order > skip)
            {
                out.push(previous, order.position(self.read_upto)).await?;
            }
            self.next.index += 1;
        }
        if let Some(end) = end {
            if let Some((last, order)) = self.held.take()
                && skip.is_none_or(|skip| order > skip)
            {
                out.push(last, order.position(end)).await?;
                self.handed_upto = end;
            }
            self.read_upto = end;
        }
        Ok(())
    }
}

/// Hands the stream's changes out as they are decoded; a transaction the
/// server streams while in progress (protocol 2) when it commits.
async fn stream_changes(
    mut stream: ChangeStream,
    start: u64,
    skip: Option<Order>,
    mut streams: Streams,
    out: &mut Outbox,
    shared: &Shared,
) -> Result<(), ConnectorError> {
    let mut changes = Changes {
        decoder: Decoder::default(),
        decoded: Vec::new(),
        held: None,
        read_upto: start,
        handed_upto: start,
        next: Order::default(),
        skip,
    };
    loop {
        // Nothing more arrived yet: hand out what is decoded.
        if !stream.buffered() {
            out.flush().await?;
        }
        match stream.next().await? {
            Streamed::Data { start: lsn, data } => match streams.take(lsn, &data).await? {
                Step::Decode => changes.feed(lsn, &data, out).await?,
                Step::Kept => {}
                Step::Commit { xid, begin, commit } => {
                    changes.feed(lsn, &begin, out).await?;
                    let mut replay = streams.replay(xid);
                    while let Some(messages) = replay.next().await? {
                        for (at, message) in messages {
                            changes.feed(at, &message, out).await?;
                        }
                    }
                    changes.feed(lsn, &commit, out).await?;
                }
            },
            Streamed::Keepalive { wal_end, reply } => {
                // Nothing open and everything handed out written: the
                // WAL sent so far holds nothing more of ours (a transaction
                // still streaming commits later, and comes again).
                if !changes.decoder.in_transaction() && shared.done.load(Ordering::Acquire) >= changes.handed_upto {
                    shared.idle.fetch_max(wal_end, Ordering::AcqRel);
                }
                if reply {
                    shared.reply.notify_one();
                }
            }
        }
    }
}

/// Where a change is in commit order: its transaction's commit LSN and its
/// place in the transaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Order {
    commit: u64,
    index: u32,
}

/// The order of the last change among `done` (snapshot rows have none).
fn last_change(done: &[Position]) -> Option<Order> {
    done.iter().rev().find_map(|p| match *p {
        Position::Change { commit, index, .. } => Some(Order { commit, index }),
        _ => None,
    })
}

impl Order {
    /// The position of the change at this order, which confirms `confirms`.
    fn position(self, confirms: u64) -> Position {
        Position::Change {
            confirms,
            commit: self.commit,
            index: self.index,
        }
    }

    /// As an exactly-once sink stores it.
    fn text(self) -> String {
        format!("cdc:{}:{}", lsn_text(self.commit), self.index)
    }

    fn parse(text: &str) -> Option<Self> {
        let (commit, index) = text.strip_prefix("cdc:")?.rsplit_once(':')?;
        Some(Self {
            commit: parse_lsn(commit)?,
            index: index.parse().ok()?,
        })
    }
}

/// Confirms written changes to the server as they are written, at once
/// when it asks, and asks for a keepalive every [`KEEPALIVE_ASK`] (which
/// keeps an idle slot moving and shows the server is there). Ends once the
/// source is dropped, with what is written confirmed.
async fn confirm(mut status: StatusWriter, start: u64, shared: &Shared) -> Result<(), ConnectorError> {
    let mut sent = start;
    let mut asked: Option<Instant> = None;
    let mut tick = tokio::time::interval(KEEPALIVE_ASK / 4);
    loop {
        let (asked_for, closing) = tokio::select! {
            _ = tick.tick() => (false, false),
            () = shared.wrote.notified() => (false, false),
            () = shared.reply.notified() => (true, false),
            () = shared.closing.notified() => (false, true),
        };
        let upto = shared
            .done
            .load(Ordering::Acquire)
            .max(shared.idle.load(Ordering::Acquire))
            .max(start);
        let ask = asked.is_none_or(|at| at.elapsed() >= KEEPALIVE_ASK);
        if upto != sent || ask || asked_for {
            status.status(upto, ask).await?;
            sent = upto;
            if ask {
                asked = Some(Instant::now());
            }
        }
        if closing {
            return Ok(());
        }
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
    fn change_orders_round_trip_and_sort_by_commit_then_index() {
        let a = Order {
            commit: 0x1_0000_0010,
            index: 7,
        };
        assert_eq!(Order::parse(&a.text()), Some(a));
        assert!(
            a < Order {
                commit: a.commit,
                index: 8
            }
        );
        assert!(
            Order {
                commit: 0x20,
                index: 99
            } < a
        );
        for bad in ["", "cdc:", "cdc:1/2", "cdc:x/2:3", "kafka:1/2:3", "cdc:1/2:-1"] {
            assert_eq!(Order::parse(bad), None, "{bad}");
        }
        let source_done = [
            Position::SnapshotRow { last: true },
            Position::Change {
                confirms: 5,
                commit: 0x30,
                index: 1,
            },
            Position::SnapshotRow { last: false },
        ];
        assert_eq!(
            last_change(&source_done).map(Order::text).as_deref(),
            Some("cdc:0/30:1")
        );
        assert_eq!(last_change(&source_done[..1]), None, "snapshot rows store no position");
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
