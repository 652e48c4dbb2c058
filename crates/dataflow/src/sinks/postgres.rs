//! PostgreSQL sink. A table with a JSONB `data` column (what
//! `autoCreateTable` makes) gets each message whole ("raw" mode); any other
//! table gets message keys into columns of the same names. `upsertMode`
//! updates on `conflictKey`; without it rows whose key exists are skipped,
//! so a replayed batch does not duplicate.
//!
//! A batch is streamed with `COPY … FROM STDIN`, each value in the text
//! form the column's input function reads, which is what
//! `jsonb_populate_recordset` feeds it too. COPY cannot skip or update on a
//! conflict, so a batch it refuses for a duplicate key (a replay, an
//! upsert) is written again by one `INSERT … ON CONFLICT` statement, and
//! the next [`AFTER_CONFLICT`] batches go straight to that statement. The
//! statement is also the path wherever COPY would act differently: a target
//! with rules or row-level security, a view; array or composite columns (a
//! JSON array or object becomes an element list there); a value for an
//! identity column `GENERATED ALWAYS` (refused there); and a JSON object,
//! array or exponent number for any other non-json column, whose text the
//! statement takes from jsonb (`{"a": 1}`, `0.0000001`).
//!
//! `applyChanges` takes change events of `postgresql-cdc` (`op`, `before`,
//! `after`) instead of rows and applies them by key, in order
//! ([`crate::sql::changes`]): inserts and updates as upserts of the columns
//! they carry, key changes in place, deletes and truncates, so the table
//! stays equal to the captured one. A batch's changes go in one transaction.
//! A schema change of the source: a column it gained is refused (with the
//! column's name, retried) until the sink's table has it too; a column it
//! dropped stays in the sink (rows written after it get its default); a
//! widened type's larger values are refused until the sink's column is
//! widened. Nothing is skipped meanwhile (with an error sink, a refused
//! change goes there, as any refused message does).
//!
//! Exactly once (`exactlyOnce`, on unless set false where the source can
//! resume from a stored position): each batch is written in one transaction
//! with the source's position after it, in a table of the tenant's own
//! ([`crate::sql::positions`]: one row per dataflow and target table, in the target's
//! schema, each position sealed with the tenant's key), and the dataflow
//! resumes from that position when it starts, so a crash at any moment
//! neither loses a row nor writes one twice. The row is deleted with the
//! dataflow.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use bytes::{BufMut, BytesMut};
use futures_util::SinkExt;
use serde_json::Value;

use super::Sink;
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sql::changes::{self, Step};
use crate::sql::positions::{self, PositionRow};
use crate::sql::{connect, literal, quote, quote_ident};
use serde::Deserialize;
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};
use sless_runtime::sync::Unpoisoned;

/// Batches written by statement after a COPY met an existing key.
const AFTER_CONFLICT: u32 = 16;

/// `config` of a `postgresql` sink.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresSinkConfig {
    pub connection_string: Option<String>,
    pub table: Option<String>,
    pub batch_size: Option<u32>,
    pub auto_create_table: Option<bool>,
    /// INSERT … ON CONFLICT … DO UPDATE instead of skipping duplicates.
    pub upsert_mode: Option<bool>,
    /// Column(s) for conflict detection in upsert mode; default the primary key.
    pub conflict_key: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
    /// Store the source's position with each batch; default on where the
    /// source can resume from it.
    pub exactly_once: Option<bool>,
    /// Apply change events (`op`, `before`, `after`) by key instead of
    /// writing messages as rows.
    pub apply_changes: Option<bool>,
}

pub struct PostgresSink {
    client: tokio_postgres::Client,
    table: String,
    table_quoted: String,
    raw: bool,
    columns: Vec<Column>,
    upsert_key: Option<Vec<String>>,
    /// Whether COPY writes what INSERT would (a plain table, no rules, no
    /// row-level security).
    copyable: bool,
    /// Batches still to write by statement after a conflict.
    by_statement: AtomicU32,
    exactly_once: Option<bool>,
    positions: PositionRow,
    positions_key: Option<crate::context::PositionsKey>,
    /// `applyChanges`: how change events are applied.
    changes: Option<Changes>,
}

