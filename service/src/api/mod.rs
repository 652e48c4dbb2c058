//! The REST API under `/api/v1`, plus the web console at `/console`,
//! `/healthz`, `/readyz` and `/metrics`.

pub mod auth;
pub mod console;
pub mod dataflows;
pub mod error;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod path;
pub mod queue_services;
pub mod queues;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{delete, get, post};

use crate::tenants::Directory;
use error::ApiError;
use metrics::Metrics;
use sless_platform::Platform;

#[derive(Clone)]
pub struct AppState {
    pub platform: Arc<dyn Platform>,
    pub tenants: Arc<Directory>,
    pub metrics: Arc<Metrics>,
    /// Each tenant's quotas and API rate.
    pub limits: limits::TenantLimits,
    pub rate: Arc<limits::RateLimiter>,
}

pub fn router(state: AppState) -> Router {
    let tenant_api = Router::new()
        .route(
            "/queue-services",
            get(queue_services::list).post(queue_services::create),
        )
        .route(
            "/queue-services/{name}",
            get(queue_services::get)
                .put(queue_services::put)
                .patch(queue_services::patch)
                .delete(queue_services::delete),
        )
        .route("/queue-services/{name}/queues", get(queues::list).post(queues::create))
        .route("/queue-services/{name}/queues/{queue}", delete(queues::delete))
        .route(
            "/queue-services/{name}/queues/{queue}/messages",
            get(queues::peek).post(queues::send),
        )
        .route("/queue-services/{name}/queues/{queue}/redrive", post(queues::redrive))
        .route("/dataflows", get(dataflows::list).post(dataflows::create))
        .route(
            "/dataflows/{name}",
            get(dataflows::get)
                .put(dataflows::put)
                .patch(dataflows::patch)
                .delete(dataflows::delete),
        )
        .route("/dataflows/{name}/events", get(dataflows::events))
        .route("/dataflows/{name}/snapshots", post(dataflows::snapshot))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth::require_tenant));

    Router::new()
        .nest("/api/v1", tenant_api)
        .route("/api/v1/openapi.json", get(openapi::serve))
        .merge(console::routes())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { ApiError::NoRoute })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(state.clone(), metrics::track))
        .layer(DefaultBodyLimit::max(json::BODY_LIMIT))
        .with_state(state)
}

/// `/metrics`. It names every tenant and dataflow, so it belongs on an
/// internal port: `sless serve` gives it a listener of its own; `sless dev`
/// serves it beside the API on loopback.
pub fn metrics_router(state: AppState) -> Router {
    Router::new().route("/metrics", get(metrics::serve)).with_state(state)
}

async fn readyz(State(state): State<AppState>) -> Result<&'static str, (StatusCode, &'static str)> {
    match state.platform.ready().await {
        Ok(()) => Ok("ready"),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            Err((StatusCode::SERVICE_UNAVAILABLE, "not ready"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sless_operator::runner::OperatorMetrics;
    use sless_platform::kubernetes::KubePlatform;

    async fn serve(app: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(axum::serve(listener, app).into_future());
        format!("http://{addr}")
    }

    /// `sless serve`'s composition: the API listener has no `/metrics` (it
    /// names every tenant and dataflow); the internal one has the API's and
    /// the operator's families. kube-fake-client stands in for the apiserver.
    #[tokio::test]
    async fn metrics_stay_off_the_api_listener() {
        let client = kube_fake_client::ClientBuilder::new().build().await.unwrap();
        let state = AppState {
            platform: Arc::new(KubePlatform::new(client, false, sless_sqs::DEFAULT_REGION.into())),
            tenants: Arc::new(Directory::default()),
            metrics: Metrics::with(|registry| {
                OperatorMetrics::register(registry);
            }),
            limits: limits::TenantLimits::default(),
            rate: Arc::default(),
        };
        let api = serve(router(state.clone())).await;
        let internal = serve(metrics_router(state)).await;
        assert_eq!(reqwest::get(format!("{api}/healthz")).await.unwrap().status(), 200);
        let refused = reqwest::get(format!("{api}/metrics")).await.unwrap();
        assert_eq!(refused.status(), 404);
        let text = reqwest::get(format!("{internal}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(text.contains("sless_operator_leader"), "{text}");
        assert!(
            text.contains("sless_api_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"}"),
            "{text}"
        );
    }
}
