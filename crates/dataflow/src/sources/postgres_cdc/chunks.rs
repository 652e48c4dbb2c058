//! The initial snapshot read in chunks while the replication stream runs,
//! with watermarks (DBLog's scheme, as in Debezium's incremental
//! snapshots), on PostgreSQL 14 and later, whose pgoutput sends logical
//! messages.
//!
//! A chunk: a low watermark (a transactional logical message with the
//! slot's prefix) is committed, the next rows of the table by primary key
//! are selected (`snapshotChunkSize`), and a high watermark is committed.
//! The stream between the two holds every change committed around the
//! select. At the high watermark the chunk's rows are handed out as `op: r`
//! events, in that transaction's place, each with the window's changes to
//! its key laid over it (so it is the row as of the high watermark, an
//! unchanged TOASTed value included); a row the window deleted is left
//! out. The stream never waits for the snapshot, and no
//! row is handed out older than a change already handed out; a row changed
//! after the slot was made and before its chunk comes as that change and
//! again as a snapshot row.
//!
//! Every logical slot on the database sees the watermarks, so they carry
//! no data: this run's nonce and the chunk's number, and on the high one a
//! token no one could read before it was sent (a watermark forged from the
//! low one is left).
//!
//! Progress: one chunk is out at a time. Each snapshot row's position, as
//! an exactly-once sink stores it with the row, carries where the snapshot
//! goes on once that row is written (the tables left and the key after it),
//! so after a crash the snapshot goes on after the last row the sink holds:
//! every row comes once. The dataflow's checkpoint store keeps where it
//! goes on once every chunk handed out is written, and every table it was
//! asked for (one the spec names later is read too); with another sink a
//! crash goes on from there (the chunk out may come twice), and without a
//! checkpoint store (`checkpointPersistence: false`) from the start.
//!
//! A chunk's changes are matched to its rows by the table's replica
//! identity (the primary key, or the identity index) and, for a
//! partitioned table, by its partitions' names; a truncate in the window
//! reads the chunk again. A table without a primary key is read in chunks
//! by `ctid`, each under a SHARE lock (writers wait while a chunk is read,
//! and both its watermarks come with its commit, no change between them):
//! a row an update moved back to where the chunks have passed comes as
//! that update, and a rewrite of the table between chunks (`VACUUM FULL`,
//! `CLUSTER`) moves rows the chunks would miss. Positions keep the key as
//! the server wrote it, read back with a cast to the column's type; a
//! saved one that no longer fits the table's key reads it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::pgoutput::{Domains, now_ms, snapshot_event, value_of};
use super::position::Order;
use super::snapshot::SnapshotMark;
use crate::checkpoint::CheckpointStore;
use crate::sql::{literal, quote, quote_ident, replication};
use crate::{ConnectorError, store_error};
use sless_model::dataflow::SnapshotRequest;
use sless_runtime::sync::Unpoisoned;

/// Rows a chunk selects unless `snapshotChunkSize` says.
pub const DEFAULT_CHUNK: u32 = 5_000;
/// Most rows a chunk may select (they are held in memory until its high
/// watermark).
pub const MAX_CHUNK: u32 = 100_000;

type Row = Map<String, Value>;

/// Where the snapshot goes on: the tables left (the one being read first,
/// as the spec names them), the key after which its rows are to read (as
/// the server wrote it), every table it was asked to read, and the newest
/// snapshot request it holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Cursor {
    pub(super) tables: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) after: Option<Row>,
    #[serde(default)]
    pub(super) asked: Vec<String>,
    /// The newest [`SnapshotRequest`] whose tables are in `tables` (or were
    /// read); each snapshot a request starts has its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) requested: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The newest of `requests`' ids (0: none).
fn newest(requests: &[SnapshotRequest]) -> u64 {
    requests.iter().map(|r| r.id).max().unwrap_or(0)
}

impl Cursor {
    /// A snapshot of `tables` from their start, which holds every request
    /// made before it.
    pub(super) fn of(tables: &[String], requests: &[SnapshotRequest]) -> Self {
        Self {
            tables: tables.to_vec(),
            after: None,
            asked: tables.to_vec(),
            requested: newest(requests),
        }
    }

    /// Adds the tables of the requests newer than this cursor's (those of
    /// `captured`, each once; the one being read part way, again from its
    /// start after the others).
    fn ask(&mut self, requests: &[SnapshotRequest], captured: &[String]) {
        let begun = usize::from(self.after.is_some());
        for request in requests.iter().filter(|r| r.id > self.requested) {
            for table in request.tables.iter().filter(|t| captured.contains(t)) {
                if !self.tables.iter().skip(begun).any(|t| t == table) {
                    self.tables.push(table.clone());
                }
            }
        }
        self.requested = self.requested.max(newest(requests));
    }
}

/// What the checkpoint store keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Saved {
    /// Where the snapshot goes on once every chunk handed out is written.
    snapshot: Cursor,
    /// Where the slot this snapshot goes with began: an exactly-once
    /// sink's position from before is an earlier snapshot's. `None`: the
    /// slot was not made yet when this was saved.
    #[serde(default)]
    since: Option<u64>,
}

/// What an exactly-once sink stores for a change at `order` while a
/// snapshot runs: its text, and after a `|` where the snapshot goes on
/// once the change is written.
pub(super) fn resume_text(order: Order, cursor: Option<&Cursor>) -> String {
    match cursor.and_then(|c| serde_json::to_string(c).ok()) {
        Some(cursor) => format!("{}|{cursor}", order.text()),
        None => order.text(),
    }
}

