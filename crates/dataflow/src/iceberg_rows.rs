//! JSON messages as the rows of an Iceberg table, and back: each column of
//! the table's Arrow schema from the message key of the same name (else one
//! differing in case only), each value converted exactly.
//!
//! | Iceberg | from a message | to a message |
//! |---|---|---|
//! | boolean | `true`/`false` | the same |
//! | int, long | an integer (or its text) | a number |
//! | float, double | a number (or its text) | a number |
//! | decimal(p, s) | a number or its text, at most `s` decimals, read digit by digit | the digits as text (`"1.10"`) |
//! | date | `"YYYY-MM-DD"` | the same |
//! | time | `"HH:MM:SS[.ffffff]"` | the same |
//! | timestamp, timestamptz | RFC 3339 text (an offset, `Z` or none) | RFC 3339 in UTC, microseconds (`…Z` for timestamptz) |
//! | string | text; any other JSON value as its JSON text | text |
//! | uuid | its text | the same |
//! | binary, fixed | base64 text | base64 text |
//!
//! Nested types (struct, list, map) are refused by column when a connector
//! opens. A key the table has no column for is left out; a column no key
//! names is NULL, which a required column refuses (the batch's data error).

use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Date32Builder, Decimal128Builder, FixedSizeBinaryBuilder, Float32Builder, Float64Builder,
    Int32Builder, Int64Builder, LargeBinaryBuilder, StringBuilder, Time64MicrosecondBuilder,
    TimestampMicrosecondBuilder, TimestampNanosecondBuilder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type, Time64MicrosecondType,
    TimestampMicrosecondType, TimestampNanosecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, SchemaRef, TimeUnit};
use base64::Engine as _;
use serde_json::{Map, Value};
use sless_runtime::civil::{civil_from_days, days_from_civil};

const DAY_MICROS: i64 = 86_400_000_000;
const DAY_NANOS: i64 = 86_400_000_000_000;

/// Why a column cannot be written or read here, if it cannot.
pub fn unsupported(field: &Field) -> Option<String> {
    match field.data_type() {
        DataType::Boolean
        | DataType::Int32
        | DataType::Int64
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal128(_, _)
        | DataType::Date32
        | DataType::Time64(TimeUnit::Microsecond)
        | DataType::Timestamp(TimeUnit::Microsecond | TimeUnit::Nanosecond, _)
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::FixedSizeBinary(_)
        | DataType::Binary
        | DataType::LargeBinary => None,
        other => Some(format!(
            "column {:?} is of type {other}, which the nessie connector does not carry (nested types are not supported)",
            field.name()
        )),
    }
}

/// `row`'s value for `name`: its key of that name, else one differing in
/// case only (Iceberg tables made by Trino or Spark keep lower-case names).
fn field_of<'a>(row: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    row.get(name)
        .or_else(|| row.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v))
}

/// The columns of an Iceberg schema that are of type `uuid` (Arrow has them
/// as 16-byte fixed binary, as it has `fixed[16]`).
pub fn uuid_columns(schema: &iceberg::spec::Schema) -> Vec<String> {
    schema
        .as_struct()
        .fields()
        .iter()
        .filter(|f| *f.field_type == iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Uuid))
        .map(|f| f.name.clone())
        .collect()
}

