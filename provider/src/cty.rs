//! Terraform's values (cty) as the plugin protocol carries them: msgpack for
//! `DynamicValue`s, JSON for stored state, and JSON type descriptions for
//! schemas.

use std::collections::BTreeMap;
use std::io::Read;

use rmp::Marker;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

/// A cty type, as far as this provider uses them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Type {
    String,
    Number,
    Bool,
    List(Box<Type>),
    /// String keys to values of one type (an object value on the wire).
    Map(Box<Type>),
    Object(BTreeMap<String, Type>),
}

impl Type {
    /// The JSON form of the type in schemas, e.g. `["list","string"]`.
    pub fn json(&self) -> serde_json::Value {
        match self {
            Self::String => json!("string"),
            Self::Number => json!("number"),
            Self::Bool => json!("bool"),
            Self::List(t) => json!(["list", t.json()]),
            Self::Map(t) => json!(["map", t.json()]),
            Self::Object(attrs) => {
                let map: serde_json::Map<String, serde_json::Value> =
                    attrs.iter().map(|(k, t)| (k.clone(), t.json())).collect();
                json!(["object", map])
            }
        }
    }

    pub fn object<const N: usize>(attrs: [(&str, Type); N]) -> Self {
        Self::Object(attrs.into_iter().map(|(k, t)| (k.to_owned(), t)).collect())
    }
}

/// A cty value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    /// Not known until apply.
    Unknown,
    Bool(bool),
    Number(f64),
    String(String),
    List(Vec<Value>),
    Object(BTreeMap<String, Value>),
}

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("malformed msgpack: {0}")]
    Msgpack(String),
    #[error("malformed JSON state: {0}")]
    Json(#[from] serde_json::Error),
}

#[cfg(test)]
impl Value {
    pub fn str(s: impl Into<String>) -> Self {
        Self::String(s.into())
    }
}

impl Value {
    pub fn get(&self, name: &str) -> &Value {
        match self {
            Self::Object(m) => m.get(name).unwrap_or(&Value::Null),
            _ => &Value::Null,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Self::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Self::Null)
    }

    /// Whether this value or anything inside it is unknown.
    pub fn has_unknown(&self) -> bool {
        match self {
            Self::Unknown => true,
            Self::List(items) => items.iter().any(Value::has_unknown),
            Self::Object(m) => m.values().any(Value::has_unknown),
            _ => false,
        }
    }

    /// Fills in every attribute of `ty` an object lacks (as null), as cty
    /// requires of object values.
    pub fn conform(self, ty: &Type) -> Value {
        match (self, ty) {
            (Value::Object(mut m), Type::Object(attrs)) => Value::Object(
                attrs
                    .iter()
                    .map(|(k, t)| (k.clone(), m.remove(k).unwrap_or(Value::Null).conform(t)))
                    .collect(),
            ),
            (Value::List(items), Type::List(t)) => Value::List(items.into_iter().map(|v| v.conform(t)).collect()),
            (v, _) => v,
        }
    }

    pub fn to_msgpack(&self) -> Vec<u8> {
        let mut out = Vec::new();
        encode(self, &mut out);
        out
    }

    pub fn from_msgpack(bytes: &[u8]) -> Result<Value, CodecError> {
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        let mut reader = bytes;
        decode(&mut reader)
    }

    pub fn from_json(bytes: &[u8]) -> Result<Value, CodecError> {
        let v: serde_json::Value = serde_json::from_slice(bytes)?;
        Ok(from_json_value(v))
    }

    /// A typed struct as a value of `ty`: the one way typed state becomes
    /// a cty value (attributes `ty` lacks are dropped, missing ones null).
    pub fn from_typed<T: Serialize>(typed: &T, ty: &Type) -> Result<Value, serde_json::Error> {
        Ok(from_json_value(serde_json::to_value(typed)?).conform(ty))
    }

    /// This value as a typed struct, unknowns read as absent: the one way a
    /// cty value becomes typed state.
    pub fn to_typed<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(self.to_json())
    }

    fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Null | Self::Unknown => serde_json::Value::Null,
            Self::Bool(b) => serde_json::Value::Bool(*b),
            // A whole number stays whole, so integer fields accept it.
            Self::Number(n) if n.fract() == 0.0 && n.abs() < 9.0e15 => json!(*n as i64),
            Self::Number(n) => {
                serde_json::Number::from_f64(*n).map_or(serde_json::Value::Null, serde_json::Value::Number)
            }
            Self::String(s) => serde_json::Value::String(s.clone()),
            Self::List(items) => serde_json::Value::Array(items.iter().map(Value::to_json).collect()),
            Self::Object(m) => serde_json::Value::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }
}

