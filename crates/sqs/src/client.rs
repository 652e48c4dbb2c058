//! A client of the SQS JSON protocol, for sless's own callers (the REST
//! API's queue routes, the dataflow SQS connector, benches): it signs with
//! SigV4, posts, reads the answer within a cap, and tells SQS's errors
//! apart. The HTTP client is the caller's: the dataflow's connects only
//! where its egress policy permits and follows no redirect.

use serde_json::Value;

use crate::sigv4;

/// The longest answer of an SQS action: a receive of ten 1 MiB messages,
/// their JSON escapes (at most doubling them) and attributes.
pub const MAX_ANSWER_BYTES: usize = 24 << 20;

/// How one call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("the keys cannot sign a request")]
    Unsigned,
    /// Nothing answered, or not over HTTP.
    #[error("the endpoint cannot be reached or did not answer")]
    Unreachable(#[source] reqwest::Error),
    /// A redirect, or an answer over the cap.
    #[error(transparent)]
    Read(#[from] sless_runtime::http::ReadError),
    /// An error answer: its status, and its SQS error code and message
    /// when it has them. The code is taken only when it has a code's shape.
    #[error("HTTP {} {}", status.as_u16(), code.as_deref().unwrap_or("(no SQS error code)"))]
    Refused {
        status: reqwest::StatusCode,
        code: Option<String>,
        message: Option<String>,
    },
}

/// An account's keys, signing for `region`, over `http`.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    access_key: String,
    secret_key: String,
    region: String,
}

impl Client {
    pub fn new(http: reqwest::Client, access_key: &str, secret_key: &str, region: &str) -> Self {
        Self {
            http,
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            region: region.to_owned(),
        }
    }

    /// `action` with `input`, posted to `url` (an endpoint or a queue's
    /// URL); the answer, read within `max_answer` bytes.
    pub async fn call(&self, url: &str, action: &str, input: &Value, max_answer: usize) -> Result<Value, CallError> {
        let body = input.to_string().into_bytes();
        let headers = sigv4::signed_json_headers(url, action, &body, &self.access_key, &self.secret_key, &self.region)
            .ok_or(CallError::Unsigned)?;
        let response = self
            .http
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| CallError::Unreachable(e.without_url()))?;
        let answer = sless_runtime::http::read_capped(response, max_answer).await?;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if answer.status.is_success() {
            return Ok(value);
        }
        let code = value["__type"]
            .as_str()
            .and_then(|t| t.rsplit('#').next())
            .filter(|c| (1..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'))
            .map(str::to_owned);
        let message = value["message"]
            .as_str()
            .or(value["Message"].as_str())
            .map(str::to_owned);
        Err(CallError::Refused {
            status: answer.status,
            code,
            message,
        })
    }
}