/// `applyChanges`: the key change events are applied by, and the table's
/// columns as last read (read again when an event has one they lack: the
/// table may have gained it since).
struct Changes {
    key: Vec<String>,
    columns: Mutex<Vec<String>>,
}

/// A column of the target table and how a message value becomes its input.
struct Column {
    name: String,
    kind: ColumnKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnKind {
    /// json or jsonb: the JSON value itself, a string with its quotes.
    Json,
    /// Written only by the statement: an array or composite type (only it
    /// converts a JSON array or object into one), or an identity column
    /// `GENERATED ALWAYS` (COPY would store the given value; INSERT
    /// refuses it).
    ByStatement,
    /// Any other type: a string's contents, else the JSON text.
    Scalar,
}

/// The columns of `table` (quoted), in order: name, type, and kind. A
/// domain has its base type's category; `json` and `jsonb` are found
/// through a domain too.
async fn table_columns(
    client: &tokio_postgres::Client,
    table: &str,
) -> Result<Vec<(String, String, ColumnKind)>, ConnectorError> {
    Ok(client
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
               CASE WHEN coalesce(nullif(t.typbasetype, 0), t.oid) IN ('json'::regtype, 'jsonb'::regtype) THEN 'j' \
                    WHEN t.typcategory IN ('A', 'C') OR a.attidentity = 'a' THEN 's' ELSE 'v' END \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table],
        )
        .await
        .map_err(ConnectorError::query)?
        .iter()
        .map(|r| {
            let kind = match r.get::<_, &str>(2) {
                "j" => ColumnKind::Json,
                "s" => ColumnKind::ByStatement,
                _ => ColumnKind::Scalar,
            };
            (r.get(0), r.get(1), kind)
        })
        .collect())
}

