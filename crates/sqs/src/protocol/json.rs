//! AWS JSON 1.0: `X-Amz-Target: AmazonSQS.<Action>`, JSON bodies, errors as
//! `{"__type", "message"}` plus the query-compatible `x-amzn-query-error`.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::{Decoded, Protocol};
use crate::error::SqsError;

const CONTENT_TYPE: &str = "application/x-amz-json-1.0";

pub fn decode(headers: &HeaderMap, body: &Bytes) -> Result<Decoded, SqsError> {
    let target = headers
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let action = target
        .strip_prefix("AmazonSQS.")
        .ok_or_else(|| SqsError::invalid_action(format!("Unknown operation target {target:?}")))?;
    let input: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body)
            .map_err(|e| SqsError::malformed_request(format!("The request body is not valid JSON: {e}")))?
    };
    if !input.is_object() {
        return Err(SqsError::malformed_request("The request body must be a JSON object"));
    }
    Ok(Decoded {
        protocol: Protocol::Json,
        action: action.to_owned(),
        input,
    })
}

pub fn respond(result: Result<Value, SqsError>, request_id: &str) -> Response {
    let (status, body, query_error) = match result {
        Ok(v) => (StatusCode::OK, v, None),
        Err(e) => (
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            json!({"__type": format!("com.amazonaws.sqs#{}", e.shape), "message": e.message}),
            Some(format!(
                "{};{}",
                e.code,
                if e.sender_fault { "Sender" } else { "Receiver" }
            )),
        ),
    };
    let mut response = (status, body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static(CONTENT_TYPE));
    if let Ok(id) = HeaderValue::from_str(request_id) {
        headers.insert("x-amzn-requestid", id);
    }
    if let Some(q) = query_error.and_then(|q| HeaderValue::from_str(&q).ok()) {
        headers.insert("x-amzn-query-error", q);
    }
    response
}
