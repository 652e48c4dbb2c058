//! Message bodies and message attributes: SQS's validation rules and the MD5
//! digests that SDKs check.

use std::collections::BTreeMap;

use base64::Engine as _;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::requests::AttributeInput;
use crate::error::SqsError;

pub const MAX_MESSAGE_ATTRIBUTES: usize = 10;

/// One message attribute, as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttributeValue {
    pub data_type: String,
    pub string_value: Option<String>,
    pub binary_value: Option<Vec<u8>>,
}

pub type MessageAttributes = BTreeMap<String, AttributeValue>;

pub fn md5_hex(bytes: &[u8]) -> String {
    sless_runtime::hex::encode(&Md5::digest(bytes))
}

/// Characters SQS accepts in a body: those of XML 1.0.
pub fn validate_body(body: &str) -> Result<(), SqsError> {
    if body.is_empty() {
        return Err(SqsError::missing_parameter(
            "The request must contain the parameter MessageBody.",
        ));
    }
    let ok = |c: char| matches!(c, '\u{9}' | '\u{A}' | '\u{D}' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..='\u{10FFFF}');
    if let Some(bad) = body.chars().find(|c| !ok(*c)) {
        return Err(SqsError::invalid_message_contents(format!(
            "Invalid binary character '#x{:X}' was found in the message body, the set of allowed characters is \
             #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF",
            u32::from(bad)
        )));
    }
    Ok(())
}

fn validate_name(name: &str) -> Result<(), SqsError> {
    let valid_chars = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let lower = name.to_ascii_lowercase();
    if name.is_empty()
        || name.len() > 256
        || !valid_chars
        || name.starts_with('.')
        || name.ends_with('.')
        || name.contains("..")
        || lower.starts_with("aws.")
        || lower.starts_with("amazon.")
    {
        return Err(SqsError::invalid_parameter_value(format!(
            "Message attribute name '{name}' is invalid: use up to 256 of A-Z a-z 0-9 _ - ., not starting or \
             ending with '.', without '..', not starting with AWS. or Amazon."
        )));
    }
    Ok(())
}

/// Checks the message attributes sent with a message.
pub fn parse_attributes(map: &BTreeMap<String, AttributeInput>) -> Result<MessageAttributes, SqsError> {
    if map.len() > MAX_MESSAGE_ATTRIBUTES {
        return Err(SqsError::invalid_parameter_value(format!(
            "Number of message attributes [{}] exceeds the allowed maximum [{MAX_MESSAGE_ATTRIBUTES}].",
            map.len()
        )));
    }
    let mut out = MessageAttributes::new();
    for (name, attr) in map {
        validate_name(name)?;
        let data_type = attr.data_type.clone().unwrap_or_default();
        let base = data_type.split('.').next().unwrap_or_default();
        if !matches!(base, "String" | "Number" | "Binary") || data_type.len() > 256 {
            return Err(SqsError::invalid_parameter_value(format!(
                "The message attribute '{name}' has an invalid message attribute type, the set of supported type \
                 prefixes is Binary, Number, and String."
            )));
        }
        let string_value = attr.string_value.clone();
        let binary_value = match &attr.binary_value {
            Some(b64) => Some(base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| {
                SqsError::invalid_parameter_value(format!("The message attribute '{name}' has an invalid BinaryValue"))
            })?),
            None => None,
        };
        match (base, &string_value, &binary_value) {
            ("Binary", None, Some(_)) => {}
            ("String", Some(s), None) if !s.is_empty() => validate_body(s)?,
            ("Number", Some(s), None) if s.trim().parse::<f64>().is_ok() => {}
            _ => {
                return Err(SqsError::invalid_parameter_value(format!(
                    "The message attribute '{name}' must contain a non-empty value of type '{data_type}'"
                )));
            }
        }
        out.insert(
            name.clone(),
            AttributeValue {
                data_type,
                string_value,
                binary_value,
            },
        );
    }
    Ok(out)
}

/// Bytes the attributes count against the message size limit.
pub fn attributes_size(attrs: &MessageAttributes) -> usize {
    attrs
        .iter()
        .map(|(name, a)| {
            name.len()
                + a.data_type.len()
                + a.string_value.as_ref().map_or(0, String::len)
                + a.binary_value.as_ref().map_or(0, Vec::len)
        })
        .sum()
}

