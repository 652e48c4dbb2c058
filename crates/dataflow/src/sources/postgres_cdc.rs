//! PostgreSQL change data capture (`postgresql-cdc`): inserts, updates,
//! deletes and truncates of the published tables, in commit order, as
//! Debezium-shaped events (`before`, `after`, `op`, `source`).
//!
//! It reads a logical replication slot with the `pgoutput` plugin through
//! `pg_logical_slot_peek_binary_changes` over an ordinary connection, so no
//! replication connection (and no `replication` line in pg_hba.conf) is
//! needed. Peeking does not consume: the slot moves only when `commit`
//! confirms a transaction whose every change is written
//! (`pg_replication_slot_advance`, at most once a second while changes keep
//! coming, since it decodes WAL again), so the slot's confirmed LSN is the
//! checkpoint, and a crash delivers again from the last confirmed
//! transaction; nothing is skipped. The slot and the publication are made
//! when the dataflow starts and dropped when it is deleted
//! ([`super::Open::release`]); a slot left behind keeps WAL on the server.
//!
//! A database server may be shared by tenants: a slot or publication name a
//! spec gives must begin with its tenant's prefix ([`name_prefix`]), and a
//! dataflow adopts or drops only the publication it made (marked with a
//! comment naming the dataflow) and the slot that goes with it. A database
//! role per tenant is still the real boundary.
//!
//! Only changes made after the slot exists are captured (no initial
//! snapshot: copy existing rows with a `postgresql` source). A transaction
//! is read whole, however large.
//!
//! Over 500 lines as one component's file (its config, rules, the slot and
//! publication it owns, reading and confirming), as every component is one
//! file; the pgoutput decoder is a file of its own.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::pgoutput::{Decoder, lsn_text, parse_lsn};
use super::{DEFAULT_BATCH, Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::component::{either, non_empty};
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sql::{connect, quote};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};
use sless_runtime::sync::Unpoisoned;

/// Most tables one publication lists.
pub const MAX_TABLES: usize = 100;
const DEFAULT_POLL: Duration = Duration::from_secs(1);
/// Longest the slot waits behind written changes while changes keep coming.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// Batches one peek reads ahead: each peek starts a decoding session (about
/// 80 ms here whatever it reads), so few large peeks beat many small ones.
const READ_AHEAD: usize = 16;

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
    /// Seconds between polls when nothing changed. Default 1.
    pub poll_interval: Option<u32>,
    /// Changes written and confirmed together. Default 1000.
    pub batch_size: Option<u32>,
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

