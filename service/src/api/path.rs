//! Path segments (`{name}`, or a tuple of them), a named object's name, and
//! query strings as extractors whose rejection is an [`ApiError`], so a
//! path that does not decode (`%ff`) gets the JSON error.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use sless_model::name::DnsLabel;

pub struct ApiPath<T = String>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Self(value))
            .map_err(|e| ApiError::BadRequest(format!("invalid path: {}", e.body_text())))
    }
}

/// A query string as an extractor whose rejection is an [`ApiError`].
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Self(value))
            .map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))
    }
}

/// What a path's `{name}` names, as errors say it.
pub trait Kind {
    const WHAT: &'static str;
}

pub struct QueueServiceKind;
pub struct DataFlowKind;

impl Kind for QueueServiceKind {
    const WHAT: &'static str = "queue service";
}

impl Kind for DataFlowKind {
    const WHAT: &'static str = "dataflow";
}

/// The `{name}` of a path, as a DNS label: a name that no object can have
/// is a 404, exactly like a missing object.
pub struct Named<K> {
    pub label: DnsLabel,
    kind: std::marker::PhantomData<K>,
}

impl<K: Kind> Named<K> {
    /// `name` as a DNS label, or the 404 of an object that cannot exist.
    pub fn parse(name: &str) -> Result<Self, ApiError> {
        let label = DnsLabel::parse(name, "name").map_err(|_| ApiError::NotFound(what::<K>(name)()))?;
        Ok(Self {
            label,
            kind: std::marker::PhantomData,
        })
    }

    /// How errors name the object, e.g. `dataflow "orders"`.
    pub fn what(&self) -> impl FnOnce() -> String + '_ {
        what::<K>(self.label.as_str())
    }
}

/// How errors name an object of kind `K` called `name`.
pub fn what<K: Kind>(name: &str) -> impl FnOnce() -> String + '_ {
    move || format!("{} {name:?}", K::WHAT)
}

impl<S: Send + Sync, K: Kind> FromRequestParts<S> for Named<K> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(name) = ApiPath::<String>::from_request_parts(parts, state).await?;
        Self::parse(&name)
    }
}