/// The rows as a batch of `schema` (`uuids` naming its uuid columns); an
/// error names the row and the column.
pub fn to_batch(schema: &SchemaRef, uuids: &[String], rows: &[&Map<String, Value>]) -> Result<RecordBatch, String> {
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let values: Vec<Option<&Value>> = rows
                .iter()
                .map(|row| field_of(row, field.name()).filter(|v| !v.is_null()))
                .collect();
            if !field.is_nullable()
                && let Some(i) = values.iter().position(Option::is_none)
            {
                return Err(format!(
                    "message {i}: column {:?} is required and has no value",
                    field.name()
                ));
            }
            let uuid = uuids.contains(field.name());
            column(field, uuid, &values).map_err(|(i, e)| format!("message {i}: column {:?}: {e}", field.name()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| e.to_string())
}

/// Fills a builder from `values`, converting each with `convert`; an error
/// names the value's index.
macro_rules! build {
    ($builder:expr, $values:expr, $convert:expr) => {{
        let mut builder = $builder;
        for (i, value) in $values.iter().enumerate() {
            match value {
                None => builder.append_null(),
                Some(v) => builder.append_value($convert(v).map_err(|e: String| (i, e))?),
            }
        }
        Arc::new(builder.finish()) as ArrayRef
    }};
}

fn column(field: &Field, uuid: bool, values: &[Option<&Value>]) -> Result<ArrayRef, (usize, String)> {
    let n = values.len();
    Ok(match field.data_type() {
        DataType::Boolean => build!(BooleanBuilder::with_capacity(n), values, |v: &Value| v
            .as_bool()
            .ok_or_else(|| "not true or false".to_owned())),
        DataType::Int32 => build!(Int32Builder::with_capacity(n), values, |v: &Value| integer(v)
            .and_then(|i| i32::try_from(i).map_err(|_| "out of int's range".to_owned()))),
        DataType::Int64 => build!(Int64Builder::with_capacity(n), values, integer),
        DataType::Float32 => build!(Float32Builder::with_capacity(n), values, |v: &Value| float(v)
            .map(|f| f as f32)),
        DataType::Float64 => build!(Float64Builder::with_capacity(n), values, float),
        DataType::Decimal128(precision, scale) => build!(
            Decimal128Builder::with_capacity(n)
                .with_precision_and_scale(*precision, *scale)
                .map_err(|e| (0, e.to_string()))?,
            values,
            |v: &Value| decimal(v, *precision, *scale)
        ),
        DataType::Date32 => build!(Date32Builder::with_capacity(n), values, |v: &Value| text(v)
            .and_then(|t| days_of(t).ok_or_else(|| format!("{t:?} is not a date (YYYY-MM-DD)")))),
        DataType::Time64(TimeUnit::Microsecond) => {
            build!(Time64MicrosecondBuilder::with_capacity(n), values, |v: &Value| text(v)
                .and_then(|t| time_of(t).ok_or_else(|| format!("{t:?} is not a time (HH:MM:SS[.ffffff])")))
                .and_then(|ns| micros(i128::from(ns))))
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => build!(
            TimestampMicrosecondBuilder::with_capacity(n).with_timezone_opt(zone.clone()),
            values,
            |v: &Value| timestamp(v).and_then(micros)
        ),
        DataType::Timestamp(TimeUnit::Nanosecond, zone) => build!(
            TimestampNanosecondBuilder::with_capacity(n).with_timezone_opt(zone.clone()),
            values,
            |v: &Value| timestamp(v).and_then(|ns| i64::try_from(ns).map_err(|_| "out of range".to_owned()))
        ),
        DataType::Utf8 => build!(StringBuilder::with_capacity(n, 0), values, |v: &Value| Ok::<_, String>(
            match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }
        )),
        DataType::FixedSizeBinary(16) if uuid => fixed(values, 16, |v| {
            text(v).and_then(|t| uuid_bytes(t).ok_or_else(|| format!("{t:?} is not a UUID")))
        })?,
        DataType::FixedSizeBinary(len) => fixed(values, *len, base64_of)?,
        DataType::LargeBinary => build!(LargeBinaryBuilder::with_capacity(n, 0), values, base64_of),
        _ => return Err((0, unsupported(field).unwrap_or_else(|| "not supported".into()))),
    })
}

/// A fixed-size binary column of `len` bytes a value.
fn fixed(
    values: &[Option<&Value>],
    len: i32,
    convert: impl Fn(&Value) -> Result<Vec<u8>, String>,
) -> Result<ArrayRef, (usize, String)> {
    let mut builder = FixedSizeBinaryBuilder::with_capacity(values.len(), len);
    for (i, value) in values.iter().enumerate() {
        match value {
            None => builder.append_null(),
            Some(v) => {
                let bytes = convert(v).map_err(|e| (i, e))?;
                builder
                    .append_value(&bytes)
                    .map_err(|_| (i, format!("{} bytes for fixed[{len}]", bytes.len())))?;
            }
        }
    }
    Ok(Arc::new(builder.finish()))
}

fn text(v: &Value) -> Result<&str, String> {
    v.as_str().ok_or_else(|| format!("{v} is not text"))
}

fn integer(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64().ok_or_else(|| format!("{n} is not an integer")),
        Value::String(s) => s.trim().parse().map_err(|_| format!("{s:?} is not an integer")),
        other => Err(format!("{other} is not an integer")),
    }
}

