//! A decoder of PostgreSQL's `pgoutput` logical replication messages
//! (protocol version 1), as the replication stream carries them, into
//! Debezium-shaped change events, each handed out as it is decoded (a
//! transaction is never held whole). Pure: the CDC source feeds it bytes
//! and keeps what it returns.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

/// A column of a published table, as a Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    name: String,
    type_oid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Relation {
    schema: String,
    table: String,
    columns: Vec<Column>,
}

/// A message the decoder cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput: {0}")]
pub struct DecodeError(String);

fn bad(what: &str) -> DecodeError {
    DecodeError(what.to_owned())
}

/// A cursor over one message.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(bad("message ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let end = self
            .bytes
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| bad("unterminated string"))?;
        let s = String::from_utf8_lossy(&self.bytes[..end]).into_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }
}

/// `X/Y`, PostgreSQL's text form of an LSN.
pub fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// The LSN of its text form.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// Microseconds since 2000-01-01 as milliseconds since the Unix epoch.
fn pg_time_ms(micros: u64) -> i64 {
    const UNIX_TO_PG_MS: i64 = 946_684_800_000;
    (micros as i64) / 1000 + UNIX_TO_PG_MS
}

/// How a json or jsonb value that is JSON's `null` travels inside the
/// source, where `null` is SQL NULL: a string beginning with a NUL, which
/// no text value holds; a json string that begins with one (json, unlike
/// jsonb, keeps `\u0000`) travels with one more. Events leave with
/// [`settle_json_nulls`].
const JSON_NULL: &str = "\0null";

/// A column's text value as JSON by its type: numbers, booleans and JSON
/// as themselves (JSON's `null` as [`JSON_NULL`]), everything else as its
/// text.
pub fn value_of(type_oid: u32, text: &str) -> Value {
    match type_oid {
        16 => Value::Bool(text == "t"),
        20 | 21 | 23 | 26 => text
            .parse::<i64>()
            .map_or_else(|_| Value::String(text.into()), Value::from),
        700 | 701 => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.into()), Value::Number),
        // numeric: a number only where f64 holds it exactly as written.
        1700 => text
            .parse::<f64>()
            .ok()
            .filter(|f| f.to_string() == text)
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.into()), Value::Number),
        114 | 3802 => match serde_json::from_str(text) {
            Ok(Value::Null) => Value::String(JSON_NULL.into()),
            Ok(Value::String(s)) if s.starts_with('\0') => Value::String(format!("\0{s}")),
            Ok(value) => value,
            Err(_) => Value::String(text.into()),
        },
        _ => Value::String(text.into()),
    }
}

/// An event as it leaves the source: each json or jsonb value of `after`
/// that is JSON's `null` becomes `null`, its column named in `nulls`
/// (`{"doc": "json"}`: a name no case transformation changes, and keys that
/// a deep one renames with `after`'s), so a sink tells it from SQL NULL; in
/// `before` it becomes `null` unnamed. A json string that began with a NUL
/// loses the one it travelled with.
pub fn settle_json_nulls(event: &mut Value) {
    let mut named = Map::new();
    for field in ["after", "before"] {
        let Some(row) = event.get_mut(field).and_then(Value::as_object_mut) else {
            continue;
        };
        for (column, value) in row.iter_mut() {
            let Some(text) = value.as_str().filter(|t| t.starts_with('\0')) else {
                continue;
            };
            if text == JSON_NULL {
                *value = Value::Null;
                if field == "after" {
                    named.insert(column.clone(), Value::String("json".into()));
                }
            } else {
                *value = Value::String(text[1..].to_owned());
            }
        }
    }
    if !named.is_empty() {
        event["nulls"] = Value::Object(named);
    }
}

fn tuple(r: &mut Reader, relation: &Relation) -> Result<Option<Value>, DecodeError> {
    let count = r.u16()? as usize;
    let mut row = Map::new();
    for i in 0..count {
        let kind = r.u8()?;
        let column = relation.columns.get(i).ok_or_else(|| bad("more values than columns"))?;
        let value = match kind {
            b'n' => Value::Null,
            // An unchanged TOASTed value is not sent: leave it out.
            b'u' => continue,
            b't' | b'b' => {
                let len = r.u32()? as usize;
                let bytes = r.take(len)?;
                value_of(column.type_oid, &String::from_utf8_lossy(bytes))
            }
            _ => return Err(bad("unknown tuple value kind")),
        };
        row.insert(column.name.clone(), value);
    }
    Ok(Some(Value::Object(row)))
}

