//! The sless REST API, as the provider calls it: bodies and answers are
//! `sless-model`'s types, so a field the API renames fails to compile here.

use std::time::Duration;

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sless_model::ErrorBody;

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
    #[error("{method} {path}: the sless API answered in a form this provider does not read: {source}")]
    Answer {
        method: Method,
        path: String,
        source: serde_json::Error,
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

    /// `GET path`, its answer read as `T`.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let text = self.call(Method::GET, path, None::<&()>).await?;
        answer(Method::GET, path, &text)
    }

    /// `method path` with `body`, its answer read as `T`.
    pub async fn send<B: Serialize + Sync, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
    ) -> Result<T, ApiError> {
        let text = self.call(method.clone(), path, Some(body)).await?;
        answer(method, path, &text)
    }

    /// `DELETE path`; its answer carries nothing the provider reads.
    pub async fn delete(&self, path: &str) -> Result<(), ApiError> {
        self.call(Method::DELETE, path, None::<&()>).await.map(drop)
    }

    /// One API call, its successful answer's text. A 429 (the tenant's API
    /// rate is spent, as a plan of many resources can spend it) is retried
    /// after its Retry-After, a few times, as HashiCorp's providers retry.
    async fn call<B: Serialize + Sync>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<String, ApiError> {
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
        if status.is_success() {
            return Ok(text);
        }
        let (code, message, field) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(ErrorBody { error }) => (error.code, error.message, error.field),
            // Not the API's error form (a proxy's page): its start says most.
            Err(_) => ("error".to_owned(), text.chars().take(300).collect(), None),
        };
        Err(ApiError::Status {
            method,
            path: path.to_owned(),
            status: status.as_u16(),
            code,
            message,
            field,
        })
    }
}

fn answer<T: DeserializeOwned>(method: Method, path: &str, text: &str) -> Result<T, ApiError> {
    serde_json::from_str(text).map_err(|source| ApiError::Answer {
        method,
        path: path.to_owned(),
        source,
    })
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
        let value: serde_json::Value = client.get("/dataflows").await.unwrap();
        assert_eq!(value["ok"], true);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Never anything but 429: the last answer is the error.
        let (endpoint, calls) = api(u32::MAX).await;
        let client = Client::new(&endpoint, "t", false).unwrap();
        let e = client.get::<serde_json::Value>("/dataflows").await.unwrap_err();
        assert!(matches!(e, ApiError::Status { status: 429, .. }), "{e}");
        assert_eq!(calls.load(Ordering::SeqCst), MAX_ATTEMPTS);
    }
}
