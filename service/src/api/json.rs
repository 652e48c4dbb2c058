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
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::UnsupportedMediaType),
            Err(JsonRejection::JsonSyntaxError(e)) => {
                Err(ApiError::BadRequest(format!("malformed JSON: {}", e.body_text())))
            }
            Err(JsonRejection::JsonDataError(e)) => {
                Err(ApiError::BadRequest(format!("invalid request body: {}", e.body_text())))
            }
            Err(JsonRejection::BytesRejection(e)) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(BODY_LIMIT))
            }
            Err(other) => Err(ApiError::BadRequest(other.body_text())),
        }
    }
}
