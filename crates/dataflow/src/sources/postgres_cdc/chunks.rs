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
//! unchanged TOASTed value included); a row the window deleted or
//! truncated is left out. The stream never waits for the snapshot, and no
//! row is handed out older than a change already handed out; a row changed
//! after the slot was made and before its chunk comes as that change and
//! again as a snapshot row.
//!
//! Every logical slot on the database sees the watermarks, so they carry
//! no data: this run's nonce and the chunk's number, and on the high one a
//! token no one could read before it was sent (a watermark forged from the
//! low one is left).
//!
//! Progress is kept in the dataflow's checkpoint store: the tables left
//! and the key after the last row written, and the chunk handed out but
//! maybe not yet written, with the order of its last row. One chunk is out
//! at a time. After a crash the snapshot goes on from there: the chunk out
//! is done when an exactly-once sink holds its last row, else read again
//! (so with other sinks one chunk may come twice). Without a checkpoint
//! store (`checkpointPersistence: false`) it starts over. A table without
//! a primary key is read in chunks by `ctid`: a row of it changed around a
//! chunk's select may come both as a snapshot row and as the change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::sync::Notify;

use super::pgoutput::{snapshot_event, value_of};
use super::position::Order;
use super::snapshot::SnapshotMark;
use crate::checkpoint::CheckpointStore;
use crate::sql::{quote, quote_ident, replication};
use crate::{ConnectorError, store_error};
use sless_runtime::sync::Unpoisoned;

/// Rows a chunk selects unless `snapshotChunkSize` says.
pub const DEFAULT_CHUNK: u32 = 5_000;
/// Most rows a chunk may select (they are held in memory until its high
/// watermark).
pub const MAX_CHUNK: u32 = 100_000;

type Row = Map<String, Value>;

/// Where the snapshot goes on: the tables left (the one being read first,
/// as the spec names them) and the key after which its rows are to read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Cursor {
    pub(super) tables: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) after: Option<Row>,
}

/// What the checkpoint store keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Saved {
    snapshot: Cursor,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending: Option<Pending>,
}

/// The chunk handed out and maybe not yet written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Pending {
    /// Its first and last rows' orders, as an exactly-once sink stores them.
    first: String,
    last: String,
    next: Cursor,
}

/// What an exactly-once sink stores for a change at `order`: its text, and
/// for a row of the chunk out, the row's key after a `|`.
pub(super) fn resume_text(order: Order, key: Option<&Row>) -> String {
    match key {
        Some(key) => format!("{}|{}", order.text(), Value::Object(key.clone())),
        None => order.text(),
    }
}

/// The order and the chunk row's key of a stored [`resume_text`].
pub(super) fn parse_resume(text: &str) -> Option<(Order, Option<Row>)> {
    match text.split_once('|') {
        Some((order, key)) => Some((Order::parse(order)?, Some(serde_json::from_str(key).ok()?))),
        None => Some((Order::parse(text)?, None)),
    }
}

/// Where a snapshot of `tables` goes on: the saved cursor; past the chunk
/// that was out when `written` (what an exactly-once sink holds) has its
/// last row, or past the row of it the sink holds; from the start without
/// a saved one. Tables the spec no longer names are left out.
pub(super) async fn resume(
    store: Option<&Arc<dyn CheckpointStore>>,
    tables: &[String],
    written: Option<(Order, Option<Row>)>,
) -> Result<Cursor, ConnectorError> {
    let saved = match store {
        Some(store) => store.load().await.map_err(store_error)?,
        None => None,
    };
    let saved: Option<Saved> = saved.and_then(|text| serde_json::from_str(&text).ok());
    let Some(saved) = saved else {
        return Ok(Cursor {
            tables: tables.to_vec(),
            after: None,
        });
    };
    let mut cursor = saved.snapshot;
    if let (Some(pending), Some((written, key))) = (saved.pending, written) {
        let (first, last) = (Order::parse(&pending.first), Order::parse(&pending.last));
        if last.is_some_and(|last| last <= written) {
            cursor = pending.next;
        } else if first.is_some_and(|first| first <= written)
            && let Some(key) = key
        {
            cursor.after = Some(key);
        }
    }
    let first = cursor.tables.first().cloned();
    cursor.tables.retain(|t| tables.contains(t));
    if cursor.tables.first() != first.as_ref() {
        cursor.after = None;
    }
    Ok(cursor)
}