fn float(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
        Value::String(s) => s.trim().parse().map_err(|_| format!("{s:?} is not a number")),
        other => Err(format!("{other} is not a number")),
    }
}

fn base64_of(v: &Value) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text(v)?)
        .map_err(|_| "not base64".to_owned())
}

/// A decimal's unscaled value, read from its digits (never through a
/// double): `"1.10"` at scale 2 is 110.
fn decimal(v: &Value, precision: u8, scale: i8) -> Result<i128, String> {
    let digits = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_owned(),
        other => return Err(format!("{other} is not a decimal")),
    };
    let refused = || format!("{digits:?} is not a decimal({precision}, {scale})");
    let (negative, unsigned) = match digits.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, digits.strip_prefix('+').unwrap_or(&digits)),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let scale = usize::try_from(scale).map_err(|_| refused())?;
    if whole.is_empty() && fraction.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(refused());
    }
    // Extra decimals are kept only when they are zeros: nothing is rounded.
    let (kept, dropped) = fraction.split_at(fraction.len().min(scale));
    if dropped.bytes().any(|b| b != b'0') {
        return Err(format!("{digits:?} has more than {scale} decimals"));
    }
    let all = format!("{whole}{kept:0<scale$}");
    let significant = all.trim_start_matches('0');
    if significant.len() > usize::from(precision) {
        return Err(format!("{digits:?} has more than {precision} digits"));
    }
    let value: i128 = if significant.is_empty() {
        0
    } else {
        significant.parse().map_err(|_| refused())?
    };
    Ok(if negative { -value } else { value })
}

/// `text`'s digits as a number, if it is all ASCII digits.
fn digits(text: &str) -> Option<i64> {
    (!text.is_empty() && text.len() <= 9 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// Days since 1970-01-01 of `YYYY-MM-DD` (years 0001 to 9999).
fn days_of(text: &str) -> Option<i32> {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return None;
    }
    let y = digits(text.get(..4)?)?;
    let m = u32::try_from(digits(text.get(5..7)?)?).ok()?;
    let d = u32::try_from(digits(text.get(8..)?)?).ok()?;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => return None,
    };
    if y == 0 || !(1..=days_in_month).contains(&d) {
        return None;
    }
    i32::try_from(days_from_civil(y, m, d)).ok()
}

