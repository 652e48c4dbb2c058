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

    pub async fn call(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let url = format!("{}/api/v1{path}", self.endpoint);
        let mut request = self.http.request(method.clone(), url).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let transport = |source| ApiError::Transport {
            method: method.clone(),
            path: path.to_owned(),
            source,
        };
        let response = request.send().await.map_err(transport)?;
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