impl PostgresSink {
    pub async fn connect(config: &PostgresSinkConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let egress = &ctx.egress;
        let dsn = config
            .connection_string
            .as_deref()
            .ok_or_else(|| ConnectorError::Config("connectionString is required".into()))?;
        let table = config
            .table
            .clone()
            .ok_or_else(|| ConnectorError::Config("table is required".into()))?;
        // Checked at create too; a table named through a secret only here.
        if positions::names_positions(&table) {
            return Err(ConnectorError::Config(positions::reserved(&table)));
        }
        let table_quoted = quote(&table)?;
        let positions = PositionRow::of(&table, ctx)?;
        let client = connect(dsn, egress).await?;
        if config.auto_create_table == Some(true) {
            client
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table_quoted} (id BIGSERIAL PRIMARY KEY, data JSONB NOT NULL, \
                     created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                ))
                .await
                .map_err(ConnectorError::query)?;
        }
        let columns = table_columns(&client, &table_quoted).await?;
        if columns.is_empty() {
            return Err(ConnectorError::Config(format!(
                "table {table:?} has no columns (does it exist?)"
            )));
        }
        let raw = columns.iter().any(|(name, ty, _)| name == "data" && ty == "jsonb");
        let copyable = client
            .query_one(
                "SELECT relkind IN ('r', 'p') AND NOT relhasrules AND NOT relrowsecurity FROM pg_class \
                 WHERE oid = $1::text::regclass",
                &[&table_quoted],
            )
            .await
            .map_err(ConnectorError::query)?
            .get(0);
        let upsert_key = match (config.upsert_mode, &config.conflict_key) {
            (Some(true), Some(key)) => {
                let key: Vec<String> = key.split(',').map(|k| k.trim().to_owned()).collect();
                // Only the table's own columns: the key is spliced into SQL.
                if let Some(unknown) = key.iter().find(|k| !columns.iter().any(|(c, _, _)| c == *k)) {
                    return Err(ConnectorError::Config(format!(
                        "conflictKey {unknown:?} is not a column of {table:?}"
                    )));
                }
                Some(key)
            }
            (Some(true), None) => return Err(ConnectorError::Config("upsertMode needs conflictKey".into())),
            _ => None,
        };
        let changes_key = match config.apply_changes {
            Some(true) if raw => {
                return Err(ConnectorError::Config(format!(
                    "applyChanges writes the captured rows into columns: {table:?} takes whole messages (a data jsonb column)"
                )));
            }
            Some(true) => Some(match &config.conflict_key {
                Some(key) => key.split(',').map(|k| k.trim().to_owned()).collect::<Vec<_>>(),
                None => primary_key(&client, &table_quoted, &table).await?,
            }),
            _ => None,
        };
        if let Some(unknown) = changes_key
            .iter()
            .flatten()
            .find(|k| !columns.iter().any(|(c, _, _)| c == *k))
        {
            return Err(ConnectorError::Config(format!(
                "conflictKey {unknown:?} is not a column of {table:?}"
            )));
        }
        let changes = changes_key.map(|key| Changes {
            key,
            columns: Mutex::new(columns.iter().map(|(name, _, _)| name.clone()).collect()),
        });
        Ok(Self {
            client,
            table,
            table_quoted,
            raw,
            columns: columns
                .into_iter()
                .map(|(name, _, kind)| Column { name, kind })
                .collect(),
            upsert_key,
            copyable,
            by_statement: AtomicU32::new(0),
            exactly_once: config.exactly_once,
            positions,
            positions_key: ctx.positions_key.clone(),
            changes,
        })
    }

    /// The columns some message of `batch` has (the others keep their
    /// defaults); in raw mode the `data` column.
    fn present(&self, batch: &[&Value]) -> Result<Vec<&Column>, ConnectorError> {
        let present: Vec<&Column> = self
            .columns
            .iter()
            .filter(|c| {
                if self.raw {
                    c.name == "data"
                } else {
                    batch.iter().any(|m| m.get(c.name.as_str()).is_some())
                }
            })
            .collect();
        if present.is_empty() {
            return Err(ConnectorError::Data(format!(
                "no message key matches a column of {}",
                self.table
            )));
        }
        Ok(present)
    }

    /// Streams `batch` with COPY into `list`, the quoted names of
    /// `present`, unless a value needs the statement.
    async fn copy(&self, batch: &[&Value], present: &[&Column], list: &str) -> Result<Copied, ConnectorError> {
        let mut rows = BytesMut::with_capacity(batch.len() * 64);
        for message in batch {
            if self.raw {
                put_json(&mut rows, message);
            } else {
                for (i, column) in present.iter().enumerate() {
                    if i > 0 {
                        rows.put_u8(b'\t');
                    }
                    if !put_value(&mut rows, message.get(column.name.as_str()), column.kind) {
                        return Ok(Copied::Unsuitable);
                    }
                }
            }
            rows.put_u8(b'\n');
        }
        let copied = async {
            let sink = self
                .client
                .copy_in::<_, bytes::Bytes>(&format!("COPY {} ({list}) FROM STDIN", self.table_quoted))
                .await?;
            futures_util::pin_mut!(sink);
            sink.send(rows.freeze()).await?;
            sink.finish().await
        }
        .await;
        match copied {
            Ok(_) => Ok(Copied::Written),
            Err(e) if e.code().is_some_and(|c| CONFLICTS.contains(c)) => Ok(Copied::Conflict),
            Err(e) => Err(ConnectorError::query(e)),
        }
    }

    /// Writes `batch` in one `INSERT … ON CONFLICT` statement into `list`,
    /// the quoted names of `present`.
    async fn insert(&self, batch: &[&Value], present: &[&Column], list: &str) -> Result<(), ConnectorError> {
        let docs = serde_json::to_string(batch).map_err(|e| ConnectorError::Data(e.to_string()))?;
        let t = &self.table_quoted;
        let rows = format!("jsonb_populate_recordset(NULL::{t}, $1::text::jsonb)");
        let sql = if self.raw {
            format!("INSERT INTO {t} (data) SELECT value FROM jsonb_array_elements($1::text::jsonb)")
        } else {
            let mut rows = rows;
            let conflict = match &self.upsert_key {
                Some(key) => {
                    let key_list = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                    // One statement may not update a row twice: of a key's
                    // messages in the batch, the last one is written (rows
                    // with a NULL in the key conflict with none: all kept).
                    let null_key = key
                        .iter()
                        .map(|k| format!("{} IS NULL", quote_ident(k)))
                        .collect::<Vec<_>>()
                        .join(" OR ");
                    let alone = format!("CASE WHEN {null_key} THEN sless_n END");
                    rows = format!(
                        "(SELECT DISTINCT ON ({alone}, {key_list}) * FROM \
                         (SELECT (jsonb_populate_record(NULL::{t}, e.doc)).*, e.sless_n \
                          FROM jsonb_array_elements($1::text::jsonb) WITH ORDINALITY AS e(doc, sless_n)) AS batch \
                         ORDER BY {alone}, {key_list}, sless_n DESC) AS last"
                    );
                    let updates: Vec<String> = present
                        .iter()
                        .filter(|c| !key.contains(&c.name))
                        .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(&c.name)))
                        .collect();
                    if updates.is_empty() {
                        format!("ON CONFLICT ({key_list}) DO NOTHING")
                    } else {
                        format!("ON CONFLICT ({key_list}) DO UPDATE SET {}", updates.join(", "))
                    }
                }
                None => "ON CONFLICT DO NOTHING".into(),
            };
            format!("INSERT INTO {t} ({list}) SELECT {list} FROM {rows} {conflict}")
        };
        self.client
            .execute(&sql, &[&docs])
            .await
            .map_err(ConnectorError::query)
            .map(drop)
    }
}

