//! `/api/v1/dataflows`.

use axum::Extension;
use axum::Json;
use axum::extract::State;

use super::path::{DataFlowKind, Named, what};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Tenant;
use super::error::ApiError;
use super::json::ApiJson;
use super::limits::TenantLimits;
use super::queue_services::check_body_name;
use sless_dataflow::registry::Registry;
use sless_model::ErrorBody;
use sless_model::dataflow::{
    DataFlowEventList, DataFlowRequest, DataFlowSpec, DataFlowView, SnapshotRequest, SnapshotTables,
};
use sless_model::name::DnsLabel;
use sless_platform::PlatformError;

#[derive(Serialize, ToSchema)]
pub struct DataFlowList {
    pub items: Vec<DataFlowView>,
}

fn spec_of(view: DataFlowView) -> DataFlowSpec {
    DataFlowSpec {
        source: view.source,
        sink: view.sink,
        transformations: view.transformations,
        errors: view.errors,
        resources: view.resources,
        checkpoint_persistence: view.checkpoint_persistence,
        channel_buffer_size: view.channel_buffer_size,
        snapshots: view.snapshots,
    }
}

/// Create a dataflow. The spec is validated first: a bad one creates nothing.
#[utoipa::path(post, path = "/api/v1/dataflows", tag = "dataflows",
    request_body = DataFlowRequest,
    responses((status = 201, body = DataFlowView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiJson(mut body): ApiJson<DataFlowRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let name = DnsLabel::parse(body.name.take().as_deref().unwrap_or_default(), "name")
        .map_err(|e| ApiError::Validation(e.into()))?;
    let spec = body.into_spec(&Registry)?;
    check_sinks(&state, &spec)?;
    check_scope(&state, &tenant, &spec)?;
    let quota = state.limits.dataflows;
    let view = state
        .platform
        .create_dataflow(&tenant, &name, spec, quota)
        .await
        .map_err(|e| match e {
            PlatformError::QuotaReached(quota) => TenantLimits::exceeded(quota, "dataflows", "--max-dataflows"),
            other => ApiError::from_platform(other, what::<DataFlowKind>(name.as_str())),
        })?;
    let location = format!("/api/v1/dataflows/{name}");
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(view)))
}

/// List the tenant's dataflows.
#[utoipa::path(get, path = "/api/v1/dataflows", tag = "dataflows",
    responses((status = 200, body = DataFlowList), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
) -> Result<Json<DataFlowList>, ApiError> {
    let items = state
        .platform
        .list_dataflows(&tenant)
        .await
        .map_err(|e| ApiError::from_platform(e, || "dataflows".into()))?;
    Ok(Json(DataFlowList { items }))
}

