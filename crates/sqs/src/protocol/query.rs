//! The query protocol: form-encoded `Action=…` requests with dotted list
//! parameters (`Attribute.1.Name`), and XML responses.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value};

use super::{Decoded, Protocol};
use crate::error::SqsError;

const NAMESPACE: &str = "http://queue.amazonaws.com/doc/2012-11-05/";
/// Most dotted segments in a parameter name: SQS's deepest,
/// `SendMessageBatchRequestEntry.N.MessageAttribute.N.Value.StringListValue.N`,
/// has seven. The parameter tree recurses per segment, so this bounds it.
const MAX_NAME_SEGMENTS: usize = 8;
/// Most parameters in one request (a full batch with every attribute has a
/// few hundred).
const MAX_PARAMETERS: usize = 4096;

/// A parameter tree: dotted keys nest, numeric segments make lists.
#[derive(Default)]
struct Node {
    value: Option<String>,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn insert(&mut self, path: &[&str], value: String) {
        match path.split_first() {
            None => self.value = Some(value),
            Some((head, rest)) => self.children.entry((*head).to_owned()).or_default().insert(rest, value),
        }
    }

    fn into_json(self) -> Value {
        if self.children.is_empty() {
            return self.value.map_or(Value::Null, Value::String);
        }
        if self.children.keys().all(|k| k.parse::<u32>().is_ok()) {
            let mut items: Vec<(u32, Node)> = self
                .children
                .into_iter()
                .filter_map(|(k, n)| k.parse().ok().map(|i| (i, n)))
                .collect();
            items.sort_by_key(|(i, _)| *i);
            return Value::Array(items.into_iter().map(|(_, n)| n.into_json()).collect());
        }
        Value::Object(self.children.into_iter().map(|(k, n)| (k, n.into_json())).collect())
    }
}

fn entries(value: Value) -> impl Iterator<Item = Value> {
    match value {
        Value::Array(items) => items.into_iter(),
        other => vec![other].into_iter(),
    }
}

/// A list of `{<key_field>: k, Value: v}` entries as the map `{k: v}`.
fn keyed(value: Value, key_field: &str) -> Value {
    Value::Object(
        entries(value)
            .filter_map(|e| {
                Some((
                    e.get(key_field)?.as_str()?.to_owned(),
                    e.get("Value").cloned().unwrap_or_default(),
                ))
            })
            .collect(),
    )
}

/// Reshapes query-protocol names into the JSON protocol's.
fn reshape(object: Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in object {
        match key.as_str() {
            "Attribute" => {
                out.insert("Attributes".into(), keyed(value, "Name"));
            }
            "Tag" => {
                let tags = keyed(value, "Key");
                out.insert("Tags".into(), tags.clone());
                out.insert("tags".into(), tags);
            }
            "MessageAttribute" => {
                out.insert("MessageAttributes".into(), keyed(value, "Name"));
            }
            "MessageSystemAttribute" => {
                out.insert("MessageSystemAttributes".into(), keyed(value, "Name"));
            }
            "AttributeName" | "MessageAttributeName" | "MessageSystemAttributeName" | "TagKey" | "AWSAccountId" => {
                out.insert(format!("{key}s"), Value::Array(entries(value).collect()));
            }
            "ActionName" => {
                out.insert("Actions".into(), Value::Array(entries(value).collect()));
            }
            k if k.ends_with("BatchRequestEntry") => {
                let list = entries(value)
                    .map(|e| match e {
                        Value::Object(o) => Value::Object(reshape(o)),
                        other => other,
                    })
                    .collect();
                out.insert("Entries".into(), Value::Array(list));
            }
            _ => {
                out.insert(key, value);
            }
        }
    }
    out
}

pub fn decode(query_string: Option<&str>, body: &Bytes) -> Result<Decoded, SqsError> {
    let mut root = Node::default();
    let mut action = None;
    let pairs = form_urlencoded::parse(query_string.unwrap_or_default().as_bytes()).chain(form_urlencoded::parse(body));
    for (count, (key, value)) in pairs.enumerate() {
        if count >= MAX_PARAMETERS {
            return Err(SqsError::malformed_request(format!(
                "A request has at most {MAX_PARAMETERS} parameters."
            )));
        }
        match key.as_ref() {
            "Action" => action = Some(value.into_owned()),
            "Version" | "AWSAccessKeyId" | "Signature" | "SignatureMethod" | "SignatureVersion" | "Timestamp" => {}
            k if k.starts_with("X-Amz-") => {}
            k => {
                let path: Vec<&str> = k.split('.').collect();
                if path.len() > MAX_NAME_SEGMENTS {
                    return Err(SqsError::malformed_request(format!(
                        "A parameter name has at most {MAX_NAME_SEGMENTS} dotted parts."
                    )));
                }
                root.insert(&path, value.into_owned());
            }
        }
    }
    let action = action.ok_or_else(|| SqsError::missing_parameter("The request must contain the parameter Action."))?;
    let input = match root.into_json() {
        Value::Object(o) => Value::Object(reshape(o)),
        _ => Value::Object(Map::new()),
    };
    Ok(Decoded {
        protocol: Protocol::Query,
        action,
        input,
    })
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => escape(s),
        Value::Null => String::new(),
        other => escape(&other.to_string()),
    }
}

fn element(out: &mut String, name: &str, inner: &str) {
    out.push_str(&format!("<{name}>{inner}</{name}>"));
}