/// The order and the snapshot's cursor of a stored [`resume_text`] (none
/// where what follows the `|` is not one).
pub(super) fn parse_resume(text: &str) -> Option<(Order, Option<Cursor>)> {
    match text.split_once('|') {
        Some((order, cursor)) => Some((Order::parse(order)?, serde_json::from_str(cursor).ok())),
        None => Some((Order::parse(text)?, None)),
    }
}

async fn load(store: Option<&Arc<dyn CheckpointStore>>) -> Result<Option<Saved>, ConnectorError> {
    let saved = match store {
        Some(store) => store.load().await.map_err(store_error)?,
        None => None,
    };
    Ok(saved.and_then(|text| serde_json::from_str(&text).ok()))
}

/// Where a snapshot of `tables` goes on, and where its slot began: after
/// what the exactly-once sink holds (`written`, when it is this snapshot's),
/// else where the checkpoint says, else from the start. Tables the spec no
/// longer names are left out; tables it names that the snapshot was never
/// asked for are added, and those of snapshot requests it does not hold.
pub(super) async fn resume(
    store: Option<&Arc<dyn CheckpointStore>>,
    tables: &[String],
    written: Option<(Order, Option<Cursor>)>,
    requests: &[SnapshotRequest],
) -> Result<(Cursor, Option<u64>), ConnectorError> {
    let saved = load(store).await?;
    let since = saved.as_ref().and_then(|s| s.since);
    let generation = saved.as_ref().map(|s| s.snapshot.requested);
    // Without a checkpoint the sink's cursor cannot be told from an
    // earlier snapshot's; with one saved before the slot was made (or
    // before a requested snapshot began), it is.
    let this_snapshot = |order: &Order, cursor: &Cursor| {
        saved.is_none() || (since.is_some_and(|since| order.commit >= since) && generation == Some(cursor.requested))
    };
    let held = written.and_then(|(order, cursor)| cursor.filter(|c| this_snapshot(&order, c)));
    let mut cursor = match (held, saved) {
        (Some(held), _) => held,
        (None, Some(saved)) => saved.snapshot,
        (None, None) => Cursor::of(tables, requests),
    };
    let first = cursor.tables.first().cloned();
    cursor.tables.retain(|t| tables.contains(t));
    if cursor.tables.first() != first.as_ref() {
        cursor.after = None;
    }
    let asked = std::mem::replace(&mut cursor.asked, tables.to_vec());
    if !asked.is_empty() {
        cursor
            .tables
            .extend(tables.iter().filter(|t| !asked.contains(t)).cloned());
    }
    cursor.ask(requests, tables);
    Ok((cursor, since))
}

/// The snapshot to take on a stream whose own is written (or was never
/// taken): the tables of the requests newer than the last snapshot's,
/// with where the slot began (`confirmed` when no snapshot said); `None`
/// when there is none. Without a checkpoint store which requests were read
/// is not known, so none is (the REST API refuses such requests).
pub(super) async fn asked_again(
    store: Option<&Arc<dyn CheckpointStore>>,
    tables: &[String],
    requests: &[SnapshotRequest],
    confirmed: u64,
) -> Result<Option<(Cursor, Option<u64>)>, ConnectorError> {
    if requests.is_empty() || store.is_none() {
        return Ok(None);
    }
    let saved = load(store).await?;
    let mut cursor = Cursor {
        asked: tables.to_vec(),
        requested: saved.as_ref().map_or(0, |s| s.snapshot.requested),
        ..Cursor::default()
    };
    cursor.ask(requests, tables);
    let since = saved.and_then(|s| s.since).unwrap_or(confirmed);
    Ok((!cursor.tables.is_empty()).then_some((cursor, Some(since))))
}

/// A table being read: its names as the catalog has them, its key, and
/// the names its changes come under (its partitions').
struct Table {
    schema: String,
    name: String,
    quoted: String,
    /// The primary key's columns and their types; `None`: read by `ctid`,
    /// each chunk under a lock that holds writers off.
    key: Option<Vec<(String, String)>>,
    /// The columns a chunk's changes are matched by: the primary key, or
    /// the replica identity index (what an old row carries).
    identity: Vec<String>,
    names: Vec<(String, String)>,
    /// Each column's type as the catalog names it (a domain, not its base
    /// type as a query's rows say), put through the source's [`Domains`]
    /// once described, as the stream's are: both read a value alike, a
    /// domain made after the start as text.
    types: HashMap<String, u32>,
}

/// One row of [`Table::describe`]'s query: schema, name, replica identity,
/// and as JSON the key's columns and types, the identity index's columns,
/// the partitions' names and the columns' types.
type Described = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

impl Table {
    async fn describe(sql: &mut replication::Connection, table: &str) -> Result<Self, ConnectorError> {
        let quoted = quote(table)?;
        // Quoted names are [A-Za-z0-9_."] only: literal as they are.
        let index_columns = |which: &str, what: &str| {
            format!(
                "(SELECT json_agg({what} ORDER BY k.i)::text \
                   FROM pg_index x CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, i) \
                   JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum \
                   WHERE x.indrelid = c.oid AND x.{which} AND k.i <= x.indnkeyatts)"
            )
        };
        let found = sql
            .query(&format!(
                "SELECT n.nspname, c.relname, c.relreplident::text, {}, {}, \
                   (SELECT json_agg(json_build_array(pn.nspname, pc.relname))::text FROM pg_partition_tree(c.oid) p \
                    JOIN pg_class pc ON pc.oid = p.relid JOIN pg_namespace pn ON pn.oid = pc.relnamespace), \
                   (SELECT json_object_agg(attname, atttypid::int8)::text FROM pg_attribute \
                    WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = '{quoted}'::regclass",
                index_columns(
                    "indisprimary",
                    "json_build_array(a.attname, format_type(a.atttypid, a.atttypmod))"
                ),
                index_columns("indisreplident", "a.attname"),
            ))
            .await?;
        let described: Described = match found.rows.first().map(Vec::as_slice) {
            Some([Some(schema), Some(name), Some(identity), key, index, names, types]) => (
                schema.clone(),
                name.clone(),
                identity.clone(),
                key.clone(),
                index.clone(),
                names.clone(),
                types.clone(),
            ),
            _ => return Err(ConnectorError::Config(format!("table {table} not found"))),
        };
        Self::of(quoted, described)
            .map_err(|e| ConnectorError::Closed(format!("the catalog's description of {table}: {e}")))
    }