/// The MD5 of message attributes as SQS defines it: names sorted, each as
/// length-prefixed name, type, a transport byte and the value.
pub fn attributes_md5(attrs: &MessageAttributes) -> Option<String> {
    if attrs.is_empty() {
        return None;
    }
    let mut buf = Vec::new();
    let put = |bytes: &[u8], buf: &mut Vec<u8>| {
        buf.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        buf.extend_from_slice(bytes);
    };
    for (name, a) in attrs {
        put(name.as_bytes(), &mut buf);
        put(a.data_type.as_bytes(), &mut buf);
        match (&a.string_value, &a.binary_value) {
            (_, Some(binary)) => {
                buf.push(2);
                put(binary, &mut buf);
            }
            (Some(s), None) => {
                buf.push(1);
                put(s.as_bytes(), &mut buf);
            }
            (None, None) => buf.push(1),
        }
    }
    Some(md5_hex(&buf))
}

/// `MD5OfMessageSystemAttributes` of a message carrying `AWSTraceHeader`
/// (the only system attribute SQS takes): the same algorithm over the
/// system attributes, as the SDKs check it.
pub fn trace_header_md5(header: &str) -> String {
    let attribute = AttributeValue {
        data_type: "String".into(),
        string_value: Some(header.into()),
        binary_value: None,
    };
    let attributes = MessageAttributes::from([("AWSTraceHeader".to_owned(), attribute)]);
    attributes_md5(&attributes).unwrap_or_default()
}

/// The JSON protocol's form of attributes.
pub fn attributes_json(attrs: &MessageAttributes) -> BTreeMap<String, Value> {
    attrs
        .iter()
        .map(|(name, a)| {
            let mut v = json!({"DataType": a.data_type});
            if let Some(s) = &a.string_value {
                v["StringValue"] = json!(s);
            }
            if let Some(b) = &a.binary_value {
                v["BinaryValue"] = json!(base64::engine::general_purpose::STANDARD.encode(b));
            }
            (name.clone(), v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attributes as the JSON protocol sends them.
    fn parse(value: Value) -> Result<MessageAttributes, SqsError> {
        parse_attributes(&serde_json::from_value(value).expect("attribute inputs"))
    }

    #[test]
    fn md5_of_attributes_matches_the_sqs_algorithm() {
        // The buffer of the documented algorithm, built by hand.
        let attrs = parse(json!({
            "a": {"DataType": "String", "StringValue": "b"},
        }))
        .unwrap();
        let mut expected = Vec::new();
        expected.extend_from_slice(&[0, 0, 0, 1, b'a', 0, 0, 0, 6]);
        expected.extend_from_slice(b"String");
        expected.extend_from_slice(&[1, 0, 0, 0, 1, b'b']);
        assert_eq!(attributes_md5(&attrs).unwrap(), md5_hex(&expected));
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        let mut traced = Vec::new();
        traced.extend_from_slice(&[0, 0, 0, 14]);
        traced.extend_from_slice(b"AWSTraceHeader");
        traced.extend_from_slice(&[0, 0, 0, 6]);
        traced.extend_from_slice(b"String");
        traced.extend_from_slice(&[1, 0, 0, 0, 3]);
        traced.extend_from_slice(b"t=1");
        assert_eq!(trace_header_md5("t=1"), md5_hex(&traced));
    }

    #[test]
    fn attribute_rules() {
        assert!(parse(json!({"AWS.x": {"DataType": "String", "StringValue": "v"}})).is_err());
        assert!(parse(json!({"a..b": {"DataType": "String", "StringValue": "v"}})).is_err());
        assert!(parse(json!({"n": {"DataType": "Number", "StringValue": "x"}})).is_err());
        assert!(parse(json!({"n": {"DataType": "Number.int", "StringValue": "12"}})).is_ok());
        assert!(parse(json!({"b": {"DataType": "Binary", "BinaryValue": "AAE="}})).is_ok());
        assert!(parse(json!({"t": {"DataType": "Map", "StringValue": "v"}})).is_err());
        let many: serde_json::Map<String, Value> = (0..11)
            .map(|i| (format!("k{i}"), json!({"DataType": "String", "StringValue": "v"})))
            .collect();
        assert!(parse(Value::Object(many)).is_err());
    }

    #[test]
    fn body_characters() {
        assert!(validate_body("hello\tworld\n✓").is_ok());
        assert!(validate_body("bad\u{1}").is_err());
        assert!(validate_body("").is_err());
    }
}