/// A table being read: its names as the catalog has them and its key.
struct Table {
    schema: String,
    name: String,
    quoted: String,
    /// The primary key's columns; `None`: read by `ctid`.
    key: Option<Vec<String>>,
}

impl Table {
    async fn describe(sql: &mut replication::Connection, table: &str) -> Result<Self, ConnectorError> {
        let quoted = quote(table)?;
        // Quoted names are [A-Za-z0-9_."] only: literal as they are.
        let named = sql
            .query(&format!(
                "SELECT n.nspname, c.relname, (SELECT json_agg(a.attname ORDER BY k.i)::text \
                   FROM pg_index x CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, i) \
                   JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum \
                   WHERE x.indrelid = c.oid AND x.indisprimary) \
                 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = '{quoted}'::regclass"
            ))
            .await?;
        match named.rows.first().map(Vec::as_slice) {
            Some([Some(schema), Some(name), key]) => Ok(Self {
                schema: schema.clone(),
                name: name.clone(),
                quoted,
                key: match key {
                    Some(names) => Some(
                        serde_json::from_str(names)
                            .map_err(|e| ConnectorError::Closed(format!("the key of {table}: {e}")))?,
                    ),
                    None => None,
                },
            }),
            _ => Err(ConnectorError::Config(format!("table {table} not found"))),
        }
    }