fn from_json_value(v: serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::Number(n) => Value::Number(n.as_f64().unwrap_or_default()),
        serde_json::Value::String(s) => Value::String(s),
        serde_json::Value::Array(a) => Value::List(a.into_iter().map(from_json_value).collect()),
        serde_json::Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, from_json_value(v))).collect()),
    }
}

// Writing into a Vec cannot fail, so encoder results are discarded.
fn encode(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => {
            let _ = rmp::encode::write_nil(out);
        }
        // cty's unknown value: extension type 0.
        Value::Unknown => {
            let _ = rmp::encode::write_ext_meta(out, 1, 0);
            out.push(0);
        }
        Value::Bool(b) => {
            let _ = rmp::encode::write_bool(out, *b);
        }
        Value::Number(n) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                let _ = rmp::encode::write_sint(out, *n as i64);
            } else {
                let _ = rmp::encode::write_f64(out, *n);
            }
        }
        Value::String(s) => {
            let _ = rmp::encode::write_str(out, s);
        }
        Value::List(items) => {
            let _ = rmp::encode::write_array_len(out, items.len() as u32);
            for item in items {
                encode(item, out);
            }
        }
        Value::Object(m) => {
            let _ = rmp::encode::write_map_len(out, m.len() as u32);
            for (k, v) in m {
                let _ = rmp::encode::write_str(out, k);
                encode(v, out);
            }
        }
    }
}

fn bad(what: impl Into<String>) -> CodecError {
    CodecError::Msgpack(what.into())
}

fn take<const N: usize>(r: &mut &[u8]) -> Result<[u8; N], CodecError> {
    let mut buf = [0u8; N];
    r.read_exact(&mut buf).map_err(|_| bad("truncated"))?;
    Ok(buf)
}

fn take_vec(r: &mut &[u8], len: usize) -> Result<Vec<u8>, CodecError> {
    if r.len() < len {
        return Err(bad("truncated"));
    }
    let (head, tail) = r.split_at(len);
    *r = tail;
    Ok(head.to_vec())
}

fn string(r: &mut &[u8], len: usize) -> Result<Value, CodecError> {
    String::from_utf8(take_vec(r, len)?)
        .map(Value::String)
        .map_err(|_| bad("string is not UTF-8"))
}