impl PostgresSink {
    /// Applies change events in one transaction (inside the caller's when
    /// `in_transaction`).
    async fn apply(&self, messages: &[Message], changes: &Changes, in_transaction: bool) -> Result<(), ConnectorError> {
        self.has_columns(messages, changes).await?;
        let key = &changes.key;
        let steps = changes::plan(messages, key).map_err(ConnectorError::Data)?;
        if !in_transaction {
            self.client
                .batch_execute("BEGIN")
                .await
                .map_err(ConnectorError::query)?;
        }
        let applied = async {
            for step in &steps {
                self.run(step, key).await?;
            }
            Ok(())
        }
        .await;
        if !in_transaction {
            let end = if applied.is_ok() { "COMMIT" } else { "ROLLBACK" };
            let ended = self.client.batch_execute(end).await.map_err(ConnectorError::query);
            applied.as_ref().map_err(Clone::clone)?;
            ended?;
        }
        applied
    }

    /// Refuses events that carry a column the table lacks (the source's
    /// table gained it): written without it, its values would be lost. The
    /// flow goes on once the sink's table has the column.
    async fn has_columns(&self, messages: &[Message], changes: &Changes) -> Result<(), ConnectorError> {
        if changes::unknown_column(messages, &changes.columns.lock_unpoisoned()).is_none() {
            return Ok(());
        }
        let columns: Vec<String> = table_columns(&self.client, &self.table_quoted)
            .await?
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
        let unknown = changes::unknown_column(messages, &columns).map(str::to_owned);
        *changes.columns.lock_unpoisoned() = columns;
        match unknown {
            None => Ok(()),
            Some(column) => Err(ConnectorError::Data(format!(
                "the captured rows have a column {column:?} that {} lacks (added to the source table?): \
                 nothing from this change on is written until the sink table has it (ALTER TABLE … ADD COLUMN)",
                self.table
            ))),
        }
    }