/// Whether this dataflow made its publication, whose comment is `comment`:
/// its mark is on it, or (made before marks) it is unmarked and has the
/// dataflow's default name, which only this dataflow derives.
fn owns(config: &PostgresCdcConfig, id: &str, comment: Option<&str>) -> bool {
    match comment {
        Some(mark) => mark == owner_mark(id),
        None => config.publication_name.is_none() && config.slot_name.is_none(),
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

/// What has been read and not yet confirmed.
#[derive(Debug, Default)]
struct State {
    decoder: Decoder,
    /// The end of the last transaction handed out.
    read_upto: u64,
    /// The slot's confirmed position.
    confirmed: u64,
    /// Where every change before is written: the slot may move here.
    done: u64,
    /// When the slot last moved.
    advanced: Option<std::time::Instant>,
    /// Transactions handed out and not confirmed: end LSN, messages.
    in_flight: VecDeque<(u64, usize)>,
}

impl State {
    /// Messages a peek decodes again before it reaches new ones.
    fn pending(&self) -> usize {
        self.in_flight.iter().map(|(_, m)| m).sum()
    }
}

pub struct PostgresCdcSource {
    client: tokio_postgres::Client,
    slot: String,
    publication: String,
    batch: usize,
    poll: Duration,
    state: Mutex<State>,
    /// Woken when the slot moves, so a reader waiting behind transactions
    /// in flight peeks again at once.
    confirmed: tokio::sync::Notify,
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

async fn connect_checked(
    config: &PostgresCdcConfig,
    ctx: &PipelineContext,
) -> Result<tokio_postgres::Client, ConnectorError> {
    let dsn = config
        .connection_string
        .as_deref()
        .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
    connect(dsn, &ctx.egress).await
}

#[async_trait]
impl super::Open for PostgresCdcSource {
    async fn open(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let client = connect_checked(config, ctx).await?;
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
        let tables = config
            .tables()
            .into_iter()
            .map(quote)
            .collect::<Result<Vec<_>, _>>()?
            .join(", ");
        let publication_quoted = quote(&publication)?;
        let slot_exists = client
            .query_opt("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
            .await
            .map_err(ConnectorError::query)?
            .is_some();
        let mark = owner_mark(&ctx.id);
        let statement = match publication_comment(&client, &publication).await? {
            Some(comment) if owns(config, &ctx.id, comment.as_deref()) => format!(
                "ALTER PUBLICATION {publication_quoted} SET TABLE {tables}; \
                 COMMENT ON PUBLICATION {publication_quoted} IS '{mark}'"
            ),
            Some(_) => {
                return Err(ConnectorError::Config(format!(
                    "publication {publication} exists and was not made by this dataflow"
                )));
            }
            // A slot with no publication of this dataflow's is someone else's.
            None if slot_exists => {
                return Err(ConnectorError::Config(format!(
                    "replication slot {slot} exists and was not made by this dataflow"
                )));
            }
            None => format!(
                "CREATE PUBLICATION {publication_quoted} FOR TABLE {tables}; \
                 COMMENT ON PUBLICATION {publication_quoted} IS '{mark}'"
            ),
        };
        // One transaction: a publication is never left without its mark.
        client
            .batch_execute(&format!("BEGIN; {statement}; COMMIT"))
            .await
            .map_err(ConnectorError::query)?;
        let confirmed = match client
            .query_opt(
                "SELECT confirmed_flush_lsn::text, plugin::text, wal_status = 'lost' \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(ConnectorError::query)?
        {
            Some(row) => {
                let plugin: Option<String> = row.get(1);
                if plugin.as_deref() != Some("pgoutput") {
                    return Err(ConnectorError::Config(format!(
                        "replication slot {slot} exists and is not a pgoutput slot"
                    )));
                }
                if row.get::<_, Option<bool>>(2) == Some(true) {
                    return Err(slot_lost(&slot));
                }
                row.get::<_, Option<String>>(0)
            }
            None => client
                .query_one(
                    "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&slot],
                )
                .await
                .map_err(ConnectorError::query)?
                .get::<_, Option<String>>(0),
        };
        let confirmed = confirmed.as_deref().and_then(parse_lsn).unwrap_or(0);
        tracing::info!(dataflow = %ctx.id, %slot, confirmed = %lsn_text(confirmed), "change data capture started");
        Ok(Self {
            client,
            slot,
            publication,
            batch: config.batch_size.unwrap_or(DEFAULT_BATCH as u32).max(1) as usize,
            poll: config
                .poll_interval
                .map_or(DEFAULT_POLL, |s| Duration::from_secs(u64::from(s.max(1)))),
            state: Mutex::new(State {
                read_upto: confirmed,
                confirmed,
                ..State::default()
            }),
            confirmed: tokio::sync::Notify::new(),
        })
    }

    async fn release(config: &PostgresCdcConfig, ctx: &PipelineContext) -> Result<(), ConnectorError> {
        let client = connect_checked(config, ctx).await?;
        let (slot, publication) = names(config, &ctx.id);
        // Only what this dataflow made: another's slot and publication stay.
        match publication_comment(&client, &publication).await? {
            Some(comment) if owns(config, &ctx.id, comment.as_deref()) => {}
            _ => {
                tracing::info!(dataflow = %ctx.id, %slot, "no slot or publication of this dataflow's to drop");
                return Ok(());
            }
        }
        // A processor still stopping may hold the slot a moment longer.
        let mut attempts = 0;
        loop {
            match client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                    &[&slot],
                )
                .await
            {
                Ok(_) => break,
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_IN_USE) && attempts < 20 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(ConnectorError::query(e)),
            }
        }
        client
            .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote(&publication)?))
            .await
            .map_err(ConnectorError::query)?;
        tracing::info!(dataflow = %ctx.id, %slot, "change data capture slot and publication dropped");
        Ok(())
    }
}

impl PostgresCdcSource {
    /// One peek at the slot: the records of the transactions not handed out
    /// yet, up to about [`READ_AHEAD`] batches.
    async fn peek(&self) -> Result<Vec<Record>, ConnectorError> {
        let (pending, idle) = {
            let state = self.lock();
            (state.pending(), state.in_flight.is_empty())
        };
        // With nothing in flight, where the server's flushed WAL ends before
        // the peek: a peek that reads to its end and finds nothing of ours
        // shows the slot may move there (see `read`). The flushed end, not
        // the written one: a peek reads only flushed WAL.
        let quiet_upto = if idle {
            let row = self
                .client
                .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
                .await
                .map_err(ConnectorError::query)?;
            row.get::<_, Option<String>>(0).as_deref().and_then(parse_lsn)
        } else {
            None
        };
        let limit = i32::try_from(pending + READ_AHEAD * self.batch).unwrap_or(i32::MAX);
        let rows = self
            .client
            .query(
                "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, \
                 'proto_version', '1', 'publication_names', $3)",
                &[&self.slot, &limit, &self.publication],
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            // An invalidated slot refuses so ("can no longer get changes"),
            // as do other states the error's code does not tell apart.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE) => {
                let lost = self
                    .client
                    .query_opt(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND wal_status = 'lost'",
                        &[&self.slot],
                    )
                    .await;
                return Err(match lost {
                    Ok(Some(_)) => slot_lost(&self.slot),
                    _ => ConnectorError::query(e),
                });
            }
            Err(e) => return Err(ConnectorError::query(e)),
        };
        let mut state = self.lock();
        state.decoder.reset_transaction();
        let mut records = Vec::new();
        for row in &rows {
            let lsn = row
                .get::<_, Option<String>>(0)
                .as_deref()
                .and_then(parse_lsn)
                .unwrap_or(0);
            let data: &[u8] = row.get(1);
            let Some(tx) = state
                .decoder
                .feed(lsn, data)
                .map_err(|e| ConnectorError::Transient(e.to_string()))?
            else {
                continue;
            };
            if tx.end_lsn <= state.read_upto {
                continue; // handed out already, not yet confirmed
            }
            if records.len() >= READ_AHEAD * self.batch {
                break; // the next peek starts with it
            }
            let before = state.read_upto;
            let count = tx.changes.len();
            for (i, change) in tx.changes.into_iter().enumerate() {
                // Confirming a change confirms its transaction only with its last one.
                let confirms = if i + 1 == count { tx.end_lsn } else { before };
                records.push(Record {
                    message: Message::new(change),
                    position: Position::Lsn(confirms),
                });
            }
            state.read_upto = tx.end_lsn;
            if count > 0 {
                state.in_flight.push_back((tx.end_lsn, tx.messages));
            }
        }
        // Read to the end (not cut by the limit) with nothing of ours: the
        // WAL up to where it ended before the peek holds no change of ours.
        let whole = usize::try_from(limit).is_ok_and(|limit| rows.len() < limit);
        if let Some(upto) = quiet_upto
            && whole
            && records.is_empty()
            && state.in_flight.is_empty()
        {
            state.read_upto = state.read_upto.max(upto);
        }
        Ok(records)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Moves the slot to `lsn`, if that is forward.
    async fn confirm(&self, lsn: u64) -> Result<(), ConnectorError> {
        if lsn <= self.lock().confirmed {
            return Ok(());
        }
        self.lock().advanced = Some(std::time::Instant::now());
        self.client
            .execute(
                "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)",
                &[&self.slot, &lsn_text(lsn)],
            )
            .await
            .map_err(ConnectorError::query)?;
        let mut state = self.lock();
        state.confirmed = state.confirmed.max(lsn);
        while state.in_flight.front().is_some_and(|(end, _)| *end <= lsn) {
            state.in_flight.pop_front();
        }
        drop(state);
        self.confirmed.notify_waiters();
        Ok(())
    }
}

#[async_trait]
impl Source for PostgresCdcSource {
    fn batch_size(&self) -> usize {
        self.batch
    }

    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        loop {
            let records = self.peek().await?;
            if !records.is_empty() {
                return Ok(records);
            }
            // A quiet moment: confirm what is written.
            let done = self.lock().done;
            self.confirm(done).await?;
            // Transactions without a change of ours, and the WAL of other
            // tables, still hold WAL: with nothing in flight, confirm past
            // them.
            let idle_upto = {
                let state = self.lock();
                state.in_flight.is_empty().then_some(state.read_upto)
            };
            match idle_upto {
                Some(upto) => {
                    self.confirm(upto).await?;
                    tokio::time::sleep(self.poll).await;
                }
                // What the slot holds is in flight: peek again once some
                // of it is confirmed.
                None => {
                    let _ = tokio::time::timeout(self.poll, self.confirmed.notified()).await;
                }
            }
        }
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        match done.last() {
            Some(Position::Lsn(lsn)) => {
                // Advancing a slot decodes its WAL again (as long as a peek
                // does), so it moves every CONFIRM_EVERY, or sooner when
                // peeks would decode much again; a crash delivers again
                // what was written since.
                let due = {
                    let mut state = self.lock();
                    state.done = state.done.max(*lsn);
                    // Also when every peek would decode a lot again.
                    (state.advanced.is_none_or(|at| at.elapsed() >= CONFIRM_EVERY)
                        || state.pending() >= READ_AHEAD * self.batch)
                        .then_some(state.done)
                };
                match due {
                    Some(done) => self.confirm(done).await,
                    None => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
