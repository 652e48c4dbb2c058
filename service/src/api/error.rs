//! The API's error type and its JSON form, `sless_model::ErrorBody`.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sless_model::{ErrorBody, ErrorDetail, ValidationErrors};
use sless_platform::PlatformError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Validation(ValidationErrors),
    #[error("{0}")]
    BadRequest(String),
    #[error("request body must be JSON: send Content-Type: application/json")]
    UnsupportedMediaType,
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("no such route")]
    NoRoute,
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    #[error("the platform is unavailable; try again")]
    Unavailable,
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("too many requests: this tenant may make more in {} ms", .0.as_millis())]
    TooManyRequests(std::time::Duration),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::AlreadyExists(_) => (StatusCode::CONFLICT, "already_exists"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed"),
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::UnsupportedMediaType => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::NoRoute => (StatusCode::NOT_FOUND, "no_route"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::QuotaExceeded(_) => (StatusCode::FORBIDDEN, "quota_exceeded"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::TooManyRequests(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
        }
    }

    /// Maps a platform error about the object `what` (e.g. `queue service "q"`).
    pub fn from_platform(e: PlatformError, what: impl FnOnce() -> String) -> Self {
        match e {
            PlatformError::NotFound => Self::NotFound(what()),
            PlatformError::AlreadyExists => Self::AlreadyExists(what()),
            PlatformError::Conflict(message) => Self::Conflict(message),
            PlatformError::Invalid(errors) => Self::Validation(errors),
            PlatformError::BadRequest(message) => Self::BadRequest(message),
            PlatformError::Forbidden(message) => Self::Forbidden(message),
            PlatformError::QuotaReached(quota) => Self::QuotaExceeded(format!("the tenant holds its quota of {quota}")),
            PlatformError::Unavailable(source) => {
                tracing::error!(error = %source, "platform call failed");
                Self::Unavailable
            }
        }
    }
}

impl From<ValidationErrors> for ApiError {
    fn from(e: ValidationErrors) -> Self {
        Self::Validation(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let field = match &self {
            Self::Validation(errors) => errors.0.first().map(|e| e.field.clone()),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: self.to_string(),
                field,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        if let Self::TooManyRequests(wait) = self {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, seconds.max(1).into());
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use sless_model::FieldError;

    use super::*;

    async fn answer(e: PlatformError) -> (u16, serde_json::Value) {
        let response = ApiError::from_platform(e, || "dataflow \"x\"".into()).into_response();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// A backend's refusal reaches the tenant as the 4xx it is, with its
    /// reason and field; only a backend that cannot serve is a 503.
    #[tokio::test]
    async fn platform_refusals_keep_their_status_reason_and_field() {
        let (status, body) = answer(PlatformError::Invalid(
            FieldError::invalid("sink.config.passwordSecretRef", "must stay in sless-fn-acme").into(),
        ))
        .await;
        assert_eq!(status, 422);
        assert_eq!(body["error"]["field"], "sink.config.passwordSecretRef");
        assert!(body["error"]["message"].as_str().unwrap().contains("sless-fn-acme"));
        let (status, body) = answer(PlatformError::Forbidden("the namespace is being terminated".into())).await;
        assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
        let (status, body) = answer(PlatformError::BadRequest("denied".into())).await;
        assert_eq!((status, body["error"]["message"].as_str()), (400, Some("denied")));
        let (status, body) = answer(PlatformError::Unavailable("connection refused to 10.0.0.1".into())).await;
        assert_eq!(status, 503);
        assert!(!body.to_string().contains("10.0.0.1"), "the cause stays in the log");
    }
}
