//! The web console at `/console`: static files compiled into the binary,
//! served from the API's own origin, so the page calls `/api/v1` with the
//! tenant's token and sees exactly what the API lets that token see. No
//! JavaScript toolchain builds or runs it.

use axum::Router;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("../console/index.html");
const APP: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/style.css");

/// Scripts and styles only from these files, calls only to this origin,
/// never framed: a value an API answer carries cannot run as code here.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, content_type),
            (HeaderName::from_static("content-security-policy"), CSP),
            (HeaderName::from_static("x-content-type-options"), "nosniff"),
            (HeaderName::from_static("referrer-policy"), "no-referrer"),
            (CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let index = || async { asset("text/html; charset=utf-8", INDEX) };
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route(
            "/console/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/console/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}
