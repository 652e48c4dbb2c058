//! Avro for the Kafka connectors: schemas, the binary encoding to and from
//! the JSON the transformations work on, and the Confluent wire format
//! (magic byte 0, a 4-byte schema id, the Avro body) with a schema
//! registry (`schema_registry.rs`).
//!
//! Values map to JSON as a person reads them: a record is an object, an
//! enum its symbol, a union its branch's value (no `{"type": value}`
//! wrapper), bytes and fixed a string of code points 0–255 (Avro's JSON
//! encoding); logical types are their underlying values (a
//! `timestamp-millis` is a number). Decoding is bounded: nesting depth,
//! items per message and every length are checked against what the
//! message holds, so a hostile record cannot make the processor allocate.
//!
//! Over 500 lines: the schema parser, the decoder and the encoder walk one
//! `Schema` type, and their tests are the specification's examples and the
//! hostile messages; the schema registry client is a file of its own.

pub mod schema_registry;

use std::collections::HashMap;

use serde_json::{Map, Number, Value};

use crate::message::{ENTRY_SIZE, VALUE_SIZE};

/// Deepest nesting of schemas and values.
pub const MAX_DEPTH: usize = 64;
/// Most array and map items one message may hold.
pub const MAX_ITEMS: usize = 1_000_000;
/// Most memory one decoded message may take, as [`crate::message::value_size`]
/// counts it: a null takes no byte of the message but a whole value once
/// decoded, so the bytes a message has bound nothing.
pub const MAX_DECODED_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AvroError {
    #[error("invalid Avro schema: {0}")]
    Schema(String),
    #[error("the message is not valid Avro for its schema: {0}")]
    Decode(String),
    #[error("the message does not fit the Avro schema: {0}")]
    Encode(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Schema {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
    Record {
        fields: Vec<Field>,
    },
    Enum {
        symbols: Vec<String>,
    },
    Array(Box<Schema>),
    Map(Box<Schema>),
    Union(Vec<Schema>),
    Fixed {
        size: usize,
    },
    /// A named type defined elsewhere in the schema (recursion).
    Ref(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Field {
    name: String,
    schema: Schema,
    default: Option<Value>,
}

/// A parsed schema with its named types.
#[derive(Debug, Clone, PartialEq)]
pub struct AvroSchema {
    root: Schema,
    named: HashMap<String, Schema>,
}

fn schema_err(what: impl Into<String>) -> AvroError {
    AvroError::Schema(what.into())
}

impl AvroSchema {
    /// Parses a schema from its JSON text.
    pub fn parse(text: &str) -> Result<Self, AvroError> {
        let json: Value = serde_json::from_str(text).map_err(|e| schema_err(e.to_string()))?;
        let mut named = HashMap::new();
        let root = parse(&json, None, &mut named, 0)?;
        Ok(Self { root, named })
    }

    /// The value `bytes` (an Avro body) holds, as JSON.
    pub fn decode(&self, bytes: &[u8]) -> Result<Value, AvroError> {
        let mut d = Decoder {
            bytes,
            items: 0,
            decoded: 0,
            named: &self.named,
        };
        let value = d.value(&self.root, 0)?;
        if !d.bytes.is_empty() {
            return Err(AvroError::Decode(format!("{} bytes left over", d.bytes.len())));
        }
        Ok(value)
    }

    /// `value` in Avro's binary encoding.
    pub fn encode(&self, value: &Value) -> Result<Vec<u8>, AvroError> {
        let mut out = Vec::new();
        encode(&self.root, value, &self.named, &mut out, 0, "$")?;
        Ok(out)
    }
}

fn fullname(name: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !name.contains('.') && !ns.is_empty() => format!("{ns}.{name}"),
        _ => name.to_owned(),
    }
}

fn primitive(name: &str) -> Option<Schema> {
    Some(match name {
        "null" => Schema::Null,
        "boolean" => Schema::Boolean,
        "int" => Schema::Int,
        "long" => Schema::Long,
        "float" => Schema::Float,
        "double" => Schema::Double,
        "bytes" => Schema::Bytes,
        "string" => Schema::String,
        _ => return None,
    })
}

fn parse(
    json: &Value,
    namespace: Option<&str>,
    named: &mut HashMap<String, Schema>,
    depth: usize,
) -> Result<Schema, AvroError> {
    if depth > MAX_DEPTH {
        return Err(schema_err("nested too deeply"));
    }
    match json {
        Value::String(name) => primitive(name).map_or_else(
            || {
                let full = fullname(name, namespace);
                let known = named.contains_key(&full) || named.contains_key(name.as_str());
                if known {
                    Ok(Schema::Ref(if named.contains_key(&full) { full } else { name.clone() }))
                } else {
                    Err(schema_err(format!("unknown type {name:?}")))
                }
            },
            Ok,
        ),
        Value::Array(branches) => {
            let branches = branches
                .iter()
                .map(|b| parse(b, namespace, named, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            if branches.iter().any(|b| matches!(b, Schema::Union(_))) {
                return Err(schema_err("a union cannot hold a union"));
            }
            Ok(Schema::Union(branches))
        }
        Value::Object(o) => {
            let kind = o
                .get("type")
                .ok_or_else(|| schema_err("a schema object needs a type"))?;
            let Some(kind) = kind.as_str() else {
                return parse(kind, namespace, named, depth + 1);
            };
            let name = || -> Result<String, AvroError> {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| schema_err(format!("a {kind} needs a name")))?;
                let ns = o.get("namespace").and_then(Value::as_str).or(namespace);
                Ok(fullname(name, ns))
            };
            match kind {
                "record" | "error" => {
                    let full = name()?;
                    let inner_ns = full.rsplit_once('.').map(|(ns, _)| ns.to_owned());
                    // Defined before its fields, so they may refer to it.
                    named.insert(full.clone(), Schema::Record { fields: Vec::new() });
                    let fields = o
                        .get("fields")
                        .and_then(Value::as_array)
                        .ok_or_else(|| schema_err(format!("record {full} needs fields")))?;
                    let mut parsed = Vec::with_capacity(fields.len());
                    for f in fields {
                        let fname = f
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| schema_err(format!("a field of {full} needs a name")))?;
                        let ftype = f
                            .get("type")
                            .ok_or_else(|| schema_err(format!("field {fname} needs a type")))?;
                        parsed.push(Field {
                            name: fname.to_owned(),
                            schema: parse(ftype, inner_ns.as_deref(), named, depth + 1)?,
                            default: f.get("default").cloned(),
                        });
                    }
                    let record = Schema::Record { fields: parsed };
                    named.insert(full.clone(), record);
                    Ok(Schema::Ref(full))
                }
                "enum" => {
                    let full = name()?;
                    let symbols = o
                        .get("symbols")
                        .and_then(Value::as_array)
                        .ok_or_else(|| schema_err(format!("enum {full} needs symbols")))?
                        .iter()
                        .map(|s| {
                            s.as_str()
                                .map(str::to_owned)
                                .ok_or_else(|| schema_err("enum symbols are strings"))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    named.insert(full.clone(), Schema::Enum { symbols });
                    Ok(Schema::Ref(full))
                }
                "fixed" => {
                    let full = name()?;
                    let size = o
                        .get("size")
                        .and_then(Value::as_u64)
                        .and_then(|s| usize::try_from(s).ok())
                        .ok_or_else(|| schema_err(format!("fixed {full} needs a size")))?;
                    named.insert(full.clone(), Schema::Fixed { size });
                    Ok(Schema::Ref(full))
                }
                "array" => {
                    let items = o.get("items").ok_or_else(|| schema_err("an array needs items"))?;
                    Ok(Schema::Array(Box::new(parse(items, namespace, named, depth + 1)?)))
                }
                "map" => {
                    let values = o.get("values").ok_or_else(|| schema_err("a map needs values"))?;
                    Ok(Schema::Map(Box::new(parse(values, namespace, named, depth + 1)?)))
                }
                // A primitive with attributes (a logical type): its base.
                other => parse(&Value::String(other.to_owned()), namespace, named, depth + 1),
            }
        }
        _ => Err(schema_err("a schema is a name, an object or a union")),
    }
}

struct Decoder<'a> {
    bytes: &'a [u8],
    items: usize,
    /// The memory the values decoded so far take.
    decoded: usize,
    named: &'a HashMap<String, Schema>,
}

fn decode_err(what: impl Into<String>) -> AvroError {
    AvroError::Decode(what.into())
}

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], AvroError> {
        if n > self.bytes.len() {
            return Err(decode_err("the message ends early"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn long(&mut self) -> Result<i64, AvroError> {
        let mut value: u64 = 0;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .take(1)?
                .first()
                .ok_or_else(|| decode_err("the message ends early"))?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
            }
        }
        Err(decode_err("a number is longer than 10 bytes"))
    }

    fn length(&mut self) -> Result<usize, AvroError> {
        let n = self.long()?;
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= self.bytes.len())
            .ok_or_else(|| decode_err(format!("a length of {n} exceeds the message")))
    }

    /// An array's or a map's items, block by block.
    fn blocks(&mut self, mut each: impl FnMut(&mut Self) -> Result<(), AvroError>) -> Result<(), AvroError> {
        loop {
            let mut count = self.long()?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                count = count
                    .checked_neg()
                    .ok_or_else(|| decode_err("a block count overflows"))?;
                self.long()?; // the block's size in bytes
            }
            let count = usize::try_from(count).map_err(|_| decode_err("a block count overflows"))?;
            self.items = self.items.saturating_add(count);
            if self.items > MAX_ITEMS {
                return Err(decode_err(format!("more than {MAX_ITEMS} items")));
            }
            for _ in 0..count {
                each(self)?;
            }
        }
    }

    /// Counts `bytes` more of decoded memory against [`MAX_DECODED_BYTES`].
    fn grow(&mut self, bytes: usize) -> Result<(), AvroError> {
        self.decoded = self.decoded.saturating_add(bytes);
        if self.decoded > MAX_DECODED_BYTES {
            return Err(decode_err(format!(
                "decoded, the message would take more than {MAX_DECODED_BYTES} bytes"
            )));
        }
        Ok(())
    }

    fn value(&mut self, schema: &Schema, depth: usize) -> Result<Value, AvroError> {
        if depth > MAX_DEPTH {
            return Err(decode_err("nested too deeply"));
        }
        // A union and a reference are the value of their branch, counted there.
        if !matches!(schema, Schema::Union(_) | Schema::Ref(_)) {
            self.grow(VALUE_SIZE)?;
        }
        Ok(match schema {
            Schema::Null => Value::Null,
            Schema::Boolean => match self.take(1)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(decode_err(format!("{b} is not a boolean"))),
            },
            Schema::Int => {
                let n = self.long()?;
                i32::try_from(n).map_err(|_| decode_err(format!("{n} is not an int")))?;
                Value::from(n)
            }
            Schema::Long => Value::from(self.long()?),
            Schema::Float => {
                let b = self.take(4)?;
                number(f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            }
            Schema::Double => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                number(f64::from_le_bytes(a))
            }
            Schema::Bytes => {
                let n = self.length()?;
                // Code points 128–255 take two bytes of UTF-8.
                self.grow(2 * n)?;
                Value::String(self.take(n)?.iter().map(|b| char::from(*b)).collect())
            }
            Schema::String => {
                let n = self.length()?;
                self.grow(n)?;
                let text = std::str::from_utf8(self.take(n)?).map_err(|_| decode_err("a string is not UTF-8"))?;
                Value::String(text.to_owned())
            }
            Schema::Fixed { size } => {
                self.grow(2 * size)?;
                Value::String(self.take(*size)?.iter().map(|b| char::from(*b)).collect())
            }
            Schema::Enum { symbols } => {
                let i = self.long()?;
                let symbol = usize::try_from(i)
                    .ok()
                    .and_then(|i| symbols.get(i))
                    .ok_or_else(|| decode_err(format!("enum index {i} out of range")))?;
                self.grow(symbol.len())?;
                Value::String(symbol.clone())
            }
            Schema::Record { fields } => {
                let mut out = Map::new();
                for f in fields {
                    self.grow(ENTRY_SIZE + f.name.len())?;
                    out.insert(f.name.clone(), self.value(&f.schema, depth + 1)?);
                }
                Value::Object(out)
            }
            Schema::Array(items) => {
                let mut out = Vec::new();
                self.blocks(|d| {
                    out.push(d.value(items, depth + 1)?);
                    Ok(())
                })?;
                Value::Array(out)
            }
            Schema::Map(values) => {
                let mut out = Map::new();
                self.blocks(|d| {
                    d.grow(ENTRY_SIZE)?;
                    let key = match d.value(&Schema::String, depth + 1)? {
                        Value::String(k) => k,
                        _ => unreachable!("a string schema decodes to a string"),
                    };
                    out.insert(key, d.value(values, depth + 1)?);
                    Ok(())
                })?;
                Value::Object(out)
            }
            Schema::Union(branches) => {
                let i = self.long()?;
                let branch = usize::try_from(i)
                    .ok()
                    .and_then(|i| branches.get(i))
                    .ok_or_else(|| decode_err(format!("union branch {i} out of range")))?;
                self.value(branch, depth + 1)?
            }
            Schema::Ref(name) => {
                let named = self.named;
                let schema = named
                    .get(name)
                    .ok_or_else(|| decode_err(format!("unknown type {name}")))?;
                self.value(schema, depth + 1)?
            }
        })
    }
}

/// A float as JSON: NaN and the infinities have no JSON number, so null.
fn number(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn write_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    loop {
        let byte = (z & 0x7f) as u8;
        z >>= 7;
        if z == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn code_points(value: &Value, at: &str) -> Result<Vec<u8>, AvroError> {
    value
        .as_str()
        .ok_or_else(|| AvroError::Encode(format!("{at} must be a string of bytes")))?
        .chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| AvroError::Encode(format!("{at} has a character above U+00FF")))
        })
        .collect()
}