    fn of(
        quoted: String,
        (schema, name, identity, key, index, names, types): Described,
    ) -> Result<Self, serde_json::Error> {
        let key: Option<Vec<(String, String)>> = key.as_deref().map(serde_json::from_str).transpose()?;
        let index: Option<Vec<String>> = index.as_deref().map(serde_json::from_str).transpose()?;
        let types = types
            .as_deref()
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or_default();
        let mut names: Vec<(String, String)> = names
            .as_deref()
            .map(serde_json::from_str)
            .transpose()?
            .unwrap_or_default();
        if names.is_empty() {
            names.push((schema.clone(), name.clone()));
        }
        let identity = match (identity.as_str(), index, &key) {
            ("i", Some(index), _) => index,
            (_, _, Some(key)) => key.iter().map(|(k, _)| k.clone()).collect(),
            _ => Vec::new(),
        };
        Ok(Self {
            schema,
            name,
            quoted,
            key,
            identity,
            names,
            types,
        })
    }

    /// Whether `after` (a saved cursor's) says where this table's rows go
    /// on: exactly its key's columns, none NULL (or a `ctid`). A key
    /// changed since (a primary key added, say) reads the table again.
    fn fits(&self, after: &Row) -> bool {
        match &self.key {
            Some(key) => {
                after.len() == key.len() && key.iter().all(|(k, _)| after.get(k).is_some_and(|v| !v.is_null()))
            }
            None => after.len() == 1 && after.get("ctid").is_some_and(Value::is_string),
        }
    }

    /// The next `size` rows after `after`, in key order, each with its
    /// position (key or `ctid`).
    async fn select(
        &self,
        sql: &mut replication::Connection,
        after: Option<&Row>,
        size: u32,
    ) -> Result<Vec<(Row, Row)>, ConnectorError> {
        let t = &self.quoted;
        let query = match &self.key {
            Some(key) => {
                let keys = key.iter().map(|(k, _)| quote_ident(k)).collect::<Vec<_>>().join(", ");
                // The last key as its columns' own types read it (type
                // names from format_type, quoted where they need it).
                let after = match after {
                    Some(after) => {
                        let values: Vec<String> = key
                            .iter()
                            .map(|(k, ty)| format!("CAST({} AS {ty})", literal(&text_of(&after[k]))))
                            .collect();
                        format!("WHERE ({keys}) > ({})", values.join(", "))
                    }
                    None => String::new(),
                };
                format!("SELECT * FROM {t} {after} ORDER BY {keys} LIMIT {size}")
            }
            None => {
                let after = match after.and_then(|a| a.get("ctid")).and_then(Value::as_str) {
                    Some(tid) => format!("WHERE ctid > {}::tid", literal(tid)),
                    None => String::new(),
                };
                format!("SELECT ctid, * FROM {t} {after} ORDER BY ctid LIMIT {size}")
            }
        };
        let found = sql.query(&query).await?;
        let keyed = self.key.is_some();
        Ok(found
            .rows
            .into_iter()
            .map(|values| {
                let mut row = Row::with_capacity(values.len());
                let mut position = Row::new();
                for (i, ((column, oid), text)) in found.columns.iter().zip(values).enumerate() {
                    // A position keeps the server's own text of its key.
                    let is_key = (!keyed && i == 0) || self.key.iter().flatten().any(|(k, _)| k == column);
                    if is_key && let Some(text) = &text {
                        position.insert(column.clone(), Value::String(text.clone()));
                    }
                    if keyed || i > 0 {
                        let oid = self.types.get(column).copied().unwrap_or(*oid);
                        row.insert(column.clone(), text.map_or(Value::Null, |text| value_of(oid, &text)));
                    }
                }
                (row, position)
            })
            .collect())
    }
}

/// A saved key's value as the text its column's input function reads: the
/// server's own text, kept as a string.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The key columns' values of `row`, when it has them all, none NULL (an
/// identity index's old row leaves the other columns NULL).
fn key_values(row: &Row, key: &[String]) -> Option<Row> {
    key.iter()
        .map(|k| row.get(k).filter(|v| !v.is_null()).map(|v| (k.clone(), v.clone())))
        .collect()
}

/// What tells a row of a chunk apart: its `identity` columns' values.
fn identify(row: &Row, identity: &[String]) -> Option<String> {
    if identity.is_empty() {
        return None;
    }
    key_values(row, identity).map(|key| identity_text(&key))
}

/// A key as text, to tell keys apart.
fn identity_text(key: &Row) -> String {
    Value::Object(key.clone()).to_string()
}

/// A chunk between its watermarks.
struct Window {
    seq: u64,
    /// What only its real high watermark carries.
    token: String,
    schema: String,
    table: String,
    /// The names its changes come under (a partitioned table's partitions).
    names: Vec<(String, String)>,
    /// The columns its changes are matched by (none: read under a lock,
    /// with no change between its watermarks).
    identity: Vec<String>,
    /// The low watermark has come: changes are laid over the chunk.
    open: bool,
    /// By identity: the window's changes laid over each other, or `None`
    /// where the row was deleted (or moved away) last.
    changed: HashMap<String, Option<Row>>,
    truncated: bool,
    /// The selected rows and the cursor after them, once selected.
    rows: Option<(Vec<(Row, Row)>, Cursor)>,
    /// The cursor before them: a truncate in the window reads them again.
    again: Cursor,
}

