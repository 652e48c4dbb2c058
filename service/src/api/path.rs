//! The `{name}` path segment as an extractor whose rejection is an
//! [`ApiError`], so a path that does not decode (`%ff`) gets the JSON error.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::ApiError;

pub struct ApiPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ApiPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<String>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(name)| Self(name))
            .map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))
    }
}