/// Nanoseconds since midnight of `HH:MM[:SS[.fffffffff]]`.
fn time_of(text: &str) -> Option<i64> {
    let (hms, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut parts = hms.split(':');
    let mut field = |max: i64| {
        parts
            .next()
            .filter(|p| p.len() == 2)
            .and_then(digits)
            .filter(|v| *v <= max)
    };
    let (h, m) = (field(23)?, field(59)?);
    let s = match hms.len() {
        5 => 0,
        8 => field(59)?,
        _ => return None,
    };
    if hms.contains('.') || fraction.len() > 9 || (text.contains('.') && fraction.is_empty()) {
        return None;
    }
    let nanos = if fraction.is_empty() {
        0
    } else {
        digits(&format!("{fraction:0<9}"))?
    };
    Some(((h * 60 + m) * 60 + s) * 1_000_000_000 + nanos)
}

/// Nanoseconds since the epoch (UTC) of an RFC 3339 timestamp: a date, `T`
/// or a space, a time, and `Z`, an offset (`+03:00`, `+0300`, `+03`) or
/// none (UTC).
fn timestamp(v: &Value) -> Result<i128, String> {
    let t = text(v)?.trim();
    let refused = || format!("{t:?} is not an RFC 3339 timestamp");
    if !t.is_ascii() {
        return Err(refused());
    }
    let (date, rest) = t.split_at_checked(10).ok_or_else(refused)?;
    let days = i128::from(days_of(date).ok_or_else(refused)?);
    let rest = rest.strip_prefix(['T', 't', ' ']).ok_or_else(refused)?;
    let zone_at = rest.find(['Z', 'z', '+', '-']).unwrap_or(rest.len());
    let (time, zone) = rest.split_at(zone_at);
    let nanos = i128::from(time_of(time).ok_or_else(refused)?);
    let offset_minutes = match zone {
        "" | "Z" | "z" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let hhmm = zone[1..].replacen(':', "", 1);
            let (h, m) = match hhmm.len() {
                2 => (digits(&hhmm), Some(0)),
                4 => (digits(&hhmm[..2]), digits(&hhmm[2..])),
                _ => (None, None),
            };
            match (h, m) {
                (Some(h), Some(m)) if h <= 23 && m <= 59 => sign * (h * 60 + m),
                _ => return Err(refused()),
            }
        }
    };
    Ok(days * i128::from(DAY_NANOS) + nanos - i128::from(offset_minutes) * 60_000_000_000)
}

/// `nanos` in microseconds, refused when that would drop digits.
fn micros(nanos: i128) -> Result<i64, String> {
    if nanos % 1000 != 0 {
        return Err("has more precision than microseconds".into());
    }
    i64::try_from(nanos / 1000).map_err(|_| "out of range".to_owned())
}

fn format_time(micros: i64) -> String {
    let (s, us) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    format!("{:02}:{:02}:{:02}.{us:06}", s / 3600, s / 60 % 60, s % 60)
}