fn decode(r: &mut &[u8]) -> Result<Value, CodecError> {
    let marker = rmp::decode::read_marker(r).map_err(|_| bad("truncated"))?;
    let len16 = |r: &mut &[u8]| take::<2>(r).map(|b| usize::from(u16::from_be_bytes(b)));
    let len32 = |r: &mut &[u8]| take::<4>(r).map(|b| u32::from_be_bytes(b) as usize);
    Ok(match marker {
        Marker::Null => Value::Null,
        Marker::True => Value::Bool(true),
        Marker::False => Value::Bool(false),
        Marker::FixPos(n) => Value::Number(f64::from(n)),
        Marker::FixNeg(n) => Value::Number(f64::from(n)),
        Marker::U8 => Value::Number(f64::from(take::<1>(r)?[0])),
        Marker::U16 => Value::Number(f64::from(u16::from_be_bytes(take(r)?))),
        Marker::U32 => Value::Number(f64::from(u32::from_be_bytes(take(r)?))),
        Marker::U64 => Value::Number(u64::from_be_bytes(take(r)?) as f64),
        Marker::I8 => Value::Number(f64::from(i8::from_be_bytes(take(r)?))),
        Marker::I16 => Value::Number(f64::from(i16::from_be_bytes(take(r)?))),
        Marker::I32 => Value::Number(f64::from(i32::from_be_bytes(take(r)?))),
        Marker::I64 => Value::Number(i64::from_be_bytes(take(r)?) as f64),
        Marker::F32 => Value::Number(f64::from(f32::from_be_bytes(take(r)?))),
        Marker::F64 => Value::Number(f64::from_be_bytes(take(r)?)),
        Marker::FixStr(n) => string(r, usize::from(n))?,
        Marker::Str8 => {
            let n = usize::from(take::<1>(r)?[0]);
            string(r, n)?
        }
        Marker::Str16 => {
            let n = len16(r)?;
            string(r, n)?
        }
        Marker::Str32 => {
            let n = len32(r)?;
            string(r, n)?
        }
        Marker::FixArray(n) => list(r, usize::from(n))?,
        Marker::Array16 => {
            let n = len16(r)?;
            list(r, n)?
        }
        Marker::Array32 => {
            let n = len32(r)?;
            list(r, n)?
        }
        Marker::FixMap(n) => map(r, usize::from(n))?,
        Marker::Map16 => {
            let n = len16(r)?;
            map(r, n)?
        }
        Marker::Map32 => {
            let n = len32(r)?;
            map(r, n)?
        }
        // Any extension is an unknown value (cty uses type 0, and newer
        // Terraform a refined unknown with its own type).
        Marker::FixExt1 | Marker::FixExt2 | Marker::FixExt4 | Marker::FixExt8 | Marker::FixExt16 => {
            let len = match marker {
                Marker::FixExt1 => 1,
                Marker::FixExt2 => 2,
                Marker::FixExt4 => 4,
                Marker::FixExt8 => 8,
                _ => 16,
            };
            take_vec(r, len + 1)?;
            Value::Unknown
        }
        Marker::Ext8 => {
            let n = usize::from(take::<1>(r)?[0]);
            take_vec(r, n + 1)?;
            Value::Unknown
        }
        Marker::Ext16 => {
            let n = len16(r)?;
            take_vec(r, n + 1)?;
            Value::Unknown
        }
        Marker::Ext32 => {
            let n = len32(r)?;
            take_vec(r, n + 1)?;
            Value::Unknown
        }
        other => return Err(bad(format!("unsupported marker {other:?}"))),
    })
}

fn list(r: &mut &[u8], n: usize) -> Result<Value, CodecError> {
    (0..n)
        .map(|_| decode(r))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::List)
}

fn map(r: &mut &[u8], n: usize) -> Result<Value, CodecError> {
    let mut m = BTreeMap::new();
    for _ in 0..n {
        let Value::String(k) = decode(r)? else {
            return Err(bad("map key is not a string"));
        };
        m.insert(k, decode(r)?);
    }
    Ok(Value::Object(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msgpack_round_trips() {
        let v = Value::Object(BTreeMap::from([
            ("name".into(), Value::str("q")),
            ("memory_mb".into(), Value::Number(128.0)),
            ("ratio".into(), Value::Number(0.5)),
            ("on".into(), Value::Bool(true)),
            ("gone".into(), Value::Null),
            ("later".into(), Value::Unknown),
            ("items".into(), Value::List(vec![Value::str("a"), Value::Number(-3.0)])),
            ("long".into(), Value::str("x".repeat(70_000))),
        ]));
        assert_eq!(Value::from_msgpack(&v.to_msgpack()).unwrap(), v);
    }

    #[test]
    fn unknown_is_cty_extension_zero() {
        assert_eq!(Value::Unknown.to_msgpack(), vec![0xd4, 0, 0]);
        // A refined unknown of newer Terraform (extension 12) is unknown too.
        assert_eq!(Value::from_msgpack(&[0xc7, 2, 12, 0x81, 0x01]).unwrap(), Value::Unknown);
    }

    #[test]
    fn types_and_conform() {
        let t = Type::object([("type", Type::String), ("config", Type::String)]);
        assert_eq!(t.json(), json!(["object", {"type": "string", "config": "string"}]));
        assert_eq!(Type::List(Box::new(Type::Bool)).json(), json!(["list", "bool"]));
        assert_eq!(Type::Map(Box::new(Type::String)).json(), json!(["map", "string"]));
        let v = Value::Object(BTreeMap::from([("type".into(), Value::str("kafka"))])).conform(&t);
        assert_eq!(v.get("config"), &Value::Null);
        assert_eq!(
            Value::from_json(br#"{"a": [1, null]}"#).unwrap().get("a"),
            &Value::List(vec![Value::Number(1.0), Value::Null])
        );
    }
}