impl Window {
    fn of(seq: u64, token: String, table: &Table, again: Cursor) -> Self {
        Self {
            seq,
            token,
            schema: table.schema.clone(),
            table: table.name.clone(),
            names: table.names.clone(),
            identity: table.identity.clone(),
            open: false,
            changed: HashMap::new(),
            truncated: false,
            rows: None,
            again,
        }
    }

    /// Lays a change of the stream over the chunk.
    fn observe(&mut self, event: &Value) {
        let source = &event["source"];
        let ours = self
            .names
            .iter()
            .any(|(schema, table)| source["schema"] == schema.as_str() && source["table"] == table.as_str());
        if !self.open || !ours {
            return;
        }
        let row = |field: &str| event.get(field).and_then(Value::as_object);
        let old = row("before").and_then(|b| identify(b, &self.identity));
        match event["op"].as_str() {
            Some("t") => {
                self.truncated = true;
                self.changed.clear();
            }
            Some("d") => {
                if let Some(old) = old {
                    self.changed.insert(old, None);
                }
            }
            _ => {
                let Some(after) = row("after") else {
                    return;
                };
                let new = identify(after, &self.identity);
                // A key change: the old key's row is gone.
                if let Some(old) = old
                    && Some(&old) != new.as_ref()
                {
                    self.changed.insert(old, None);
                }
                if let Some(new) = new {
                    let over = self.changed.entry(new).or_insert(None);
                    match over {
                        Some(over) => over.extend(after.clone()),
                        None => *over = Some(after.clone()),
                    }
                }
            }
        }
    }

    /// The chunk's rows as of the high watermark, as events, with their
    /// positions.
    fn rows(self, lsn: u64) -> Handout {
        if self.truncated {
            // Of this table or of one of its partitions: which rows went is
            // not known, so the chunk is read again.
            return Handout {
                events: Vec::new(),
                keys: Vec::new(),
                next: self.again,
            };
        }
        let (rows, next) = self.rows.unwrap_or_default();
        let now_ms = now_ms();
        let (mut events, mut keys) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
        for (mut row, position) in rows {
            match identify(&row, &self.identity).and_then(|id| self.changed.get(&id)) {
                Some(None) => continue,
                Some(Some(over)) => row.extend(over.clone()),
                None => {}
            }
            events.push(snapshot_event(
                &self.schema,
                &self.table,
                Value::Object(row),
                lsn,
                now_ms,
            ));
            keys.push(position);
        }
        Handout { events, keys, next }
    }
}

/// A chunk's rows at its high watermark.
pub(super) struct Handout {
    pub(super) events: Vec<Value>,
    /// Each row's key (its `ctid` without a primary key).
    keys: Vec<Row>,
    next: Cursor,
}

/// The chunk handed out and not yet written.
struct Out {
    /// Its first row's order; the others follow it in its transaction.
    first: Order,
    /// Each row's position (key or `ctid`).
    keys: Vec<Row>,
    /// The cursor it was read from (its table first).
    from: Cursor,
    next: Cursor,
}

impl Out {
    /// Where the snapshot goes on once the change at `order` is written:
    /// `None` before this chunk's rows.
    fn cursor_at(&self, order: Order) -> Option<Cursor> {
        if order >= self.last() {
            return Some(self.next.clone());
        }
        if order.commit != self.first.commit || order.index < self.first.index {
            return None;
        }
        let key = self.keys.get((order.index - self.first.index) as usize)?;
        Some(Cursor {
            after: Some(key.clone()),
            ..self.from.clone()
        })
    }

    fn last(&self) -> Order {
        Order {
            commit: self.first.commit,
            index: self.first.index + self.keys.len().saturating_sub(1) as u32,
        }
    }
}

/// At a watermark `content` of run `nonce`: the low one opens `window`; the
/// high one, with the window's token once its rows are selected, closes
/// it and gives its rows. Anything else is left.
fn at_watermark(window: &mut Option<Window>, nonce: &str, content: &str, lsn: u64) -> Option<Handout> {
    let mut parts = content.splitn(4, ':');
    let (run, seq, mark) = (parts.next()?, parts.next()?.parse::<u64>().ok()?, parts.next()?);
    let open = window.as_mut().filter(|w| run == nonce && w.seq == seq)?;
    match mark {
        "L" => {
            open.open = true;
            None
        }
        "H" if parts.next() == Some(open.token.as_str()) && open.rows.is_some() => {
            window.take().map(|window| window.rows(lsn))
        }
        _ => None,
    }
}

/// What the snapshot's progress is and who waits on it.
struct State {
    /// Every row before this cursor is written.
    done: Cursor,
    /// Where the slot began, once it is known.
    since: Option<u64>,
    out: Option<Out>,
    window: Option<Window>,
}

/// The chunked snapshot of one dataflow, shared by the reading task (which
/// drives it and lays the stream over it) and the source (which says what
/// is written).
pub(super) struct Chunking {
    /// The logical messages' prefix: the slot's (other dataflows' slots on
    /// the database see the messages too, and leave them).
    pub(super) prefix: String,
    /// This run's mark in its watermarks (an earlier run's come again after
    /// a restart, and are left).
    nonce: String,
    size: u32,
    store: Option<Arc<dyn CheckpointStore>>,
    mark: Arc<SnapshotMark>,
    state: Mutex<State>,
    /// The chunk out is written: the next may start.
    free: Notify,
    /// Rows are read as the stream reads them: a domain by its base type.
    domains: Domains,
}