/// The base type of each domain on the server (a domain over a domain, its
/// last base), as the source found them when it started: a column of a
/// domain type is read as its base type is (JSON as JSON, numbers as
/// numbers), as a query's rows give it. A domain made later reads as text
/// until the dataflow starts again.
#[derive(Debug, Clone, Default)]
pub struct Domains(std::sync::Arc<HashMap<u32, u32>>);

impl Domains {
    pub fn new(bases: HashMap<u32, u32>) -> Self {
        Self(std::sync::Arc::new(bases))
    }

    /// `oid`'s base type, or `oid` when it is no domain's.
    pub fn base(&self, oid: u32) -> u32 {
        self.0.get(&oid).copied().unwrap_or(oid)
    }
}

/// Decodes a stream of messages. Relations are remembered across
/// transactions.
#[derive(Debug, Default)]
pub struct Decoder {
    /// Column types are read as their domains' base types.
    domains: Domains,
    relations: HashMap<u32, Relation>,
    open: Option<Open>,
    /// The prefix of the logical messages kept ([`Decoder::watching`]).
    watched: Option<String>,
    /// The content of the last kept message, until taken.
    message: Option<String>,
}

/// The transaction being decoded.
#[derive(Debug)]
struct Open {
    xid: u32,
    commit_ms: i64,
    /// Where its commit record is: orders transactions as they committed.
    commit_lsn: u64,
}

impl Decoder {
    /// Whether a Begin has come without its Commit.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// A decoder reading columns of `domains` by their base types.
    pub fn new(domains: Domains) -> Self {
        Self {
            domains,
            ..Self::default()
        }
    }

    /// Keeps the content of transactional logical messages with `prefix`
    /// (`pg_logical_emit_message`; pgoutput sends them with `messages`).
    pub fn watching(self, prefix: String) -> Self {
        Self {
            watched: Some(prefix),
            ..self
        }
    }

    /// The content of the kept message the last feed decoded.
    pub fn take_message(&mut self) -> Option<String> {
        self.message.take()
    }

    /// The commit LSN of the transaction being decoded.
    pub fn commit_lsn(&self) -> Option<u64> {
        self.open.as_ref().map(|open| open.commit_lsn)
    }

    /// Feeds one message, adding the change events it holds to `changes`;
    /// at a Commit, the LSN its record ends at (a slot confirmed up to it
    /// never sends the transaction again).
    pub fn feed(&mut self, lsn: u64, message: &[u8], changes: &mut Vec<Value>) -> Result<Option<u64>, DecodeError> {
        let mut r = Reader { bytes: message };
        let tag = r.u8()?;
        match tag {
            b'B' => {
                let commit_lsn = r.u64()?;
                let commit = r.u64()?;
                let xid = r.u32()?;
                self.open = Some(Open {
                    xid,
                    commit_ms: pg_time_ms(commit),
                    commit_lsn,
                });
            }
            b'C' => {
                let _flags = r.u8()?;
                let _commit_lsn = r.u64()?;
                let end_lsn = r.u64()?;
                self.open.take().ok_or_else(|| bad("Commit without Begin"))?;
                return Ok(Some(end_lsn));
            }
            b'R' => {
                let id = r.u32()?;
                let schema = r.string()?;
                let table = r.string()?;
                let _identity = r.u8()?;
                let count = r.u16()?;
                let mut columns = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    let _flags = r.u8()?;
                    let name = r.string()?;
                    let type_oid = self.domains.base(r.u32()?);
                    let _modifier = r.u32()?;
                    columns.push(Column { name, type_oid });
                }
                self.relations.insert(id, Relation { schema, table, columns });
            }
            b'I' | b'U' | b'D' => {
                let id = r.u32()?;
                let relation = self
                    .relations
                    .get(&id)
                    .ok_or_else(|| bad("change before its Relation"))?;
                let (mut before, mut after) = (Value::Null, Value::Null);
                let mut kind = r.u8()?;
                if matches!(kind, b'K' | b'O') {
                    before = tuple(&mut r, relation)?.unwrap_or(Value::Null);
                    if tag == b'U' {
                        kind = r.u8()?;
                    }
                }
                if kind == b'N' {
                    after = tuple(&mut r, relation)?.unwrap_or(Value::Null);
                }
                let op = match tag {
                    b'I' => "c",
                    b'U' => "u",
                    _ => "d",
                };
                changes.push(self.event(op, before, after, &relation.schema, &relation.table, lsn)?);
            }
            b'T' => {
                let count = r.u32()?;
                let _options = r.u8()?;
                for _ in 0..count {
                    let id = r.u32()?;
                    let relation = self
                        .relations
                        .get(&id)
                        .ok_or_else(|| bad("Truncate before its Relation"))?;
                    changes.push(self.event("t", Value::Null, Value::Null, &relation.schema, &relation.table, lsn)?);
                }
            }
            b'M' => {
                let transactional = r.u8()? & 1 == 1;
                let _lsn = r.u64()?;
                let prefix = r.string()?;
                let len = r.u32()? as usize;
                let content = r.take(len)?;
                if transactional && self.watched.as_deref() == Some(prefix.as_str()) {
                    self.message = Some(String::from_utf8_lossy(content).into_owned());
                }
            }
            // Type and Origin carry no row changes.
            b'Y' | b'O' => {}
            _ => return Err(bad("unknown message type")),
        }
        Ok(None)
    }

    fn event(
        &self,
        op: &str,
        before: Value,
        after: Value,
        schema: &str,
        table: &str,
        lsn: u64,
    ) -> Result<Value, DecodeError> {
        let open = self.open.as_ref().ok_or_else(|| bad("change outside a transaction"))?;
        Ok(json!({
            "before": before,
            "after": after,
            "op": op,
            "source": {
                "connector": "postgresql",
                "schema": schema,
                "table": table,
                "lsn": lsn_text(lsn),
                "txId": open.xid,
                "ts_ms": open.commit_ms,
            },
        }))
    }
}

