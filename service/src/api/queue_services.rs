//! `/api/v1/queue-services`.

use axum::Extension;
use axum::Json;
use axum::extract::State;

use super::path::{Named, QueueServiceKind, what};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Tenant;
use super::error::ApiError;
use super::json::ApiJson;
use sless_model::ErrorBody;
use sless_model::FieldError;
use sless_model::name::DnsLabel;
use sless_model::queue_service::{QueueServiceRequest, QueueServiceSpec, QueueServiceView};

#[derive(Serialize, ToSchema)]
pub struct QueueServiceList {
    pub items: Vec<QueueServiceView>,
}

/// The `name` of an update body must be absent or equal to the path's.
pub(super) fn check_body_name(body: Option<&str>, path: &DnsLabel) -> Result<(), ApiError> {
    match body {
        Some(name) if name != path.as_str() => Err(ApiError::Validation(
            FieldError::invalid(
                "name",
                format!("cannot be changed (path says \"{path}\", body says {name:?}); create a new object instead"),
            )
            .into(),
        )),
        _ => Ok(()),
    }
}

fn spec_of(view: &QueueServiceView) -> QueueServiceSpec {
    QueueServiceSpec {
        memory_mb: view.memory_mb,
        storage_mb: view.storage_mb,
        persistence: view.persistence,
        durability: view.durability,
        replicas: view.replicas,
        requests_per_second: view.requests_per_second,
        bytes_per_second: view.bytes_per_second,
    }
}

/// Create a queue service. A tenant has one; it holds up to 1,000 queues.
#[utoipa::path(post, path = "/api/v1/queue-services", tag = "queue-services",
    request_body = QueueServiceRequest,
    responses(
        (status = 201, body = QueueServiceView, description = "Accepted; poll until phase is Ready"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "Name taken, or the tenant already has a queue service"),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiJson(body): ApiJson<QueueServiceRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let name = DnsLabel::parse(body.name.as_deref().unwrap_or_default(), "name")
        .map_err(|e| ApiError::Validation(e.into()))?;
    let spec = body.spec_over(state.platform.default_queue_spec())?;
    let view = state
        .platform
        .create_queue_service(&tenant, &name, spec)
        .await
        .map_err(|e| ApiError::from_platform(e, what::<QueueServiceKind>(name.as_str())))?;
    let location = format!("/api/v1/queue-services/{name}");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(view)))
}

/// List the tenant's queue services.
#[utoipa::path(get, path = "/api/v1/queue-services", tag = "queue-services",
    responses((status = 200, body = QueueServiceList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
) -> Result<Json<QueueServiceList>, ApiError> {
    let items = state
        .platform
        .list_queue_services(&tenant)
        .await
        .map_err(|e| ApiError::from_platform(e, || "queue services".into()))?;
    Ok(Json(QueueServiceList { items }))
}

/// Get one queue service, with its endpoint and keys once Ready.
#[utoipa::path(get, path = "/api/v1/queue-services/{name}", tag = "queue-services",
    params(("name" = String, Path, description = "Queue service name")),
    responses((status = 200, body = QueueServiceView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<QueueServiceKind>,
) -> Result<Json<QueueServiceView>, ApiError> {
    state
        .platform
        .get_queue_service(&tenant, &name.label)
        .await
        .map(Json)
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

async fn update(
    state: AppState,
    tenant: DnsLabel,
    name: Named<QueueServiceKind>,
    body: QueueServiceRequest,
    partial: bool,
) -> Result<Json<QueueServiceView>, ApiError> {
    check_body_name(body.name.as_deref(), &name.label)?;
    let current = state
        .platform
        .get_queue_service(&tenant, &name.label)
        .await
        .map_err(|e| ApiError::from_platform(e, name.what()))?;
    let current = spec_of(&current);
    let spec = body.spec_over(if partial {
        current
    } else {
        state.platform.default_queue_spec()
    })?;
    spec.check_update_from(&current)?;
    state
        .platform
        .update_queue_service(&tenant, &name.label, spec)
        .await
        .map(Json)
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

/// Replace the changeable fields; absent fields take their defaults.
/// `memoryMB`, `durability`, `replicas`, `requestsPerSecond` and `bytesPerSecond`
/// change in place, `storageMB` can only grow, `persistence` is fixed.
#[utoipa::path(put, path = "/api/v1/queue-services/{name}", tag = "queue-services",
    params(("name" = String, Path, description = "Queue service name")),
    request_body = QueueServiceRequest,
    responses((status = 200, body = QueueServiceView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<QueueServiceKind>,
    ApiJson(body): ApiJson<QueueServiceRequest>,
) -> Result<Json<QueueServiceView>, ApiError> {
    update(state, tenant, name, body, false).await
}

/// Change only the fields present in the body.
#[utoipa::path(patch, path = "/api/v1/queue-services/{name}", tag = "queue-services",
    params(("name" = String, Path, description = "Queue service name")),
    request_body = QueueServiceRequest,
    responses((status = 200, body = QueueServiceView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn patch(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<QueueServiceKind>,
    ApiJson(body): ApiJson<QueueServiceRequest>,
) -> Result<Json<QueueServiceView>, ApiError> {
    update(state, tenant, name, body, true).await
}

/// Delete a queue service and its queues.
#[utoipa::path(delete, path = "/api/v1/queue-services/{name}", tag = "queue-services",
    params(("name" = String, Path, description = "Queue service name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<QueueServiceKind>,
) -> Result<StatusCode, ApiError> {
    state
        .platform
        .delete_queue_service(&tenant, &name.label)
        .await
        .map_err(|e| ApiError::from_platform(e, name.what()))?;
    Ok(StatusCode::NO_CONTENT)
}