fn name_value(out: &mut String, tag: &str, key_tag: &str, map: &Map<String, Value>, nested: bool) {
    for (k, v) in map {
        let mut inner = String::new();
        element(&mut inner, key_tag, &escape(k));
        if nested {
            let mut value = String::new();
            if let Value::Object(fields) = v {
                for (field, fv) in fields {
                    element(&mut value, field, &scalar(fv));
                }
            }
            element(&mut inner, "Value", &value);
        } else {
            element(&mut inner, "Value", &scalar(v));
        }
        element(out, tag, &inner);
    }
}

/// Writes a JSON-shaped result as the query protocol's XML members.
fn members(out: &mut String, action: &str, object: &Map<String, Value>) {
    for (key, value) in object {
        match (key.as_str(), value) {
            ("QueueUrls" | "queueUrls", Value::Array(urls)) => {
                for url in urls {
                    element(out, "QueueUrl", &scalar(url));
                }
            }
            ("Attributes", Value::Object(map)) => name_value(out, "Attribute", "Name", map, false),
            ("MessageAttributes", Value::Object(map)) => name_value(out, "MessageAttribute", "Name", map, true),
            ("Tags", Value::Object(map)) => name_value(out, "Tag", "Key", map, false),
            ("Messages" | "Successful" | "Failed" | "Results", Value::Array(items)) => {
                let tag = match key.as_str() {
                    "Messages" => "Message".to_owned(),
                    "Successful" | "Results" => format!("{action}ResultEntry"),
                    _ => "BatchResultErrorEntry".to_owned(),
                };
                for item in items {
                    let mut inner = String::new();
                    if let Value::Object(fields) = item {
                        members(&mut inner, action, fields);
                    }
                    element(out, &tag, &inner);
                }
            }
            (_, Value::Null) => {}
            (_, v) => element(out, key, &scalar(v)),
        }
    }
}

pub fn respond(action: &str, result: Result<Value, SqsError>, request_id: &str) -> Response {
    let (status, xml) = match result {
        Ok(value) => {
            let mut inner = String::new();
            if let Value::Object(object) = &value {
                members(&mut inner, action, object);
            }
            let result = if inner.is_empty() {
                String::new()
            } else {
                format!("<{action}Result>{inner}</{action}Result>")
            };
            (
                StatusCode::OK,
                format!(
                    "<?xml version=\"1.0\"?><{action}Response xmlns=\"{NAMESPACE}\">{result}<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
                ),
            )
        }
        Err(e) => (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            format!(
                "<?xml version=\"1.0\"?><ErrorResponse xmlns=\"{NAMESPACE}\"><Error><Type>{}</Type><Code>{}</Code><Message>{}</Message><Detail/></Error><RequestId>{request_id}</RequestId></ErrorResponse>",
                if e.sender_fault { "Sender" } else { "Receiver" },
                escape(e.code),
                escape(&e.message)
            ),
        ),
    };
    let mut response = (status, xml).into_response();
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("text/xml"));
    if let Ok(id) = HeaderValue::from_str(request_id) {
        response.headers_mut().insert("x-amzn-requestid", id);
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn deep_or_numerous_parameters_are_refused_not_recursed_into() {
        // 100,000 segments overflowed the stack of the engine before.
        let deep = Bytes::from(format!("Action=SendMessage&{}=x", vec!["a"; 100_000].join(".")));
        assert_eq!(decode(None, &deep).unwrap_err().code, "MalformedQueryString");
        let deepest_real = Bytes::from(
            "Action=SendMessageBatch&SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringListValue.1=v",
        );
        decode(None, &deepest_real).unwrap();
        let many: String = (0..=MAX_PARAMETERS).map(|i| format!("&P{i}=x")).collect();
        let many = Bytes::from(format!("Action=ListQueues{many}"));
        assert_eq!(decode(None, &many).unwrap_err().code, "MalformedQueryString");
    }

    #[test]
    fn dotted_parameters_become_json_shapes() {
        let body = Bytes::from(
            "Action=SendMessageBatch&QueueUrl=http%3A%2F%2Fh%2Fq&SendMessageBatchRequestEntry.1.Id=a\
             &SendMessageBatchRequestEntry.1.MessageBody=hi&SendMessageBatchRequestEntry.1.MessageAttribute.1.Name=k\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType=String\
             &SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue=v\
             &SendMessageBatchRequestEntry.2.Id=b&SendMessageBatchRequestEntry.2.MessageBody=yo",
        );
        let d = decode(None, &body).unwrap();
        assert_eq!(d.action, "SendMessageBatch");
        assert_eq!(
            d.input,
            json!({"QueueUrl": "http://h/q", "Entries": [
                {"Id": "a", "MessageBody": "hi", "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
                {"Id": "b", "MessageBody": "yo"}
            ]})
        );
        let d = decode(
            Some(
                "Action=CreateQueue&QueueName=q&Attribute.1.Name=DelaySeconds&Attribute.1.Value=5&AttributeName.1=All",
            ),
            &Bytes::new(),
        )
        .unwrap();
        assert_eq!(
            d.input,
            json!({"QueueName": "q", "Attributes": {"DelaySeconds": "5"}, "AttributeNames": ["All"]})
        );
    }

    #[test]
    fn results_become_xml_members() {
        let mut out = String::new();
        let value =
            json!({"Messages": [{"Body": "a<b", "Attributes": {"SentTimestamp": "1"}}], "QueueUrls": ["u1", "u2"]});
        members(&mut out, "ReceiveMessage", value.as_object().unwrap());
        assert_eq!(
            out,
            "<Message><Attribute><Name>SentTimestamp</Name><Value>1</Value></Attribute><Body>a&lt;b</Body></Message>\
             <QueueUrl>u1</QueueUrl><QueueUrl>u2</QueueUrl>"
        );
    }
}
