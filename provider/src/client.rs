//! The sless REST API, as the provider calls it.

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{method} {path}: {status} {code}: {message}{}", field.as_ref().map(|f| format!(" (field {f})")).unwrap_or_default())]
    Status {
        method: Method,
        path: String,
        status: u16,
        code: String,
        message: String,
        field: Option<String>,
    },
    #[error("{method} {path}: cannot reach the sless API: {source}")]
    Transport {
        method: Method,
        path: String,
        source: reqwest::Error,
    },
}

impl ApiError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Status { status: 404, .. })
    }
}

/// Tries of one call the API answers 429.
const MAX_ATTEMPTS: u32 = 8;

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    endpoint: String,
    token: String,
}

impl Client {
    pub fn new(endpoint: &str, token: &str, insecure_skip_verify: bool) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .danger_accept_invalid_certs(insecure_skip_verify)
            .user_agent(concat!("terraform-provider-sless/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
        })
    }

    /// One API call. A 429 (the tenant's API rate is spent, as a plan of
    /// many resources can spend it) is retried after its Retry-After, a few
    /// times, as HashiCorp's providers retry.
    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}/api/v1{path}", self.endpoint);
        let transport = |source| ApiError::Transport {
            method: method.clone(),
            path: path.to_owned(),
            source,
        };
        let mut attempts = 1;
        let response = loop {
            let mut request = self.http.request(method.clone(), &url).bearer_auth(&self.token);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.map_err(transport)?;
            if response.status() != reqwest::StatusCode::TOO_MANY_REQUESTS || attempts >= MAX_ATTEMPTS {
                break response;
            }
            let wait = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .map_or(Duration::from_secs(1), Duration::from_secs)
                .clamp(Duration::from_millis(100), Duration::from_secs(30));
            tokio::time::sleep(wait).await;
            attempts += 1;
        };
        let status = response.status();
        let text = response.text().await.map_err(transport)?;
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let error = &value["error"];
        Err(ApiError::Status {
            method,
            path: path.to_owned(),
            status: status.as_u16(),
            code: error["code"].as_str().unwrap_or("error").to_owned(),
            message: error["message"]
                .as_str()
                .map_or_else(|| text.chars().take(300).collect(), str::to_owned),
            field: error["field"].as_str().map(str::to_owned),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// An API that answers 429 `limited` times (Retry-After: 0), then 200.
    async fn api(limited: u32) -> (String, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let app = axum::Router::new().fallback(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < limited {
                    (axum::http::StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")], "{}").into_response()
                } else {
                    (axum::http::StatusCode::OK, "{\"ok\": true}").into_response()
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(axum::serve(listener, app).into_future());
        (format!("http://{addr}"), calls)
    }

    use axum::response::IntoResponse;

    #[tokio::test]
    async fn a_spent_rate_is_waited_out_a_few_times() {
        let (endpoint, calls) = api(2).await;
        let client = Client::new(&endpoint, "t", false).unwrap();
        let value = client.call(Method::GET, "/dataflows", None).await.unwrap();
        assert_eq!(value["ok"], true);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Never anything but 429: the last answer is the error.
        let (endpoint, calls) = api(u32::MAX).await;
        let client = Client::new(&endpoint, "t", false).unwrap();
        let e = client.call(Method::GET, "/dataflows", None).await.unwrap_err();
        assert!(matches!(e, ApiError::Status { status: 429, .. }), "{e}");
        assert_eq!(calls.load(Ordering::SeqCst), MAX_ATTEMPTS);
    }
}