    /// The next `size` rows after `after`, in key order.
    async fn select(
        &self,
        sql: &mut replication::Connection,
        after: Option<&Row>,
        size: u32,
    ) -> Result<Vec<(Row, Row)>, ConnectorError> {
        let t = &self.quoted;
        let query = match &self.key {
            Some(key) => {
                let keys = key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                let after = match after {
                    Some(after) => format!(
                        "WHERE ({keys}) > (SELECT {keys} FROM jsonb_populate_record(NULL::{t}, {}::jsonb))",
                        literal(&Value::Object(after.clone()).to_string())
                    ),
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
        Ok(found
            .rows
            .into_iter()
            .map(|values| {
                let mut row = Row::with_capacity(values.len());
                let mut position = Row::new();
                for (i, ((column, oid), value)) in found.columns.iter().zip(values).enumerate() {
                    let value = value.map_or(Value::Null, |text| value_of(*oid, &text));
                    if self.key.is_none() && i == 0 {
                        position.insert("ctid".into(), value);
                    } else {
                        row.insert(column.clone(), value);
                    }
                }
                if let Some(key) = &self.key {
                    position = key_values(&row, key).unwrap_or_default();
                }
                (row, position)
            })
            .collect())
    }
}

/// `text` as an escape string literal, whatever `standard_conforming_strings` is.
fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// The key columns' values of `row`, when it has them all.
fn key_values(row: &Row, key: &[String]) -> Option<Row> {
    key.iter().map(|k| row.get(k).map(|v| (k.clone(), v.clone()))).collect()
}

/// A key as text, to tell keys apart.
fn identity(key: &Row) -> String {
    Value::Object(key.clone()).to_string()
}

/// A chunk between its watermarks.
struct Window {
    seq: u64,
    /// What only its real high watermark carries.
    token: String,
    schema: String,
    table: String,
    key: Option<Vec<String>>,
    /// The low watermark has come: changes are laid over the chunk.
    open: bool,
    /// By key: the window's changes laid over each other, or `None` where
    /// the row was deleted last.
    changed: HashMap<String, Option<Row>>,
    truncated: bool,
    /// The selected rows and the cursor after them, once selected.
    rows: Option<(Vec<(Row, Row)>, Cursor)>,
}

impl Window {
    /// Lays a change of the stream over the chunk.
    fn observe(&mut self, event: &Value) {
        let source = &event["source"];
        if !self.open || source["table"] != self.table.as_str() || source["schema"] != self.schema.as_str() {
            return;
        }
        let Some(key) = &self.key else {
            return;
        };
        let row = |field: &str| event.get(field).and_then(Value::as_object);
        match event["op"].as_str() {
            Some("t") => {
                self.truncated = true;
                self.changed.clear();
            }
            Some("d") => {
                if let Some(old) = row("before").and_then(|b| key_values(b, key)) {
                    self.changed.insert(identity(&old), None);
                }
            }
            _ => {
                let Some(after) = row("after") else {
                    return;
                };
                let new = key_values(after, key);
                // A key change: the old key's row is gone.
                if let Some(old) = row("before").and_then(|b| key_values(b, key))
                    && Some(&old) != new.as_ref()
                {
                    self.changed.insert(identity(&old), None);
                }
                if let Some(new) = new {
                    let over = self.changed.entry(identity(&new)).or_insert(None);
                    match over {
                        Some(over) => over.extend(after.clone()),
                        None => *over = Some(after.clone()),
                    }
                }
            }
        }
    }

    /// The chunk's rows as of the high watermark, as events, with their
    /// keys.
    fn rows(self, lsn: u64) -> Handout {
        let (rows, next) = self.rows.unwrap_or_default();
        if self.truncated {
            return Handout {
                events: Vec::new(),
                keys: Vec::new(),
                next,
            };
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let (mut events, mut keys) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
        for (mut row, position) in rows {
            if self.key.is_some() {
                match self.changed.get(&identity(&position)) {
                    Some(None) => continue,
                    Some(Some(over)) => row.extend(over.clone()),
                    None => {}
                }
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
    keys: Vec<Row>,
    next: Cursor,
}

impl Out {
    /// The key of the row at `order`, if it is one of this chunk's.
    fn key(&self, order: Order) -> Option<&Row> {
        if order.commit != self.first.commit || order.index < self.first.index {
            return None;
        }
        self.keys.get((order.index - self.first.index) as usize)
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
}

impl Chunking {
    pub(super) fn new(
        slot: &str,
        size: u32,
        store: Option<Arc<dyn CheckpointStore>>,
        mark: Arc<SnapshotMark>,
        done: Cursor,
    ) -> Self {
        Self {
            prefix: format!("sless.snapshot.{slot}"),
            nonce: format!("{:016x}", rand::random::<u64>()),
            size,
            store,
            mark,
            state: Mutex::new(State {
                done,
                out: None,
                window: None,
            }),
            free: Notify::new(),
        }
    }

    async fn save(&self, saved: &Saved) -> Result<(), ConnectorError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let text = serde_json::to_string(saved).map_err(|e| ConnectorError::Transient(e.to_string()))?;
        store.save(&text).await.map_err(store_error)
    }

    /// Saves where the snapshot starts (a new slot: from the first table).
    pub(super) async fn start(&self) -> Result<(), ConnectorError> {
        let done = self.state.lock_unpoisoned().done.clone();
        self.save(&Saved {
            snapshot: done,
            pending: None,
        })
        .await
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
                tables.insert(name.clone(), Table::describe(sql, name).await?);
            }
            let table = &tables[name];
            seq += 1;
            let token = format!("{:016x}", rand::random::<u64>());
            self.state.lock_unpoisoned().window = Some(Window {
                seq,
                token: token.clone(),
                schema: table.schema.clone(),
                table: table.name.clone(),
                key: table.key.clone(),
                open: false,
                changed: HashMap::new(),
                truncated: false,
                rows: None,
            });
            self.emit(sql, seq, "L").await?;
            let rows = table.select(sql, cursor.after.as_ref(), self.size).await?;
            rows_read += rows.len();
            let next = match rows.last() {
                Some((_, position)) if rows.len() == self.size as usize => Cursor {
                    tables: cursor.tables.clone(),
                    after: Some(position.clone()),
                },
                _ => Cursor {
                    tables: cursor.tables[1..].to_vec(),
                    after: None,
                },
            };
            if let Some(window) = self.state.lock_unpoisoned().window.as_mut() {
                window.rows = Some((rows, next));
            }
            self.emit(sql, seq, &format!("H:{token}")).await?;
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

    /// The chunk's events are handed out from `first` on: saved as out
    /// until written (at once done when there were none).
    pub(super) async fn handed(&self, first: Order, handout: Handout) -> Result<(), ConnectorError> {
        let Handout { keys, next, .. } = handout;
        let saved = {
            let mut state = self.state.lock_unpoisoned();
            if keys.is_empty() {
                state.done = next.clone();
                Saved {
                    snapshot: next,
                    pending: None,
                }
            } else {
                let out = Out { first, keys, next };
                let pending = Pending {
                    first: first.text(),
                    last: out.last().text(),
                    next: out.next.clone(),
                };
                state.out = Some(out);
                Saved {
                    snapshot: state.done.clone(),
                    pending: Some(pending),
                }
            }
        };
        let none = saved.pending.is_none();
        self.save(&saved).await?;
        if none {
            self.free.notify_one();
        }
        Ok(())
    }

    /// What an exactly-once sink stores for the change at `order`.
    pub(super) fn resume_text(&self, order: Order) -> String {
        let state = self.state.lock_unpoisoned();
        resume_text(order, state.out.as_ref().and_then(|out| out.key(order)))
    }

    /// Everything up to `newest` is written: the chunk out too, if its last
    /// row is.
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
        self.save(&Saved {
            snapshot: done,
            pending: None,
        })
        .await?;
        self.free.notify_one();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn window() -> Window {
        Window {
            seq: 1,
            token: "t".into(),
            schema: "public".into(),
            table: "t".into(),
            key: Some(vec!["id".into()]),
            open: true,
            changed: HashMap::new(),
            truncated: false,
            rows: None,
        }
    }

    fn row(value: Value) -> Row {
        value.as_object().unwrap().clone()
    }

    fn change(op: &str, before: Value, after: Value) -> Value {
        json!({"op": op, "before": before, "after": after, "source": {"schema": "public", "table": "t"}})
    }

    #[test]
    fn a_chunk_row_is_handed_out_as_of_its_high_watermark() {
        let mut w = window();
        let selected = |id: i64, big: &str| (row(json!({"id": id, "v": 0, "big": big})), row(json!({"id": id})));
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
        assert_eq!(handout.keys, vec![row(json!({"id": 1})), row(json!({"id": 4}))]);
    }

    #[test]
    fn before_the_low_watermark_and_after_a_truncate_nothing_is_laid_over() {
        let mut w = window();
        w.open = false;
        w.observe(&change("d", json!({"id": 1}), Value::Null));
        assert!(
            w.changed.is_empty(),
            "changes before the low watermark are older than the select"
        );
        w.open = true;
        w.rows = Some((vec![(row(json!({"id": 1})), row(json!({"id": 1})))], Cursor::default()));
        w.observe(&change("t", Value::Null, Value::Null));
        assert!(w.rows(1).events.is_empty());
    }

    #[test]
    fn only_this_runs_watermarks_open_and_close_the_window() {
        let mut w = Some(window());
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

    #[tokio::test]
    async fn a_restart_goes_on_after_what_the_sink_holds() {
        let tables = ["a".to_owned(), "b".to_owned()];
        let order = |index| Order { commit: 0x50, index };
        let cursor = |tables: &[&str], after: Option<Value>| Cursor {
            tables: tables.iter().map(|t| (*t).to_owned()).collect(),
            after: after.map(row),
        };
        let saved = Saved {
            snapshot: cursor(&["a", "b"], Some(json!({"id": 10}))),
            pending: Some(Pending {
                first: order(3).text(),
                last: order(5).text(),
                next: cursor(&["a", "b"], Some(json!({"id": 13}))),
            }),
        };
        let store: Arc<dyn CheckpointStore> =
            Arc::new(Stored(Mutex::new(Some(serde_json::to_string(&saved).unwrap()))));
        let at = |written| resume(Some(&store), &tables, written);
        assert_eq!(
            at(None).await.unwrap(),
            saved.snapshot,
            "no sink position: the chunk again"
        );
        assert_eq!(at(Some((order(2), None))).await.unwrap(), saved.snapshot);
        let within = at(Some((order(4), Some(row(json!({"id": 12})))))).await.unwrap();
        assert_eq!(within, cursor(&["a", "b"], Some(json!({"id": 12}))));
        assert_eq!(
            at(Some((order(5), None))).await.unwrap(),
            saved.pending.clone().unwrap().next
        );
        assert_eq!(
            at(Some((Order { commit: 0x60, index: 0 }, None))).await.unwrap(),
            saved.pending.unwrap().next
        );
        // A table the spec no longer names is left out, and its key with it.
        let only_b = resume(Some(&store), &tables[1..], None).await.unwrap();
        assert_eq!(only_b, cursor(&["b"], None));
        // Nothing saved, or something else saved: from the start.
        let empty: Arc<dyn CheckpointStore> = Arc::new(Stored(Mutex::new(Some("12".into()))));
        assert_eq!(
            resume(Some(&empty), &tables, None).await.unwrap(),
            cursor(&["a", "b"], None)
        );
        assert_eq!(resume(None, &tables, None).await.unwrap(), cursor(&["a", "b"], None));
        assert_eq!(
            parse_resume(&resume_text(order(4), Some(&row(json!({"id": "x|y"})))))
                .unwrap()
                .1,
            Some(row(json!({"id": "x|y"})))
        );
    }

    #[test]
    fn literals_survive_quoting() {
        assert_eq!(literal("it's \\ x"), "E'it''s \\\\ x'");
    }
}