    async fn run(&self, step: &Step, key: &[String]) -> Result<(), ConnectorError> {
        let t = &self.table_quoted;
        let list =
            |names: &mut dyn Iterator<Item = &String>| names.map(|n| quote_ident(n)).collect::<Vec<_>>().join(", ");
        let keys = list(&mut key.iter());
        let (sql, params): (String, Vec<String>) = match step {
            Step::Upsert {
                columns,
                rows,
                json_nulls,
            } => {
                let names = list(&mut columns.iter());
                let updates: Vec<String> = columns
                    .iter()
                    .filter(|c| !key.contains(c))
                    .map(|c| format!("{0} = EXCLUDED.{0}", quote_ident(c)))
                    .collect();
                let conflict = if updates.is_empty() {
                    "DO NOTHING".to_owned()
                } else {
                    format!("DO UPDATE SET {}", updates.join(", "))
                };
                // Where no row holds JSON's null, the plainer statement.
                let (select, params) = match json_nulls.iter().any(|n| !n.is_empty()) {
                    false => (
                        format!("SELECT {names} FROM jsonb_populate_recordset(NULL::{t}, $1::text::jsonb)"),
                        vec![json(rows)],
                    ),
                    true => (
                        format!(
                            "SELECT {} \
                             FROM ROWS FROM (jsonb_array_elements($1::text::jsonb), jsonb_array_elements($2::text::jsonb)) \
                               AS e(doc, nulls), jsonb_populate_record(NULL::{t}, e.doc) AS r",
                            with_json_nulls(columns.iter(), json_nulls.iter().flatten())
                        ),
                        vec![json(rows), json(json_nulls)],
                    ),
                };
                (
                    format!("INSERT INTO {t} ({names}) {select} ON CONFLICT ({keys}) {conflict}"),
                    params,
                )
            }
            Step::Delete { keys: rows } => (
                format!(
                    "DELETE FROM {t} WHERE ({keys}) IN (SELECT {keys} FROM jsonb_populate_recordset(NULL::{t}, $1::text::jsonb))"
                ),
                vec![json(rows)],
            ),
            Step::Rekey { old, row, json_nulls } => {
                let names = list(&mut row.keys());
                let sql = format!(
                    "UPDATE {t} SET ({names}) = (SELECT {} FROM (SELECT $1::text::jsonb AS doc, $3::text::jsonb AS nulls) AS e, \
                       jsonb_populate_record(NULL::{t}, e.doc) AS r) \
                     WHERE ({keys}) = (SELECT {keys} FROM jsonb_populate_record(NULL::{t}, $2::text::jsonb))",
                    with_json_nulls(row.keys(), json_nulls.iter())
                );
                let moved = self
                    .client
                    .execute(&sql, &[&json(row), &json(old), &json(json_nulls)])
                    .await
                    .map_err(ConnectorError::query)?;
                if moved > 0 {
                    return Ok(());
                }
                // The old row is not in the table: the new one is written whole.
                let mut columns: Vec<String> = row.keys().cloned().collect();
                columns.sort();
                let upsert = Step::Upsert {
                    columns,
                    rows: vec![row.clone()],
                    json_nulls: vec![json_nulls.clone()],
                };
                return Box::pin(self.run(&upsert, key)).await;
            }
            Step::Truncate => (format!("TRUNCATE {t}"), Vec::new()),
        };
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        self.client
            .execute(&sql, &params)
            .await
            .map(drop)
            .map_err(ConnectorError::query)
    }
}

