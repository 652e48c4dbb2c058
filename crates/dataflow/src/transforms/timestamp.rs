//! `timestamp`: sets a field (default `created_at`) to the processing time,
//! in UTC. `format` is a Go reference layout as upstream takes it
//! (`2006-01-02T15:04:05Z07:00`), one of the names `RFC3339` (the default),
//! `RFC3339Nano`, `DateTime`, `DateOnly`, or `Unix` / `UnixMilli` for a
//! number of seconds / milliseconds. A layout with no Go token is written
//! as it is, as upstream does, except one that differs from a name only in
//! case (`rfc3339nano`): that is a typo, refused with the name it meant.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use serde::Deserialize;

use super::{Build, BuildError, Message, Outputs, Transform};
use crate::component::Component;
use crate::path::Path;

/// `config` of `timestamp`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TimestampConfig {
    /// Default `created_at`.
    pub field_name: Option<String>,
    /// Default RFC 3339.
    pub format: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("timestamp format {given:?} is not a layout: did you mean {meant}?")]
pub struct FormatError {
    pub given: String,
    pub meant: &'static str,
}

/// What a format name stands for.
enum Named {
    Layout(&'static str),
    Unix,
    UnixMilli,
}

/// The format names, as upstream spells them.
const NAMES: &[(&str, Named)] = &[
    ("RFC3339", Named::Layout("2006-01-02T15:04:05Z07:00")),
    ("RFC3339Nano", Named::Layout("2006-01-02T15:04:05.000000000Z07:00")),
    ("DateTime", Named::Layout("2006-01-02 15:04:05")),
    ("DateOnly", Named::Layout("2006-01-02")),
    ("Unix", Named::Unix),
    ("UnixMilli", Named::UnixMilli),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
    /// Fraction of a second with this many digits.
    Fraction(usize),
    /// `Z07:00`: `Z` in UTC.
    Zone,
    Literal(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Format {
    Layout(Vec<Token>),
    Unix,
    UnixMilli,
}

const TOKENS: &[(&str, Token)] = &[
    ("2006", Token::Year),
    (".000000000", Token::Fraction(9)),
    (".000000", Token::Fraction(6)),
    (".000", Token::Fraction(3)),
    ("Z07:00", Token::Zone),
    ("-07:00", Token::Zone),
    ("01", Token::Month),
    ("02", Token::Day),
    ("15", Token::Hour),
    ("04", Token::Minute),
    ("05", Token::Second),
];

fn layout(text: &str) -> Format {
    let mut tokens = Vec::new();
    let mut rest = text;
    let mut literal = String::new();
    while !rest.is_empty() {
        if let Some((t, token)) = TOKENS.iter().find(|(t, _)| rest.starts_with(t)) {
            if !literal.is_empty() {
                tokens.push(Token::Literal(std::mem::take(&mut literal)));
            }
            tokens.push(token.clone());
            rest = &rest[t.len()..];
        } else {
            let c = rest.chars().next().expect("rest is not empty");
            literal.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if !literal.is_empty() {
        tokens.push(Token::Literal(literal));
    }
    Format::Layout(tokens)
}

fn parse_format(name: Option<&str>) -> Result<Format, FormatError> {
    let name = name.filter(|n| !n.is_empty()).unwrap_or("RFC3339");
    if let Some((_, named)) = NAMES.iter().find(|(n, _)| *n == name) {
        return Ok(match named {
            Named::Layout(go) => layout(go),
            Named::Unix => Format::Unix,
            Named::UnixMilli => Format::UnixMilli,
        });
    }
    // A name in the wrong case is a typo, not a layout without tokens.
    if let Some((meant, _)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name.trim())) {
        return Err(FormatError {
            given: name.to_owned(),
            meant,
        });
    }
    Ok(layout(name))
}

fn render(format: &Format, at: SystemTime) -> Value {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    match format {
        Format::Unix => Value::from(secs),
        Format::UnixMilli => Value::from(i64::try_from(since.as_millis()).unwrap_or(i64::MAX)),
        Format::Layout(tokens) => {
            let (year, month, day) = sless_runtime::civil::civil_from_days(secs.div_euclid(86_400));
            let in_day = secs.rem_euclid(86_400);
            let mut out = String::new();
            for t in tokens {
                match t {
                    Token::Year => out.push_str(&format!("{year:04}")),
                    Token::Month => out.push_str(&format!("{month:02}")),
                    Token::Day => out.push_str(&format!("{day:02}")),
                    Token::Hour => out.push_str(&format!("{:02}", in_day / 3600)),
                    Token::Minute => out.push_str(&format!("{:02}", in_day % 3600 / 60)),
                    Token::Second => out.push_str(&format!("{:02}", in_day % 60)),
                    Token::Fraction(n) => {
                        let nanos = format!("{:09}", since.subsec_nanos());
                        out.push('.');
                        out.push_str(&nanos[..*n]);
                    }
                    Token::Zone => out.push('Z'),
                    Token::Literal(l) => out.push_str(l),
                }
            }
            Value::String(out)
        }
    }
}

pub struct Timestamp {
    field: Path,
    format: Format,
}

impl Timestamp {
    pub fn new(config: &TimestampConfig) -> Result<Self, BuildError> {
        Ok(Self {
            field: Path::parse(config.field_name.as_deref().unwrap_or("created_at"))
                .map_err(|e| BuildError::at("fieldName", e))?,
            format: parse_format(config.format.as_deref()).map_err(|e| BuildError::at("format", e))?,
        })
    }

    fn stamp(&self, mut message: Message, at: SystemTime) -> Message {
        self.field.set(&mut message.data, render(&self.format, at));
        message
    }
}

impl Component for Timestamp {
    const KIND: &'static str = "timestamp";
    type Config = TimestampConfig;
}

impl Build for Timestamp {
    fn build(config: TimestampConfig, _: &mut Outputs) -> Result<Self, BuildError> {
        Self::new(&config)
    }
}

impl Transform for Timestamp {
    fn apply(&self, message: Message) -> Vec<Message> {
        vec![self.stamp(message, SystemTime::now())]
    }
}

/// Whether `format` is accepted (for validating specs).
pub fn check_format(format: Option<&str>) -> Result<(), FormatError> {
    parse_format(format).map(drop)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn stamp(format: Option<&str>, field: Option<&str>) -> Value {
        let t = Timestamp::new(&TimestampConfig {
            field_name: field.map(str::to_owned),
            format: format.map(str::to_owned),
        })
        .unwrap();
        // 2015-08-30T12:36:00.123456789Z
        let at = UNIX_EPOCH + Duration::new(1_440_938_160, 123_456_789);
        t.stamp(Message::new(json!({"id": 1})), at).data
    }

    #[test]
    fn formats() {
        assert_eq!(
            stamp(None, None),
            json!({"id": 1, "created_at": "2015-08-30T12:36:00Z"})
        );
        assert_eq!(
            stamp(Some("RFC3339Nano"), Some("meta.at"))["meta"]["at"],
            "2015-08-30T12:36:00.123456789Z"
        );
        assert_eq!(stamp(Some("2006/01/02 15h04"), Some("d"))["d"], "2015/08/30 12h36");
        assert_eq!(stamp(Some("DateOnly"), Some("d"))["d"], "2015-08-30");
        assert_eq!(stamp(Some("Unix"), Some("t"))["t"], 1_440_938_160);
        assert_eq!(stamp(Some("UnixMilli"), Some("t"))["t"], 1_440_938_160_123i64);
        // No token: the text itself, as upstream writes it.
        assert_eq!(stamp(Some("processed"), Some("d"))["d"], "processed");
        // A name in the wrong case is a typo, not a constant.
        let typo = check_format(Some("rfc3339nano")).unwrap_err().to_string();
        assert!(typo.contains("did you mean RFC3339Nano"), "{typo}");
        assert!(check_format(Some(" unix ")).is_err());
        assert_eq!(sless_runtime::civil::civil_from_days(0), (1970, 1, 1));
        assert_eq!(sless_runtime::civil::civil_from_days(11_016), (2000, 2, 29));
    }
}