/// Whether `value` can take union branch `schema` (the first that can is used).
fn fits(schema: &Schema, value: &Value, named: &HashMap<String, Schema>) -> bool {
    match (schema, value) {
        (Schema::Null, Value::Null) => true,
        (Schema::Boolean, Value::Bool(_)) => true,
        (Schema::Int, Value::Number(n)) => n.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
        (Schema::Long, Value::Number(n)) => n.as_i64().is_some(),
        (Schema::Float | Schema::Double, Value::Number(_)) => true,
        (Schema::String | Schema::Bytes, Value::String(_)) => true,
        (Schema::Array(_), Value::Array(_)) => true,
        (Schema::Map(_), Value::Object(_)) => true,
        (Schema::Ref(name), _) => match named.get(name) {
            Some(Schema::Record { .. }) => value.is_object(),
            Some(Schema::Enum { symbols }) => value.as_str().is_some_and(|s| symbols.iter().any(|x| x == s)),
            Some(Schema::Fixed { size }) => value.as_str().is_some_and(|s| s.chars().count() == *size),
            _ => false,
        },
        _ => false,
    }
}

fn encode(
    schema: &Schema,
    value: &Value,
    named: &HashMap<String, Schema>,
    out: &mut Vec<u8>,
    depth: usize,
    at: &str,
) -> Result<(), AvroError> {
    if depth > MAX_DEPTH {
        return Err(AvroError::Encode(format!("{at} is nested too deeply")));
    }
    let wrong = |what: &str| AvroError::Encode(format!("{at} must be {what}"));
    match schema {
        Schema::Null => value.is_null().then_some(()).ok_or_else(|| wrong("null"))?,
        Schema::Boolean => out.push(u8::from(value.as_bool().ok_or_else(|| wrong("a boolean"))?)),
        Schema::Int => {
            let n = value
                .as_i64()
                .filter(|n| i32::try_from(*n).is_ok())
                .ok_or_else(|| wrong("a 32-bit integer"))?;
            write_long(out, n);
        }
        Schema::Long => write_long(out, value.as_i64().ok_or_else(|| wrong("a 64-bit integer"))?),
        Schema::Float => out.extend((value.as_f64().ok_or_else(|| wrong("a number"))? as f32).to_le_bytes()),
        Schema::Double => out.extend(value.as_f64().ok_or_else(|| wrong("a number"))?.to_le_bytes()),
        Schema::Bytes => {
            let bytes = code_points(value, at)?;
            write_long(out, bytes.len() as i64);
            out.extend(bytes);
        }
        Schema::String => {
            let s = value.as_str().ok_or_else(|| wrong("a string"))?;
            write_long(out, s.len() as i64);
            out.extend(s.as_bytes());
        }
        Schema::Fixed { size } => {
            let bytes = code_points(value, at)?;
            if bytes.len() != *size {
                return Err(wrong(&format!("{size} bytes")));
            }
            out.extend(bytes);
        }
        Schema::Enum { symbols } => {
            let s = value.as_str().ok_or_else(|| wrong("an enum symbol"))?;
            let i = symbols
                .iter()
                .position(|x| x == s)
                .ok_or_else(|| wrong("one of the enum's symbols"))?;
            write_long(out, i as i64);
        }
        Schema::Record { fields } => {
            let object = value.as_object().ok_or_else(|| wrong("an object"))?;
            for f in fields {
                let field_at = format!("{at}.{}", f.name);
                let v = object
                    .get(&f.name)
                    .or(f.default.as_ref())
                    .ok_or_else(|| AvroError::Encode(format!("{field_at} is missing and has no default")))?;
                encode(&f.schema, v, named, out, depth + 1, &field_at)?;
            }
        }
        Schema::Array(items) => {
            let list = value.as_array().ok_or_else(|| wrong("an array"))?;
            if !list.is_empty() {
                write_long(out, list.len() as i64);
                for (i, v) in list.iter().enumerate() {
                    encode(items, v, named, out, depth + 1, &format!("{at}[{i}]"))?;
                }
            }
            out.push(0);
        }
        Schema::Map(values) => {
            let map = value.as_object().ok_or_else(|| wrong("an object"))?;
            if !map.is_empty() {
                write_long(out, map.len() as i64);
                for (k, v) in map {
                    encode(&Schema::String, &Value::String(k.clone()), named, out, depth + 1, at)?;
                    encode(values, v, named, out, depth + 1, &format!("{at}.{k}"))?;
                }
            }
            out.push(0);
        }
        Schema::Union(branches) => {
            let i = branches
                .iter()
                .position(|b| fits(b, value, named))
                .ok_or_else(|| wrong("a value of one of the union's types"))?;
            write_long(out, i as i64);
            encode(&branches[i], value, named, out, depth + 1, at)?;
        }
        Schema::Ref(name) => {
            let schema = named
                .get(name)
                .ok_or_else(|| AvroError::Encode(format!("unknown type {name}")))?;
            encode(schema, value, named, out, depth + 1, at)?;
        }
    }
    Ok(())
}

