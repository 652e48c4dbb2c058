//! Prometheus metrics of the API: request counts and latency per route.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::AppState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Self::with(|_| {})
    }

    /// The API's families under `sless_api_`, beside those `register` adds
    /// (the operator's, in `sless serve`), all served on one `/metrics`.
    pub fn with(register: impl FnOnce(&mut Registry)) -> Arc<Self> {
        let mut root = Registry::default();
        register(&mut root);
        let registry = root.sub_registry_with_prefix("sless_api");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            // 0.5 ms … ~16 s.
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        registry.register("requests", "HTTP requests by route and status", requests.clone());
        registry.register(
            "request_duration_seconds",
            "HTTP request latency by route",
            latency.clone(),
        );
        Arc::new(Self {
            registry: root,
            requests,
            latency,
        })
    }

    /// The API's families, then those of the platform's running dataflows.
    fn render(&self, flows: &[sless_dataflow::metrics::FlowSample]) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = text::encode_registry(&mut out, &self.registry)
            .and_then(|()| sless_dataflow::metrics::encode(&mut out, flows))
            .and_then(|()| text::encode_eof(&mut out));
        out
    }
}

/// A closed set of label values: a client can send any method name, and
/// each new one would be a new series.
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Records every request under its route template, never its raw path, so
/// object names do not become label values.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(req.method()).to_owned();
    let started = Instant::now();
    let response = next.run(req).await;
    state
        .metrics
        .latency
        .get_or_create(&RouteLabels {
            method: method.clone(),
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    state
        .metrics
        .requests
        .get_or_create(&RequestLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

pub async fn serve(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(&state.platform.dataflow_samples()),
    )
}