/// Milliseconds since the Unix epoch now: a snapshot event's `ts_ms`.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The event of a row read by the initial snapshot (`op: r`, as
/// Debezium's), at `lsn` (the slot's consistent point, or the chunk's high
/// watermark), read at `now_ms` ([`now_ms`]).
pub fn snapshot_event(schema: &str, table: &str, row: Value, lsn: u64, now_ms: i64) -> Value {
    json!({
        "before": null,
        "after": row,
        "op": "r",
        "source": {
            "connector": "postgresql",
            "schema": schema,
            "table": table,
            "lsn": lsn_text(lsn),
            "snapshot": true,
            "ts_ms": now_ms,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relation(id: u32) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0items\0");
        m.push(b'd');
        m.extend(2u16.to_be_bytes());
        for (name, oid) in [("id", 23u32), ("doc", 3802)] {
            m.push(1);
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn values(vals: &[Option<&str>]) -> Vec<u8> {
        let mut m = (vals.len() as u16).to_be_bytes().to_vec();
        for v in vals {
            match v {
                None => m.push(b'n'),
                Some(t) => {
                    m.push(b't');
                    m.extend((t.len() as u32).to_be_bytes());
                    m.extend(t.as_bytes());
                }
            }
        }
        m
    }

    fn begin(xid: u32) -> Vec<u8> {
        let mut m = vec![b'B'];
        m.extend(0x100u64.to_be_bytes());
        m.extend(0u64.to_be_bytes());
        m.extend(xid.to_be_bytes());
        m
    }

    fn commit(end: u64) -> Vec<u8> {
        let mut m = vec![b'C', 0];
        m.extend((end - 8).to_be_bytes());
        m.extend(end.to_be_bytes());
        m.extend(0u64.to_be_bytes());
        m
    }

    #[test]
    fn inserts_updates_and_deletes_come_as_debezium_events_as_decoded() {
        let mut d = Decoder::default();
        let mut changes = Vec::new();
        assert_eq!(d.feed(1, &begin(7), &mut changes).unwrap(), None);
        assert!(d.in_transaction());
        assert_eq!(d.commit_lsn(), Some(0x100));
        d.feed(2, &relation(99), &mut changes).unwrap();
        let mut insert = vec![b'I'];
        insert.extend(99u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(values(&[Some("1"), Some(r#"{"a":[1,2]}"#)]));
        d.feed(3, &insert, &mut changes).unwrap();
        assert_eq!(changes.len(), 1, "handed out before the commit");
        let mut update = vec![b'U'];
        update.extend(99u32.to_be_bytes());
        update.push(b'O');
        update.extend(values(&[Some("1"), None]));
        update.push(b'N');
        update.extend(values(&[Some("1"), Some("null")]));
        d.feed(4, &update, &mut changes).unwrap();
        let mut delete = vec![b'D'];
        delete.extend(99u32.to_be_bytes());
        delete.push(b'K');
        delete.extend(values(&[Some("1"), None]));
        d.feed(5, &delete, &mut changes).unwrap();
        assert_eq!(
            d.feed(6, &commit(0x2_0000_0010), &mut changes).unwrap(),
            Some(0x2_0000_0010)
        );
        assert!(!d.in_transaction());
        let ops: Vec<&str> = changes.iter().map(|c| c["op"].as_str().unwrap()).collect();
        assert_eq!(ops, ["c", "u", "d"]);
        assert_eq!(changes[0]["after"], json!({"id": 1, "doc": {"a": [1, 2]}}));
        assert_eq!(changes[0]["before"], Value::Null);
        assert_eq!(changes[1]["before"], json!({"id": 1, "doc": null}));
        assert_eq!(changes[2]["after"], Value::Null);
        assert_eq!(changes[0]["source"]["table"], "items");
        assert_eq!(changes[0]["source"]["txId"], 7);
        assert_eq!(changes[0]["source"]["lsn"], "0/3");
    }

    #[test]
    fn truncated_or_unknown_messages_are_errors_not_panics() {
        let mut d = Decoder::default();
        let mut changes = Vec::new();
        for bad in [&b""[..], b"B\x00", b"Zxx", b"C\x00\x01", b"I\x00\x00\x00\x63N"] {
            assert!(d.feed(1, bad, &mut changes).is_err(), "{bad:?}");
        }
        d.feed(1, &begin(1), &mut changes).unwrap();
        d.feed(2, &relation(5), &mut changes).unwrap();
        let mut insert = vec![b'I'];
        insert.extend(5u32.to_be_bytes());
        insert.push(b'N');
        insert.extend(3u16.to_be_bytes());
        assert!(
            d.feed(3, &insert, &mut changes).is_err(),
            "more values than columns, and cut short"
        );
        assert!(changes.is_empty());
    }

    #[test]
    fn only_transactional_messages_with_the_watched_prefix_are_kept() {
        let message = |flags: u8, prefix: &str, content: &str| {
            let mut m = vec![b'M', flags];
            m.extend(7u64.to_be_bytes());
            m.extend(prefix.as_bytes());
            m.push(0);
            m.extend((content.len() as u32).to_be_bytes());
            m.extend(content.as_bytes());
            m
        };
        let mut d = Decoder::default().watching("sless.snapshot.s".into());
        let mut changes = Vec::new();
        d.feed(1, &message(1, "sless.snapshot.s", "a:1:L"), &mut changes)
            .unwrap();
        assert_eq!(d.take_message().as_deref(), Some("a:1:L"));
        assert_eq!(d.take_message(), None);
        for (flags, prefix) in [(0, "sless.snapshot.s"), (1, "sless.snapshot.other"), (1, "")] {
            d.feed(1, &message(flags, prefix, "x"), &mut changes).unwrap();
            assert_eq!(d.take_message(), None, "{flags} {prefix}");
        }
        let cut = message(1, "sless.snapshot.s", "abc");
        assert!(d.feed(1, &cut[..cut.len() - 1], &mut changes).is_err());
        assert!(changes.is_empty());
    }

    #[test]
    fn lsns_round_trip_and_values_keep_their_types() {
        assert_eq!(lsn_text(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(parse_lsn("nope"), None);
        assert_eq!(value_of(16, "t"), json!(true));
        assert_eq!(value_of(20, "9007199254740993"), json!(9007199254740993_i64));
        assert_eq!(value_of(1700, "12.50"), json!("12.50"));
        assert_eq!(value_of(1700, "12.5"), json!(12.5));
        assert_eq!(value_of(25, "x"), json!("x"));
        assert_eq!(value_of(3802, "{bad"), json!("{bad"));
    }

    /// JSON's `null` in a json or jsonb column is told apart from SQL NULL:
    /// `null` either way, the former named in `nulls` (of `after`); a json
    /// string that looks like the way it travels stays that string.
    #[test]
    fn a_json_null_is_named_apart_from_sql_null() {
        let mut event = json!({
            "op": "u",
            "before": {"id": 1, "doc": value_of(3802, "null")},
            "after": {"id": 1, "doc": value_of(3802, "null"), "meta": value_of(114, " null "),
                      "gone": null, "kept": value_of(3802, "{\"a\": null}"), "text": value_of(25, "null"),
                      "odd": value_of(114, "\"\\u0000null\""), "odder": value_of(114, "\"\\u0000\\u0000x\"")},
        });
        settle_json_nulls(&mut event);
        assert_eq!(event["nulls"], json!({"doc": "json", "meta": "json"}));
        assert_eq!(event["after"]["doc"], Value::Null);
        assert_eq!(event["after"]["meta"], Value::Null);
        assert_eq!(event["after"]["kept"], json!({"a": null}));
        assert_eq!(event["after"]["text"], "null");
        assert_eq!(event["after"]["odd"], "\u{0}null");
        assert_eq!(event["after"]["odder"], "\u{0}\u{0}x");
        assert_eq!(event["before"]["doc"], Value::Null);
        let mut plain = json!({"op": "c", "before": null, "after": {"id": 2, "doc": null}});
        settle_json_nulls(&mut plain);
        assert_eq!(plain.get("nulls"), None, "only where there is one");
    }
}