/// Get one dataflow with its phase.
#[utoipa::path(get, path = "/api/v1/dataflows/{name}", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    responses((status = 200, body = DataFlowView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
) -> Result<Json<DataFlowView>, ApiError> {
    state
        .platform
        .get_dataflow(&tenant, &name.label)
        .await
        .map(Json)
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

/// The dataflow's recent events, newest first: the phases it entered and
/// why (at most 20; `sless serve` keeps them as long as Kubernetes keeps
/// Events).
#[utoipa::path(get, path = "/api/v1/dataflows/{name}/events", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    responses((status = 200, body = DataFlowEventList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn events(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
) -> Result<Json<DataFlowEventList>, ApiError> {
    state
        .platform
        .dataflow_events(&tenant, &name.label)
        .await
        .map(|items| Json(DataFlowEventList { items }))
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

/// The tenant's quota of sinks per dataflow.
fn check_sinks(state: &AppState, spec: &DataFlowSpec) -> Result<(), ApiError> {
    let sinks = sless_dataflow::registry::sink_count(spec);
    let quota = state.limits.sinks_per_dataflow;
    if sinks > quota {
        return Err(ApiError::QuotaExceeded(format!(
            "a dataflow may write to at most {quota} sinks (its sink, its error sink and its routes; this \
             platform's --max-sinks-per-dataflow); this one has {sinks}"
        )));
    }
    Ok(())
}

/// Names on shared servers (slots, publications, consumer groups) within
/// the tenant's prefix.
fn check_scope(state: &AppState, tenant: &DnsLabel, spec: &DataFlowSpec) -> Result<(), ApiError> {
    sless_dataflow::registry::check_scope(spec, &state.platform.pipeline_tenant(tenant))
        .into_result()
        .map_err(ApiError::Validation)
}

/// The dataflow's spec as stored now.
async fn current_spec(
    state: &AppState,
    tenant: &DnsLabel,
    name: &Named<DataFlowKind>,
) -> Result<DataFlowSpec, ApiError> {
    state
        .platform
        .get_dataflow(tenant, &name.label)
        .await
        .map(spec_of)
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

async fn update(
    state: AppState,
    tenant: DnsLabel,
    name: Named<DataFlowKind>,
    mut body: DataFlowRequest,
    partial: bool,
) -> Result<Json<DataFlowView>, ApiError> {
    check_body_name(body.name.take().as_deref(), &name.label)?;
    let current = current_spec(&state, &tenant, &name).await?;
    let mut spec = if partial {
        body.patch(&current, &Registry)?
    } else {
        body.into_spec(&Registry)?
    };
    // No body names them: an update keeps the requests still to read.
    spec.keep_snapshots(&current, &Registry);
    check_sinks(&state, &spec)?;
    check_scope(&state, &tenant, &spec)?;
    state
        .platform
        .update_dataflow(&tenant, &name.label, spec)
        .await
        .map(Json)
        .map_err(|e| ApiError::from_platform(e, name.what()))
}

/// Replace the whole spec.
#[utoipa::path(put, path = "/api/v1/dataflows/{name}", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    request_body = DataFlowRequest,
    responses((status = 200, body = DataFlowView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn put(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
    ApiJson(body): ApiJson<DataFlowRequest>,
) -> Result<Json<DataFlowView>, ApiError> {
    update(state, tenant, name, body, false).await
}

/// Replace only the top-level fields present in the body.
#[utoipa::path(patch, path = "/api/v1/dataflows/{name}", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    request_body = DataFlowRequest,
    responses((status = 200, body = DataFlowView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn patch(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
    ApiJson(body): ApiJson<DataFlowRequest>,
) -> Result<Json<DataFlowView>, ApiError> {
    update(state, tenant, name, body, true).await
}

/// Ask the dataflow's `postgresql-cdc` source to read tables again, in
/// chunks while it streams on (an incremental snapshot): their rows come
/// as `op: r` events after what is already written. The processor restarts
/// to take the request up; the request's id tells it from later ones.
#[utoipa::path(post, path = "/api/v1/dataflows/{name}/snapshots", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    request_body = SnapshotTables,
    responses((status = 202, body = SnapshotRequest), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn snapshot(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
    ApiJson(body): ApiJson<SnapshotTables>,
) -> Result<(StatusCode, Json<SnapshotRequest>), ApiError> {
    let mut spec = current_spec(&state, &tenant, &name).await?;
    let mut errors = sless_model::ValidationErrors::default();
    spec.check_snapshot(&Registry, &body.tables, "tables", &mut errors);
    errors.into_result().map_err(ApiError::Validation)?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let id = spec.request_snapshot(body.tables.clone(), now_ms);
    state
        .platform
        .update_dataflow(&tenant, &name.label, spec)
        .await
        .map_err(|e| ApiError::from_platform(e, name.what()))?;
    let request = SnapshotRequest {
        id,
        tables: body.tables,
    };
    Ok((StatusCode::ACCEPTED, Json(request)))
}

/// Stop and delete a dataflow.
#[utoipa::path(delete, path = "/api/v1/dataflows/{name}", tag = "dataflows",
    params(("name" = String, Path, description = "Dataflow name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    name: Named<DataFlowKind>,
) -> Result<StatusCode, ApiError> {
    state
        .platform
        .delete_dataflow(&tenant, &name.label)
        .await
        .map_err(|e| ApiError::from_platform(e, name.what()))?;
    Ok(StatusCode::NO_CONTENT)
}
