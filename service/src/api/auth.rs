//! Bearer-token authentication: resolves the caller's tenant or answers
//! 401, then takes the request from the tenant's rate (429 when spent).

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

use super::AppState;
use super::error::ApiError;
use sless_model::name::DnsLabel;

/// The authenticated tenant, placed in request extensions for handlers.
#[derive(Debug, Clone)]
pub struct Tenant(pub DnsLabel);

pub async fn require_tenant(State(state): State<AppState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let header = req
        .headers()
        .get(AUTHORIZATION)
        .ok_or(ApiError::Unauthorized("missing Authorization: Bearer <token> header"))?;
    let token = header
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or(ApiError::Unauthorized("Authorization header must be: Bearer <token>"))?;
    let tenant = state
        .tenants
        .current()
        .authenticate(token)
        .ok_or(ApiError::Unauthorized("invalid token"))?
        .clone();
    state
        .rate
        .take(&tenant, &state.limits)
        .map_err(ApiError::TooManyRequests)?;
    req.extensions_mut().insert(Tenant(tenant));
    Ok(next.run(req).await)
}