fn format_date(days: i64) -> String {
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

fn format_timestamp(micros: i64, zoned: bool) -> String {
    let (days, time) = (micros.div_euclid(DAY_MICROS), micros.rem_euclid(DAY_MICROS));
    let zone = if zoned { "Z" } else { "" };
    format!("{}T{}{zone}", format_date(days), format_time(time))
}

fn uuid_bytes(text: &str) -> Option<Vec<u8>> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    (0..16)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn uuid_text(bytes: &[u8]) -> String {
    let hex = sless_runtime::hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The decimal text of an unscaled value at `scale`.
fn decimal_text(value: i128, scale: i8) -> String {
    let digits = value.unsigned_abs().to_string();
    let sign = if value < 0 { "-" } else { "" };
    match usize::try_from(scale) {
        Ok(0) | Err(_) => format!("{sign}{digits}"),
        Ok(scale) => {
            let padded = format!("{digits:0>width$}", width = scale + 1);
            let (whole, fraction) = padded.split_at(padded.len() - scale);
            format!("{sign}{whole}.{fraction}")
        }
    }
}

/// The rows of `batch` as JSON objects (`uuids` naming its uuid
/// columns), NULLs as JSON null.
pub fn from_batch(batch: &RecordBatch, uuids: &[String]) -> Result<Vec<Map<String, Value>>, String> {
    let schema = batch.schema();
    let mut rows = vec![Map::with_capacity(schema.fields().len()); batch.num_rows()];
    for (field, array) in schema.fields().iter().zip(batch.columns()) {
        for (i, row) in rows.iter_mut().enumerate() {
            let value = if array.is_null(i) {
                Value::Null
            } else {
                json_of(field, uuids.contains(field.name()), array, i)?
            };
            row.insert(field.name().clone(), value);
        }
    }
    Ok(rows)
}

fn json_of(field: &Field, uuid: bool, array: &ArrayRef, i: usize) -> Result<Value, String> {
    let b64 = |bytes: &[u8]| Value::String(base64::engine::general_purpose::STANDARD.encode(bytes));
    Ok(match array.data_type() {
        DataType::Boolean => Value::Bool(array.as_boolean().value(i)),
        DataType::Int32 => Value::from(array.as_primitive::<Int32Type>().value(i)),
        DataType::Int64 => Value::from(array.as_primitive::<Int64Type>().value(i)),
        DataType::Float32 => Value::from(f64::from(array.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => Value::from(array.as_primitive::<Float64Type>().value(i)),
        DataType::Decimal128(_, scale) => {
            Value::String(decimal_text(array.as_primitive::<Decimal128Type>().value(i), *scale))
        }
        DataType::Date32 => Value::String(format_date(i64::from(array.as_primitive::<Date32Type>().value(i)))),
        DataType::Time64(TimeUnit::Microsecond) => {
            Value::String(format_time(array.as_primitive::<Time64MicrosecondType>().value(i)))
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => Value::String(format_timestamp(
            array.as_primitive::<TimestampMicrosecondType>().value(i),
            zone.is_some(),
        )),
        DataType::Timestamp(TimeUnit::Nanosecond, zone) => Value::String(format_timestamp(
            array
                .as_primitive::<TimestampNanosecondType>()
                .value(i)
                .div_euclid(1000),
            zone.is_some(),
        )),
        DataType::Utf8 => Value::String(array.as_string::<i32>().value(i).to_owned()),
        DataType::LargeUtf8 => Value::String(array.as_string::<i64>().value(i).to_owned()),
        DataType::Utf8View => Value::String(array.as_string_view().value(i).to_owned()),
        DataType::FixedSizeBinary(16) if uuid => Value::String(uuid_text(array.as_fixed_size_binary().value(i))),
        DataType::FixedSizeBinary(_) => b64(array.as_fixed_size_binary().value(i)),
        DataType::Binary => b64(array.as_binary::<i32>().value(i)),
        DataType::LargeBinary => b64(array.as_binary::<i64>().value(i)),
        _ => return Err(unsupported(field).unwrap_or_else(|| "not supported".into())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Schema;
    use serde_json::json;

    #[test]
    fn decimals_keep_every_digit_and_refuse_what_they_would_round() {
        assert_eq!(decimal(&json!("1.10"), 10, 2), Ok(110));
        assert_eq!(decimal(&json!("-0.5"), 10, 2), Ok(-50));
        assert_eq!(decimal(&json!(42), 10, 2), Ok(4200));
        assert_eq!(
            decimal(&json!("12345678901234567890.12"), 38, 2),
            Ok(1_234_567_890_123_456_789_012)
        );
        assert_eq!(
            decimal(&json!("1.100"), 10, 2),
            Ok(110),
            "trailing zeros beyond the scale"
        );
        assert!(
            decimal(&json!("1.105"), 10, 2)
                .unwrap_err()
                .contains("more than 2 decimals")
        );
        assert!(
            decimal(&json!("123456"), 5, 0)
                .unwrap_err()
                .contains("more than 5 digits")
        );
        for bad in [json!("1e5"), json!(""), json!("."), json!("1.2.3"), json!(true)] {
            assert!(decimal(&bad, 10, 2).is_err(), "{bad}");
        }
        assert_eq!(decimal_text(110, 2), "1.10");
        assert_eq!(decimal_text(-5, 2), "-0.05");
        assert_eq!(decimal_text(7, 0), "7");
    }

    #[test]
    fn dates_times_and_timestamps_round_trip() {
        assert_eq!(days_of("1970-01-01"), Some(0));
        assert_eq!(days_of("2000-03-01"), Some(11017));
        assert_eq!(days_of("2023-02-29"), None);
        assert_eq!(days_of("9223372036854775807-01-01"), None);
        assert_eq!(days_of("2023-1-01"), None);
        assert_eq!(days_of("2024-02-29"), Some(19782));
        for days in [-719_162, -1, 0, 11017, 19782, 2_932_896] {
            assert_eq!(days_of(&format_date(days)).map(i64::from), Some(days));
        }
        assert_eq!(time_of("12:34:56.5"), Some(45_296_500_000_000));
        assert_eq!(time_of("12:34"), Some(45_240_000_000_000));
        for bad in [
            "24:00:00",
            "-1:00:00",
            "1:2:3",
            "12:34:56.",
            "12:34:56.1234567890",
            "12:3a:00",
        ] {
            assert_eq!(time_of(bad), None, "{bad}");
        }
        let utc = micros(timestamp(&json!("2026-12-07T10:00:00Z")).unwrap()).unwrap();
        let at = |text: &str| timestamp(&json!(text)).and_then(micros);
        assert_eq!(at("2026-12-07 13:00:00+03:00"), Ok(utc));
        assert_eq!(at("2026-12-07T05:30:00-0430"), Ok(utc));
        assert_eq!(format_timestamp(utc + 1, true), "2026-12-07T10:00:00.000001Z");
        assert_eq!(at(&format_timestamp(utc + 1, true)), Ok(utc + 1));
        assert_eq!(
            at("2026-12-07T10:00:00.0000001Z"),
            Err("has more precision than microseconds".into()),
            "never rounded"
        );
        for bad in [
            "yesterday",
            "999999-01-01T00:00:00Z",
            "2026-01-01T00:00:00+a\u{20ac}",
            "2026-01-01T00:00:00+25",
        ] {
            assert!(at(bad).is_err(), "{bad}");
        }
        assert!(timestamp(&json!(1_700_000_000)).is_err());
    }

    #[test]
    fn a_batch_round_trips_and_names_the_row_and_column_it_refuses() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("price", DataType::Decimal128(10, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true,
            ),
            Field::new("u", DataType::FixedSizeBinary(16), true),
            Field::new("name", DataType::Utf8, true),
            Field::new("raw", DataType::LargeBinary, true),
        ]));
        let rows = [
            json!({"id": 1, "price": "1.10", "at": "2026-12-07T10:00:00.123456Z",
                   "u": "123e4567-e89b-12d3-a456-426614174000", "NAME": "a", "raw": "AAE=", "extra": 1}),
            json!({"id": 2, "price": null, "name": {"nested": [1]}}),
        ];
        let maps: Vec<_> = rows.iter().map(|r| r.as_object().unwrap()).collect();
        let uuids = ["u".to_owned()];
        let batch = to_batch(&schema, &uuids, &maps).unwrap();
        let back = from_batch(&batch, &uuids).unwrap();
        assert_eq!(
            Value::Object(back[0].clone()),
            json!({"id": 1, "price": "1.10", "at": "2026-12-07T10:00:00.123456Z",
                   "u": "123e4567-e89b-12d3-a456-426614174000", "name": "a", "raw": "AAE="})
        );
        assert_eq!(
            Value::Object(back[1].clone()),
            json!({"id": 2, "price": null, "at": null, "u": null, "name": "{\"nested\":[1]}", "raw": null})
        );
        let missing = json!({"price": "1"});
        let error = to_batch(&schema, &uuids, &[missing.as_object().unwrap()]).unwrap_err();
        assert_eq!(error, "message 0: column \"id\" is required and has no value");
        let bad = json!({"id": 1, "price": "1.234"});
        let error = to_batch(&schema, &uuids, &[maps[0], bad.as_object().unwrap()]).unwrap_err();
        assert_eq!(error, "message 1: column \"price\": \"1.234\" has more than 2 decimals");
    }
}