/// The select list of `columns` from a row `r` populated from `e.doc`,
/// where a column of `json_nulls` gives JSON's `null` for the rows whose
/// names list it (`e.nulls`) and whose value is `null`: populating a json
/// or jsonb column from `null` gives NULL.
fn with_json_nulls<'a>(
    columns: impl Iterator<Item = &'a String>,
    json_nulls: impl Iterator<Item = &'a String>,
) -> String {
    let named: std::collections::HashSet<&String> = json_nulls.collect();
    columns
        .map(|c| {
            let column = quote_ident(c);
            match named.contains(c) {
                false => format!("r.{column}"),
                true => {
                    let name = literal(c);
                    format!(
                        "CASE WHEN e.nulls ? {name} AND jsonb_typeof(e.doc -> {name}) = 'null' \
                         THEN 'null' ELSE r.{column} END"
                    )
                }
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `value` as JSON text (a map or a list of maps: serialising cannot fail).
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

/// The primary key columns of `table`, in key order (not the columns an
/// `INCLUDE` adds to its index).
async fn primary_key(
    client: &tokio_postgres::Client,
    table_quoted: &str,
    table: &str,
) -> Result<Vec<String>, ConnectorError> {
    let key: Vec<String> = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary AND k.n <= i.indnkeyatts \
             ORDER BY k.n",
            &[&table_quoted],
        )
        .await
        .map_err(ConnectorError::query)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if key.is_empty() {
        return Err(ConnectorError::Config(format!(
            "applyChanges applies changes by key: {table:?} has no primary key (give conflictKey)"
        )));
    }
    Ok(key)
}

/// What became of a batch given to COPY.
enum Copied {
    Written,
    /// A row's key exists: nothing of the batch was written.
    Conflict,
    /// A value's text is one only the statement makes (see the module).
    Unsuitable,
}

/// The SQLSTATEs of a row whose key exists: unique and exclusion violations.
const CONFLICTS: [tokio_postgres::error::SqlState; 2] = [
    tokio_postgres::error::SqlState::UNIQUE_VIOLATION,
    tokio_postgres::error::SqlState::EXCLUSION_VIOLATION,
];

/// Appends a message value as COPY's text format gives it to a column's
/// input function, as `jsonb_populate_recordset` would: a missing key or
/// JSON null is NULL; a json column gets the JSON text; any other column a
/// string's contents, or a boolean's or number's text. `false` when only
/// the statement gives the text jsonb would (an object, an array, `1e-7`).
fn put_value(rows: &mut BytesMut, value: Option<&Value>, kind: ColumnKind) -> bool {
    match (value, kind) {
        (None | Some(Value::Null), _) => rows.put_slice(b"\\N"),
        (Some(json), ColumnKind::Json) => put_json(rows, json),
        (Some(Value::String(s)), _) => put_escaped(rows, s.as_bytes()),
        (Some(Value::Bool(b)), _) => rows.put_slice(if *b { b"true" } else { b"false" }),
        (Some(Value::Number(n)), _) => {
            let text = n.to_string();
            if text.contains(['e', 'E']) {
                return false;
            }
            rows.put_slice(text.as_bytes());
        }
        (Some(Value::Object(_) | Value::Array(_)), _) => return false,
    }
    true
}

fn put_json(rows: &mut BytesMut, value: &Value) {
    // Serialising a Value cannot fail: its keys are strings.
    let text = serde_json::to_vec(value).unwrap_or_default();
    put_escaped(rows, &text);
}

/// `bytes` with COPY's text-format escapes: backslash, newline, carriage
/// return and tab, the characters that delimit or escape.
fn put_escaped(rows: &mut BytesMut, bytes: &[u8]) {
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            _ => continue,
        };
        rows.put_slice(&bytes[start..i]);
        rows.put_slice(escape);
        start = i + 1;
    }
    rows.put_slice(&bytes[start..]);
}

impl Component for PostgresSink {
    const KIND: &'static str = "postgresql";
    type Config = PostgresSinkConfig;

    fn check(p: &PostgresSinkConfig, path: &str, errors: &mut ValidationErrors) {
        crate::component::check_target(
            (&p.connection_string, &p.connection_string_secret_ref),
            Some((&p.table, &p.table_secret_ref)),
            path,
            errors,
        );
        if p.batch_size == Some(0) {
            errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
        }
        if let Some(table) = p.table.as_deref().filter(|t| positions::names_positions(t)) {
            errors.push(FieldError::invalid(format!("{path}.table"), positions::reserved(table)));
        }
        if p.apply_changes == Some(true) && p.auto_create_table == Some(true) {
            errors.push(FieldError::invalid(
                format!("{path}.applyChanges"),
                "applies changes to a table shaped like the captured one; autoCreateTable makes a table of whole messages",
            ));
        }
    }
}

#[async_trait]
impl super::Open for PostgresSink {
    async fn open(config: &PostgresSinkConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Self::connect(config, ctx).await
    }

    async fn release(config: &PostgresSinkConfig, ctx: &PipelineContext) -> Result<(), ConnectorError> {
        let (Some(dsn), Some(table)) = (&config.connection_string, &config.table) else {
            return Ok(());
        };
        let positions = PositionRow::of(table, ctx)?;
        let client = connect(dsn, &ctx.egress).await?;
        positions.delete(&client).await
    }
}

#[async_trait]
impl Sink for PostgresSink {
    fn target(&self) -> &str {
        &self.table
    }

    async fn write(&self, messages: &[Message]) -> Result<(), ConnectorError> {
        self.write_rows(messages, false).await
    }

    fn exactly_once(&self) -> Option<bool> {
        self.exactly_once
    }

    async fn stored_position(&self) -> Result<Option<String>, ConnectorError> {
        let key = self.positions_key.as_ref().ok_or_else(|| {
            ConnectorError::Config(
                "exactlyOnce seals the positions it stores with the tenant's key, which this processor was \
                 not given (--positions-key-file); set exactlyOnce to false"
                    .into(),
            )
        })?;
        self.positions.prepare(&self.client).await?;
        self.positions.read(&self.client, key).await
    }

    async fn write_at(&self, messages: &[Message], position: Option<&str>) -> Result<(), ConnectorError> {
        let (Some(position), Some(key)) = (position, &self.positions_key) else {
            return self.write_rows(messages, false).await;
        };
        if !self.positions.is_prepared() {
            return self.write_rows(messages, false).await;
        }
        self.client
            .batch_execute("BEGIN")
            .await
            .map_err(ConnectorError::query)?;
        let written = async {
            self.write_rows(messages, true).await?;
            self.positions.write(&self.client, key, position).await?;
            self.client.batch_execute("COMMIT").await.map_err(ConnectorError::query)
        }
        .await;
        if written.is_err() {
            // Nothing of the batch stays; a connection that broke ended it anyway.
            let _ = self.client.batch_execute("ROLLBACK").await;
        }
        written
    }
}

impl PostgresSink {
    /// The rows of a batch, by COPY where it can; `in_transaction`: inside
    /// an open transaction, which a refused COPY aborts and this begins
    /// again for the statement.
    async fn write_rows(&self, messages: &[Message], in_transaction: bool) -> Result<(), ConnectorError> {
        if messages.is_empty() {
            return Ok(());
        }
        if let Some(changes) = &self.changes {
            return self.apply(messages, changes, in_transaction).await;
        }
        let batch: Vec<&Value> = messages.iter().map(|m| &m.data).collect();
        let present = self.present(&batch)?;
        let list = present
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect::<Vec<_>>()
            .join(", ");
        let copy = self.copyable && present.iter().all(|c| c.kind != ColumnKind::ByStatement);
        if copy {
            let wait = self.by_statement.load(Ordering::Relaxed);
            if wait > 0 {
                self.by_statement.store(wait - 1, Ordering::Relaxed);
            } else {
                match self.copy(&batch, &present, &list).await? {
                    Copied::Written => return Ok(()),
                    Copied::Conflict => {
                        self.by_statement.store(AFTER_CONFLICT, Ordering::Relaxed);
                        if in_transaction {
                            self.client
                                .batch_execute("ROLLBACK; BEGIN")
                                .await
                                .map_err(ConnectorError::query)?;
                        }
                    }
                    Copied::Unsuitable => {}
                }
            }
        }
        self.insert(&batch, &present, &list).await
    }
}