impl Chunking {
    pub(super) fn new(
        slot: &str,
        size: u32,
        store: Option<Arc<dyn CheckpointStore>>,
        mark: Arc<SnapshotMark>,
        done: Cursor,
        since: Option<u64>,
        domains: Domains,
    ) -> Self {
        Self {
            domains,
            prefix: format!("sless.snapshot.{slot}"),
            nonce: format!("{:016x}", rand::random::<u64>()),
            size,
            store,
            mark,
            state: Mutex::new(State {
                done,
                since,
                out: None,
                window: None,
            }),
            free: Notify::new(),
        }
    }

    /// Saves where the snapshot goes on once what is handed out is written;
    /// `now`: before returning, whatever the store's pace.
    async fn save(&self, done: Cursor, now: bool) -> Result<(), ConnectorError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let since = self.state.lock_unpoisoned().since;
        let text = serde_json::to_string(&Saved { snapshot: done, since })
            .map_err(|e| ConnectorError::Transient(e.to_string()))?;
        match now {
            true => store.save_now(&text).await,
            false => store.save(&text).await,
        }
        .map_err(store_error)
    }

    /// Saves where the snapshot starts, before anything is read; for a new
    /// slot, before it is made, so that no earlier snapshot's progress can
    /// stand for this one's.
    pub(super) async fn start(&self) -> Result<(), ConnectorError> {
        let done = self.state.lock_unpoisoned().done.clone();
        self.save(done, true).await
    }

    /// The new slot began at `since`: sink positions from before it are an
    /// earlier snapshot's.
    pub(super) async fn slot_made(&self, since: u64) -> Result<(), ConnectorError> {
        let done = {
            let mut state = self.state.lock_unpoisoned();
            state.since = Some(since);
            state.done.clone()
        };
        self.save(done, true).await
    }

    async fn emit(&self, sql: &mut replication::Connection, seq: u64, mark: &str) -> Result<(), ConnectorError> {
        // The prefix is a slot name ([a-z0-9_]) after a literal: as it is.
        sql.query(&format!(
            "SELECT pg_logical_emit_message(true, '{}', '{}:{seq}:{mark}')",
            self.prefix, self.nonce
        ))
        .await?;
        Ok(())
    }

    /// Reads the tables chunk by chunk, one out at a time, until every row
    /// is written; then marks the snapshot written.
    pub(super) async fn drive(&self, sql: &mut replication::Connection) -> Result<(), ConnectorError> {
        let mut tables: HashMap<String, Table> = HashMap::new();
        let mut seq = 0u64;
        let mut rows_read = 0usize;
        loop {
            while {
                let state = self.state.lock_unpoisoned();
                state.out.is_some() || state.window.is_some()
            } {
                self.free.notified().await;
            }
            let cursor = self.state.lock_unpoisoned().done.clone();
            let Some(name) = cursor.tables.first() else {
                self.mark.written().await?;
                tracing::info!(prefix = %self.prefix, rows = rows_read, "snapshot written");
                return Ok(());
            };
            if !tables.contains_key(name) {
                let mut table = Table::describe(sql, name).await?;
                // Read as the stream reads them: a domain by its base type.
                table.types.values_mut().for_each(|oid| *oid = self.domains.base(*oid));
                tables.insert(name.clone(), table);
            }
            let table = &tables[name];
            let after = cursor.after.as_ref().filter(|after| {
                let fits = table.fits(after);
                if !fits {
                    tracing::warn!(prefix = %self.prefix, %name, "the saved snapshot position does not fit the table's key: reading it from its start");
                }
                fits
            });
            seq += 1;
            let token = format!("{:016x}", rand::random::<u64>());
            let again = Cursor {
                after: after.cloned(),
                ..cursor.clone()
            };
            self.state.lock_unpoisoned().window = Some(Window::of(seq, token.clone(), table, again));
            // Without a key a change cannot be matched to a row: writers
            // wait while the chunk is read, and both watermarks come with
            // its commit, nothing between them.
            let locked = table.key.is_none();
            if locked {
                sql.query("BEGIN").await?;
                sql.query(&format!("LOCK TABLE {} IN SHARE MODE", table.quoted)).await?;
            }
            self.emit(sql, seq, "L").await?;
            let rows = table.select(sql, after, self.size).await?;
            rows_read += rows.len();
            let next = match rows.last() {
                Some((_, position)) if rows.len() == self.size as usize => Cursor {
                    after: Some(position.clone()),
                    ..cursor.clone()
                },
                _ => Cursor {
                    tables: cursor.tables[1..].to_vec(),
                    after: None,
                    ..cursor.clone()
                },
            };
            if let Some(window) = self.state.lock_unpoisoned().window.as_mut() {
                window.rows = Some((rows, next));
            }
            self.emit(sql, seq, &format!("H:{token}")).await?;
            if locked {
                sql.query("COMMIT").await?;
            }
        }
    }

    /// Lays a decoded change over the chunk between its watermarks.
    pub(super) fn observe(&self, event: &Value) {
        if let Some(window) = self.state.lock_unpoisoned().window.as_mut() {
            window.observe(event);
        }
    }

    /// At one of this run's watermarks (a logical message's `content`, at
    /// `lsn`): the low one opens the window; the high one closes it and
    /// gives the chunk's events, with the cursor after them.
    pub(super) fn watermark(&self, content: &str, lsn: u64) -> Option<Handout> {
        at_watermark(&mut self.state.lock_unpoisoned().window, &self.nonce, content, lsn)
    }

    /// The chunk's events are handed out from `first` on: out until
    /// written (at once done when there were none).
    pub(super) fn handed(&self, first: Order, handout: Handout) -> Option<Cursor> {
        let Handout { keys, next, .. } = handout;
        let mut state = self.state.lock_unpoisoned();
        if keys.is_empty() {
            state.done = next.clone();
            return Some(next);
        }
        let from = state.done.clone();
        state.out = Some(Out {
            first,
            keys,
            from,
            next,
        });
        None
    }

    /// A chunk with nothing to hand out is done: saved, and the next may
    /// start (a failed save leaves the checkpoint a chunk behind: a crash
    /// reads that chunk again).
    pub(super) async fn skipped(&self, done: Cursor) {
        if let Err(error) = self.save(done, false).await {
            tracing::warn!(prefix = %self.prefix, %error, "cannot save the snapshot's progress");
        }
        self.free.notify_one();
    }

    /// What an exactly-once sink stores for the change at `order`: with
    /// where the snapshot goes on once it is written.
    pub(super) fn resume_text(&self, order: Order) -> String {
        let state = self.state.lock_unpoisoned();
        let cursor = state.out.as_ref().and_then(|out| out.cursor_at(order));
        resume_text(order, Some(cursor.as_ref().unwrap_or(&state.done)))
    }

    /// Everything up to `newest` is written: the chunk out too, if its last
    /// row is. The next chunk may start even if saving fails (the
    /// checkpoint is then a chunk behind, and a crash reads it again).
    pub(super) async fn written(&self, newest: Order) -> Result<(), ConnectorError> {
        let done = {
            let mut state = self.state.lock_unpoisoned();
            match state.out.take() {
                Some(out) if out.last() <= newest => {
                    state.done = out.next.clone();
                    out.next
                }
                other => {
                    state.out = other;
                    return Ok(());
                }
            }
        };
        let saved = self.save(done, false).await;
        self.free.notify_one();
        saved
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn window(identity: &[&str]) -> Window {
        Window {
            seq: 1,
            token: "t".into(),
            schema: "public".into(),
            table: "t".into(),
            names: vec![("public".into(), "t".into())],
            identity: identity.iter().map(|c| (*c).to_owned()).collect(),
            open: true,
            changed: HashMap::new(),
            truncated: false,
            rows: None,
            again: cursor(&["t"], Some(json!({"id": "0"}))),
        }
    }

    fn row(value: Value) -> Row {
        value.as_object().unwrap().clone()
    }

    fn cursor(tables: &[&str], after: Option<Value>) -> Cursor {
        Cursor {
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
            after: after.map(row),
            asked: tables.iter().map(|t| (*t).to_owned()).collect(),
            requested: 0,
        }
    }

    fn change(op: &str, before: Value, after: Value) -> Value {
        json!({"op": op, "before": before, "after": after, "source": {"schema": "public", "table": "t"}})
    }

    #[test]
    fn a_chunk_row_is_handed_out_as_of_its_high_watermark() {
        let mut w = window(&["id"]);
        let selected = |id: i64, big: &str| {
            (
                row(json!({"id": id, "v": 0, "big": big})),
                row(json!({"id": id.to_string()})),
            )
        };
        w.rows = Some((
            vec![
                selected(1, "b1"),
                selected(2, "b2"),
                selected(3, "b3"),
                selected(4, "b4"),
            ],
            Cursor::default(),
        ));
        // 1: updated without its TOASTed value; 2: deleted; 3: moved to 9;
        // 4: untouched; 5: inserted in the window (its event carries it).
        w.observe(&change("u", Value::Null, json!({"id": 1, "v": 1})));
        w.observe(&change("u", Value::Null, json!({"id": 1, "v": 2})));
        w.observe(&change("d", json!({"id": 2}), Value::Null));
        w.observe(&change("u", json!({"id": 3}), json!({"id": 9, "v": 3})));
        w.observe(&change("c", Value::Null, json!({"id": 5, "v": 5, "big": "b5"})));
        let mut other = change("d", json!({"id": 4}), Value::Null);
        other["source"]["table"] = json!("other");
        w.observe(&other);
        let handout = w.rows(7);
        let rows: Vec<&Value> = handout.events.iter().map(|e| &e["after"]).collect();
        assert_eq!(
            rows,
            vec![
                &json!({"id": 1, "v": 2, "big": "b1"}),
                &json!({"id": 4, "v": 0, "big": "b4"})
            ]
        );
        assert!(handout.events.iter().all(|e| e["op"] == "r"));
        assert_eq!(handout.keys, vec![row(json!({"id": "1"})), row(json!({"id": "4"}))]);
    }

    #[test]
    fn changes_are_matched_by_the_replica_identity_and_the_partitions() {
        // An identity index on `code`: a delete's old row has only it, the
        // key NULL; it came from a partition.
        let mut w = window(&["code"]);
        w.names.push(("public".into(), "t_2026".into()));
        w.rows = Some((
            vec![(row(json!({"id": 1, "code": "a"})), row(json!({"id": "1"})))],
            Cursor::default(),
        ));
        let mut leaf = change("d", json!({"id": null, "code": "a"}), Value::Null);
        leaf["source"]["table"] = json!("t_2026");
        w.observe(&leaf);
        assert!(w.rows(1).events.is_empty(), "deleted in a partition, by its identity");
    }

    #[test]
    fn a_truncate_in_the_window_reads_the_chunk_again() {
        let mut w = window(&["id"]);
        w.names.push(("public".into(), "t_2026".into()));
        w.rows = Some((
            vec![(row(json!({"id": 1})), row(json!({"id": "1"})))],
            cursor(&["u"], None),
        ));
        let mut leaf = change("t", Value::Null, Value::Null);
        leaf["source"]["table"] = json!("t_2026");
        w.observe(&leaf);
        let handout = w.rows(1);
        assert!(handout.events.is_empty());
        assert_eq!(
            handout.next,
            cursor(&["t"], Some(json!({"id": "0"}))),
            "the same chunk again"
        );
    }

    #[test]
    fn before_the_low_watermark_nothing_is_laid_over() {
        let mut w = window(&["id"]);
        w.open = false;
        w.observe(&change("d", json!({"id": 1}), Value::Null));
        assert!(
            w.changed.is_empty(),
            "changes before the low watermark are older than the select"
        );
    }

    #[test]
    fn only_this_runs_watermarks_open_and_close_the_window() {
        let mut w = Some(window(&["id"]));
        w.as_mut().unwrap().open = false;
        for other in ["x:1:L", "n:2:L", "n:1", "n:x:L", ""] {
            assert!(at_watermark(&mut w, "n", other, 1).is_none());
            assert!(!w.as_ref().unwrap().open, "{other}");
        }
        assert!(at_watermark(&mut w, "n", "n:1:L", 1).is_none());
        assert!(w.as_ref().unwrap().open);
        // Forged from the low one, or before the rows are selected.
        assert!(at_watermark(&mut w, "n", "n:1:H", 1).is_none());
        assert!(at_watermark(&mut w, "n", "n:1:H:t", 1).is_none(), "no rows yet");
        w.as_mut().unwrap().rows = Some((Vec::new(), Cursor::default()));
        assert!(at_watermark(&mut w, "n", "n:1:H:forged", 1).is_none());
        assert!(w.is_some());
        assert!(at_watermark(&mut w, "n", "n:1:H:t", 1).is_some());
        assert!(w.is_none());
    }

    struct Stored(Mutex<Option<String>>);

    #[async_trait::async_trait]
    impl CheckpointStore for Stored {
        async fn load(&self) -> Result<Option<String>, crate::checkpoint::CheckpointError> {
            Ok(self.0.lock_unpoisoned().clone())
        }
        async fn save(&self, position: &str) -> Result<(), crate::checkpoint::CheckpointError> {
            *self.0.lock_unpoisoned() = Some(position.to_owned());
            Ok(())
        }
    }

    fn stored(saved: Option<Saved>) -> Arc<dyn CheckpointStore> {
        Arc::new(Stored(Mutex::new(saved.map(|s| serde_json::to_string(&s).unwrap()))))
    }

    #[tokio::test]
    async fn a_restart_goes_on_after_what_the_sink_holds_of_this_snapshot_else_the_checkpoint() {
        let tables = ["a".to_owned(), "b".to_owned()];
        let at = |commit| Order { commit, index: 0 };
        let saved = Saved {
            snapshot: cursor(&["a", "b"], Some(json!({"id": "10"}))),
            since: Some(0x40),
        };
        let store = stored(Some(saved.clone()));
        let held = cursor(&["a", "b"], Some(json!({"id": "12"})));
        let resumed = |written| resume(Some(&store), &tables, written, &[]);
        assert_eq!(
            resumed(Some((at(0x50), Some(held.clone())))).await.unwrap(),
            (held.clone(), Some(0x40))
        );
        assert_eq!(resumed(None).await.unwrap().0, saved.snapshot);
        assert_eq!(
            resumed(Some((at(0x30), Some(cursor(&[], None))))).await.unwrap().0,
            saved.snapshot,
            "a position from before the slot is an earlier snapshot's"
        );
        // Saved before the slot was made: the sink's cursor is an earlier one's.
        let fresh = stored(Some(Saved {
            snapshot: cursor(&["a", "b"], None),
            since: None,
        }));
        let from_start = resume(Some(&fresh), &tables, Some((at(0x90), Some(cursor(&[], None)))), &[]).await;
        assert_eq!(from_start.unwrap().0, cursor(&["a", "b"], None));
        // A table the spec no longer names is left out, its key with it;
        // one it names now is added.
        let now = ["b".to_owned(), "c".to_owned()];
        let (moved, _) = resume(Some(&store), &now, None, &[]).await.unwrap();
        assert_eq!(moved.tables, vec!["b".to_owned(), "c".to_owned()]);
        assert_eq!((moved.after, moved.asked), (None, now.to_vec()));
        // Without a checkpoint: the sink's cursor, with its own list of tables asked.
        let (held_only, _) = resume(None, &now, Some((at(1), Some(held))), &[]).await.unwrap();
        assert_eq!(held_only.tables, vec!["b".to_owned(), "c".to_owned()]);
        // Nothing saved, or something else saved: from the start.
        let other: Arc<dyn CheckpointStore> = Arc::new(Stored(Mutex::new(Some("12".into()))));
        assert_eq!(
            resume(Some(&other), &tables, None, &[]).await.unwrap().0,
            Cursor::of(&tables, &[])
        );
        assert_eq!(
            resume(None, &tables, None, &[]).await.unwrap().0,
            Cursor::of(&tables, &[])
        );
    }

    fn request(id: u64, tables: &[&str]) -> SnapshotRequest {
        SnapshotRequest {
            id,
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
        }
    }

    /// A request newer than what a snapshot holds adds its tables (the one
    /// being read again from its start, after the others); once held, it
    /// adds nothing; the sink's cursor of an earlier requested snapshot is
    /// not this one's.
    #[tokio::test]
    async fn snapshot_requests_add_their_tables_once() {
        let tables = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let at = |commit| Order { commit, index: 0 };
        let requests = [request(5, &["c", "a", "gone"]), request(7, &["b"])];
        // A stream whose snapshot is written: the requests' tables, in order.
        let written = stored(Some(Saved {
            snapshot: cursor(&[], None),
            since: Some(0x40),
        }));
        let (again, since) = asked_again(Some(&written), &tables, &requests, 0x99)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (again.tables, again.requested, since),
            (vec!["c".into(), "a".into(), "b".into()], 7, Some(0x40))
        );
        let held = stored(Some(Saved {
            snapshot: Cursor {
                requested: 7,
                ..cursor(&[], None)
            },
            since: None,
        }));
        assert_eq!(asked_again(Some(&held), &tables, &requests, 0x99).await.unwrap(), None);
        assert_eq!(
            asked_again(None, &tables, &requests, 0x99).await.unwrap(),
            None,
            "no store: not known"
        );
        let none = asked_again(Some(&stored(None)), &tables, &requests[1..], 0x99)
            .await
            .unwrap();
        assert_eq!(
            none.map(|(c, s)| (c.tables, s)),
            Some((vec!["b".to_owned()], Some(0x99)))
        );

        // A snapshot under way, reading a: a is read again after the rest.
        let under_way = stored(Some(Saved {
            snapshot: cursor(&["a", "b", "c"], Some(json!({"id": "3"}))),
            since: Some(0x40),
        }));
        let (cursor_now, _) = resume(Some(&under_way), &tables, None, &requests[..1]).await.unwrap();
        assert_eq!(cursor_now.tables, ["a", "b", "c", "a"]);
        assert_eq!((cursor_now.after.is_some(), cursor_now.requested), (true, 5));
        // Not begun yet: read once.
        let not_begun = stored(Some(Saved {
            snapshot: cursor(&["a", "b", "c"], None),
            since: Some(0x40),
        }));
        let (cursor_now, _) = resume(Some(&not_begun), &tables, None, &requests[..1]).await.unwrap();
        assert_eq!(cursor_now.tables, ["a", "b", "c"]);
        // Saved at its start with request 7: the sink's cursor of an
        // earlier snapshot (request 5) is not where this one goes on.
        let requested = stored(Some(Saved {
            snapshot: Cursor {
                requested: 7,
                asked: tables.to_vec(),
                ..cursor(&["b"], None)
            },
            since: Some(0x40),
        }));
        let earlier = Cursor {
            requested: 5,
            ..cursor(&[], None)
        };
        let (went_on, _) = resume(Some(&requested), &tables, Some((at(0x50), Some(earlier))), &requests)
            .await
            .unwrap();
        assert_eq!((went_on.tables, went_on.requested), (vec!["b".to_owned()], 7));
        let this_one = Cursor {
            requested: 7,
            asked: tables.to_vec(),
            ..cursor(&["b"], Some(json!({"id": "9"})))
        };
        let (went_on, _) = resume(
            Some(&requested),
            &tables,
            Some((at(0x50), Some(this_one.clone()))),
            &requests,
        )
        .await
        .unwrap();
        assert_eq!(went_on, this_one);
    }

    #[test]
    fn a_stored_position_says_where_the_snapshot_goes_on() {
        let order = |index| Order { commit: 0x50, index };
        let out = Out {
            first: order(3),
            keys: vec![row(json!({"id": "x|y"})), row(json!({"id": "z"}))],
            from: cursor(&["a", "b"], None),
            next: cursor(&["b"], None),
        };
        let in_a = |key: &str| {
            let mut c = cursor(&["a", "b"], None);
            c.after = Some(row(json!({"id": key})));
            c
        };
        assert_eq!(out.cursor_at(order(2)), None, "a change before the chunk");
        assert_eq!(out.cursor_at(order(3)), Some(in_a("x|y")));
        assert_eq!(out.cursor_at(order(4)), Some(cursor(&["b"], None)));
        assert_eq!(
            out.cursor_at(Order { commit: 0x60, index: 0 }),
            Some(cursor(&["b"], None))
        );
        let text = resume_text(order(3), out.cursor_at(order(3)).as_ref());
        assert_eq!(parse_resume(&text), Some((order(3), Some(in_a("x|y")))));
        assert_eq!(parse_resume(&order(3).text()), Some((order(3), None)));
        assert_eq!(
            parse_resume("cdc:0/50:3|{\"id\": 5}"),
            Some((order(3), None)),
            "not a cursor"
        );
        assert_eq!(parse_resume("cdc:x|{}"), None);
    }

    #[test]
    fn saved_keys_are_read_back_as_the_server_wrote_them() {
        assert_eq!(literal("it's \\ x"), "E'it''s \\\\ x'");
        assert_eq!(text_of(&json!("{1,2}")), "{1,2}");
        assert_eq!(text_of(&json!("\"a\"")), "\"a\"");
        let described = |identity: &str, index: Option<&str>| {
            (
                "public".to_owned(),
                "t".to_owned(),
                identity.to_owned(),
                Some(r#"[["id", "integer"], ["region", "text"]]"#.to_owned()),
                index.map(str::to_owned),
                None,
                Some(r#"{"id": 23, "region": 16390}"#.to_owned()),
            )
        };
        let table = Table::of("t".into(), described("d", None)).unwrap();
        assert_eq!(table.identity, vec!["id".to_owned(), "region".to_owned()]);
        assert_eq!(table.types.get("region"), Some(&16390), "a domain's own type");
        assert!(table.fits(&row(json!({"id": "1", "region": "x"}))));
        for other in [
            json!({"id": "1"}),
            json!({"id": "1", "region": null}),
            json!({"ctid": "(0,1)"}),
        ] {
            assert!(!table.fits(&row(other.clone())), "{other}");
        }
        let by_index = Table::of("t".into(), described("i", Some(r#"["region"]"#))).unwrap();
        assert_eq!(by_index.identity, vec!["region".to_owned()]);
    }
}
