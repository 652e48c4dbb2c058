//! The two SQS wire protocols: AWS JSON 1.0 (current SDKs) and the query
//! protocol with XML responses (older SDKs). Both decode into the JSON
//! protocol's shapes, which the engine speaks.

pub mod json;
pub mod query;

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::Value;

use crate::error::SqsError;

/// Every action the engine serves (a test there keeps the two lists one):
/// the gateway's metrics name these and count anything else as `other`,
/// so no client can add a label value.
pub const ACTIONS: [&str; 24] = [
    "AddPermission",
    "CancelMessageMoveTask",
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "CreateQueue",
    "DeleteMessage",
    "DeleteMessageBatch",
    "DeleteQueue",
    "GetQueueAttributes",
    "GetQueueUrl",
    "ListDeadLetterSourceQueues",
    "ListMessageMoveTasks",
    "ListQueueTags",
    "ListQueues",
    "PurgeQueue",
    "ReceiveMessage",
    "RemovePermission",
    "SendMessage",
    "SendMessageBatch",
    "SetQueueAttributes",
    "SlessPeekMessages",
    "StartMessageMoveTask",
    "TagQueue",
    "UntagQueue",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Json,
    Query,
}

/// A decoded request: protocol, action and input.
#[derive(Debug)]
pub struct Decoded {
    pub protocol: Protocol,
    pub action: String,
    pub input: Value,
}

/// Which protocol a request uses (its errors must come back in the same one).
pub fn detect(headers: &HeaderMap) -> Protocol {
    if headers.contains_key("x-amz-target") {
        Protocol::Json
    } else {
        Protocol::Query
    }
}

pub fn decode(headers: &HeaderMap, query_string: Option<&str>, body: &Bytes) -> Result<Decoded, SqsError> {
    match detect(headers) {
        Protocol::Json => json::decode(headers, body),
        Protocol::Query => query::decode(query_string, body),
    }
}

/// An HTTP response in the request's protocol.
pub fn respond(
    protocol: Protocol,
    action: &str,
    result: Result<Value, SqsError>,
    request_id: &str,
) -> axum::response::Response {
    match protocol {
        Protocol::Json => json::respond(result, request_id),
        Protocol::Query => query::respond(action, result, request_id),
    }
}