/// The Confluent wire format: magic byte 0 and a big-endian schema id.
pub fn split_wire(payload: &[u8]) -> Result<(u32, &[u8]), AvroError> {
    match payload {
        [0, a, b, c, d, body @ ..] => Ok((u32::from_be_bytes([*a, *b, *c, *d]), body)),
        _ => Err(decode_err("no schema registry header (magic byte 0 and a schema id)")),
    }
}

/// `body` framed for schema `id`.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(0);
    out.extend(id.to_be_bytes());
    out.extend(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ORDER: &str = r#"{
        "type": "record", "name": "Order", "namespace": "shop",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "customer", "type": ["null", "string"], "default": null},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "items", "type": {"type": "array", "items": {
                "type": "record", "name": "Item", "fields": [
                    {"name": "sku", "type": "string"}, {"name": "qty", "type": "int"},
                    {"name": "price", "type": "double"}]}}},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "digest", "type": {"type": "fixed", "name": "MD5", "size": 2}},
            {"name": "next", "type": ["null", "Order"], "default": null}
        ]}"#;

    fn order() -> Value {
        json!({
            "id": 7, "customer": "ünï", "status": "PAID",
            "items": [{"sku": "a", "qty": 2, "price": 1.5}, {"sku": "b", "qty": -1, "price": 0.0}],
            "tags": {"k": "v"}, "at": 1_767_225_600_000_i64, "digest": "\u{0}\u{ff}",
            "next": {"id": 8, "customer": null, "status": "NEW", "items": [], "tags": {}, "at": 0,
                     "digest": "ab", "next": null}
        })
    }

    #[test]
    fn values_round_trip_through_the_binary_encoding() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let bytes = schema.encode(&order()).unwrap();
        assert_eq!(schema.decode(&bytes).unwrap(), order());
        // A default fills a missing field.
        let mut without = order();
        without.as_object_mut().unwrap().remove("customer");
        let decoded = schema.decode(&schema.encode(&without).unwrap()).unwrap();
        assert_eq!(decoded["customer"], Value::Null);
    }

    #[test]
    fn the_encoding_is_avros() {
        // Spec examples: zigzag longs and a length-prefixed string.
        let schema = AvroSchema::parse(
            r#"{"type":"record","name":"r","fields":[
            {"name":"a","type":"long"},{"name":"b","type":"string"}]}"#,
        )
        .unwrap();
        assert_eq!(
            schema.encode(&json!({"a": -64, "b": "foo"})).unwrap(),
            [0x7f, 0x06, b'f', b'o', b'o']
        );
        assert_eq!(schema.encode(&json!({"a": 64, "b": ""})).unwrap(), [0x80, 0x01, 0x00]);
    }

    #[test]
    fn hostile_messages_are_errors_not_allocations_or_panics() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let good = schema.encode(&order()).unwrap();
        for cut in 0..good.len() {
            assert!(schema.decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        let nulls = AvroSchema::parse(r#"{"type":"array","items":"null"}"#).unwrap();
        let mut huge = Vec::new();
        write_long(&mut huge, i64::MAX);
        assert!(nulls.decode(&huge).unwrap_err().to_string().contains("items"));
        let strings = AvroSchema::parse(r#""string""#).unwrap();
        let mut long = Vec::new();
        write_long(&mut long, 1 << 40);
        assert!(strings.decode(&long).is_err());
        assert!(strings.decode(&[0xff; 11]).is_err());
        assert!(strings.decode(&[0x02, 0xc3]).is_err(), "not UTF-8");
        let mut deep = r#""null""#.to_owned();
        for _ in 0..100 {
            deep = format!(r#"{{"type":"array","items":{deep}}}"#);
        }
        assert!(AvroSchema::parse(&deep).is_err());
        assert!(AvroSchema::parse(r#"{"type":"record","name":"x","fields":[{"name":"a","type":"Nope"}]}"#).is_err());
        assert!(AvroSchema::parse("[[\"null\"]]").is_err());
    }

    /// Nulls take no byte of a message: a 9-byte message (wire header
    /// included) of 100,000 records of 50 null fields took 487 MB decoded.
    #[test]
    fn a_message_of_nulls_cannot_decode_into_gigabytes() {
        let fields: Vec<String> = (0..50)
            .map(|i| format!(r#"{{"name":"f{i:02}","type":"null"}}"#))
            .collect();
        let schema = AvroSchema::parse(&format!(
            r#"{{"type":"array","items":{{"type":"record","name":"r","fields":[{}]}}}}"#,
            fields.join(",")
        ))
        .unwrap();
        let message = |records: i64| {
            let mut bytes = Vec::new();
            write_long(&mut bytes, records);
            bytes.push(0);
            bytes
        };
        assert_eq!(message(100_000).len(), 4, "a 9-byte record with its 5-byte header");
        let e = schema.decode(&message(100_000)).unwrap_err().to_string();
        assert!(e.contains("more than 16777216 bytes"), "{e}");
        // A message that fits decodes, and takes what was counted.
        let fits = schema.decode(&message(1_000)).unwrap();
        assert_eq!(fits.as_array().unwrap().len(), 1_000);
        assert!(crate::message::value_size(&fits) <= MAX_DECODED_BYTES);
        // Strings count their bytes: 20 strings of 1 MiB is over the bound
        // although every length fits the message.
        let strings = AvroSchema::parse(r#"{"type":"array","items":"string"}"#).unwrap();
        let mut big = Vec::new();
        write_long(&mut big, 20);
        for _ in 0..20 {
            write_long(&mut big, 1 << 20);
            big.extend(std::iter::repeat_n(b'x', 1 << 20));
        }
        big.push(0);
        assert!(strings.decode(&big).unwrap_err().to_string().contains("more than"));
    }

    #[test]
    fn encoding_names_the_field_that_does_not_fit() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let mut bad = order();
        bad["items"][1]["qty"] = json!(1u64 << 40);
        assert!(schema.encode(&bad).unwrap_err().to_string().contains("$.items[1].qty"));
        bad = order();
        bad["status"] = json!("LOST");
        assert!(schema.encode(&bad).unwrap_err().to_string().contains("$.status"));
        bad = order();
        bad.as_object_mut().unwrap().remove("id");
        assert!(schema.encode(&bad).unwrap_err().to_string().contains("$.id is missing"));
    }

    #[test]
    fn the_wire_format_has_a_magic_byte_and_an_id() {
        let framed = frame(258, b"xy");
        assert_eq!(framed, [0, 0, 0, 1, 2, b'x', b'y']);
        assert_eq!(split_wire(&framed).unwrap(), (258, &b"xy"[..]));
        assert!(split_wire(b"{\"json\":1}").is_err());
        assert!(split_wire(&[0, 0, 1]).is_err());
    }
}
