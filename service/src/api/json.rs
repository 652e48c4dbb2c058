//! A JSON body extractor whose rejections are [`ApiError`]s, so a malformed
//! body gets a 4xx JSON error and never axum's plain-text one.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 256 * 1024;

pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        let body = match axum::body::Bytes::from_request(req, state).await {
            Ok(body) => body,
            Err(e) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
                return Err(ApiError::PayloadTooLarge(BODY_LIMIT));
            }
            Err(e) => return Err(ApiError::BadRequest(e.body_text())),
        };
        // serde reads a struct from an array too, field by field: every
        // body of this API is an object, as the OpenAPI document says.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::BadRequest("the request body must be a JSON object".into()));
        }
        match axum::Json::<T>::from_bytes(&body) {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::JsonSyntaxError(e)) => {
                Err(ApiError::BadRequest(format!("malformed JSON: {}", e.body_text())))
            }
            Err(JsonRejection::JsonDataError(e)) => {
                Err(ApiError::BadRequest(format!("invalid request body: {}", e.body_text())))
            }
            Err(other) => Err(ApiError::BadRequest(other.body_text())),
        }
    }
}

/// `application/json`, or a `+json` type, as axum's `Json` takes them.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}
