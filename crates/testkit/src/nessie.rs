//! A real Nessie server for the dataflow tests: `nessie-quarkus` 0.99.0 from
//! Maven Central (its runner jar, cached by scripts/install-test-deps.sh in
//! `$SLESS_CACHE/nessie-0.99.0`; `SLESS_NESSIE_JAR` overrides), run on the
//! Temurin 25 JDK with its in-memory version store, and moto's S3 server
//! (from PyPI, tests/requirements.txt) as the object store of its Iceberg
//! tables, both on loopback.
//!
//! One of each serves a whole test binary ([`NessieServer::shared`]); both
//! are [`Watched`]. Nessie serves its Iceberg REST catalog at
//! [`NessieServer::iceberg_url`]`/{branch}` and its own API at `/api/v2`;
//! tables live in warehouse [`WAREHOUSE`], bucket [`BUCKET`]. The S3 store
//! takes any signature (moto checks none): the connector's signing is
//! checked against AWS's published examples in its unit tests instead.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

use crate::server::{Watched, ask, cache_dir, java_home, shared};

pub const VERSION: &str = "0.99.0";
pub const WAREHOUSE: &str = "warehouse";
pub const BUCKET: &str = "sless-warehouse";
pub const S3_KEY: &str = "testing";
pub const S3_SECRET: &str = "testing";
pub const S3_REGION: &str = "us-east-1";

pub struct NessieServer {
    _nessie: Watched,
    _s3: Watched,
    /// `http://127.0.0.1:PORT/iceberg`: a branch's catalog is `…/iceberg/{branch}`.
    pub iceberg_url: String,
    /// `http://127.0.0.1:PORT/api/v2`: Nessie's own API (branches, commits).
    pub api_url: String,
    /// `http://127.0.0.1:PORT`: the S3 store.
    pub s3_endpoint: String,
    http: reqwest::Client,
}

fn jar() -> PathBuf {
    std::env::var_os("SLESS_NESSIE_JAR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join(format!("nessie-{VERSION}/nessie-quarkus-runner.jar")))
}

impl NessieServer {
    /// The test binary's one Nessie and S3 store, started on first use.
    pub fn shared() -> &'static NessieServer {
        static SERVER: OnceLock<Result<NessieServer, String>> = OnceLock::new();
        shared(&SERVER, "Nessie", Self::start)
    }

    fn start() -> Self {
        let jar = jar();
        assert!(
            jar.exists(),
            "no Nessie at {}: run scripts/install-test-deps.sh",
            jar.display()
        );
        let s3_port = crate::free_port();
        let s3 = Watched::start(
            "moto-s3",
            &PathBuf::from("moto_server"),
            &["-H", "127.0.0.1", "-p", &s3_port.to_string()],
            &[],
            |_| {},
        );
        s3.wait_until(Duration::from_secs(60), || {
            ask(s3_port, &format!("PUT /{BUCKET} HTTP/1.1")).is_some_and(|a| a.starts_with("HTTP/1.1 200"))
        });
        let s3_endpoint = format!("http://127.0.0.1:{s3_port}");
        let (port, management) = (crate::free_port(), crate::free_port());
        let java = java_home().join("bin/java");
        let nessie = Watched::start(
            "nessie",
            &java,
            &["-Xmx512m", "-XX:+UseSerialGC", "-jar", &jar.display().to_string()],
            &[],
            |root| {
                std::fs::create_dir_all(root.join("config")).unwrap();
                std::fs::write(
                    root.join("config/application.properties"),
                    application_properties(port, management, &s3_endpoint),
                )
                .unwrap();
            },
        );
        nessie.wait_until(Duration::from_secs(120), || {
            ask(management, "GET /q/health/ready HTTP/1.1").is_some_and(|a| a.starts_with("HTTP/1.1 200"))
        });
        Self {
            _nessie: nessie,
            _s3: s3,
            iceberg_url: format!("http://127.0.0.1:{port}/iceberg"),
            api_url: format!("http://127.0.0.1:{port}/api/v2"),
            s3_endpoint,
            // Tests share the server from runtimes of their own.
            http: reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap(),
        }
    }

    /// A connector spec of `namespace.table` on `main`, with the store's
    /// keys, and `extra` fields.
    pub fn spec(&self, namespace: &str, table: &str, extra: Value) -> Value {
        let mut config = json!({
            "nessieUrl": self.api_url,
            "namespace": namespace,
            "table": table,
            "awsRegion": S3_REGION,
            "awsAccessKeyID": S3_KEY,
            "awsSecretAccessKey": S3_SECRET,
        });
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"type": "nessie", "config": config})
    }

    /// Creates branch `name` from `main`'s head.
    pub async fn create_branch(&self, name: &str) {
        let main: Value = self
            .http
            .get(format!("{}/trees/main", self.api_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let reference = &main["reference"];
        let response = self
            .http
            .post(format!("{}/trees?name={name}&type=BRANCH", self.api_url))
            .json(reference)
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert!(status.is_success(), "{status}: {}", response.text().await.unwrap());
    }
}

/// Nessie's settings: loopback ports, the in-memory store, and warehouse
/// [`WAREHOUSE`] in the S3 store at `s3_endpoint` with its static keys
/// (no request signing: clients sign with the keys themselves).
fn application_properties(port: u16, management: u16, s3_endpoint: &str) -> String {
    format!(
        "nessie.version.store.type=IN_MEMORY\n\
         quarkus.http.host=127.0.0.1\nquarkus.http.port={port}\n\
         quarkus.management.host=127.0.0.1\nquarkus.management.port={management}\n\
         quarkus.log.level=WARN\nquarkus.otel.sdk.disabled=true\n\
         nessie.catalog.default-warehouse={WAREHOUSE}\n\
         nessie.catalog.warehouses.{WAREHOUSE}.location=s3://{BUCKET}/\n\
         nessie.catalog.service.s3.default-options.endpoint={s3_endpoint}/\n\
         nessie.catalog.service.s3.default-options.path-style-access=true\n\
         nessie.catalog.service.s3.default-options.region={S3_REGION}\n\
         nessie.catalog.service.s3.default-options.access-key=urn:nessie-secret:quarkus:sless-s3\n\
         nessie.catalog.service.s3.default-options.request-signing-enabled=false\n\
         sless-s3.name={S3_KEY}\nsless-s3.secret={S3_SECRET}\n"
    )
}

/// A test-only stand-in for a Nessie that requires a login (the test server
/// runs without one: Nessie's own logins need an OpenID Connect provider):
/// an HTTPS proxy on loopback, with a certificate of [`AuthProxy::ca`] for
/// `localhost`, that answers 401 to any request without `Authorization:
/// Bearer {token}` or Basic `{user}:{password}`, and forwards the others to
/// the shared Nessie, its answers' own URL rewritten to the proxy's. What it
/// does not do: Nessie's OIDC token checks (expiry, issuer, audience) and
/// its authorization rules.
pub struct AuthProxy {
    /// `https://localhost:PORT/api/v2`.
    pub url: String,
    pub ca: crate::tls::Ca,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NessieServer {
    /// A proxy taking `token` as a bearer, or `user` and `password`.
    pub async fn auth_proxy(&self, token: &str, user: &str, password: &str) -> AuthProxy {
        use base64::Engine as _;
        use rustls::pki_types::pem::PemObject as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = crate::tls::Ca::new("sless test CA (nessie proxy)");
        let (cert, key) = ca.issue(&["localhost"], &[]);
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = tcp.local_addr().unwrap().port();
        let base = self.api_url.trim_end_matches("/api/v2").to_owned();
        let state = std::sync::Arc::new(Proxied {
            allowed: vec![
                format!("Bearer {token}"),
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
                ),
            ],
            upstream: base,
            own: format!("https://localhost:{port}"),
            http: reqwest::Client::new(),
        });
        let router = axum::Router::new().fallback(forward).with_state(state);
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
        };
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        AuthProxy {
            url: format!("https://localhost:{port}/api/v2"),
            ca,
            task,
        }
    }
}

struct Proxied {
    allowed: Vec<String>,
    upstream: String,
    own: String,
    http: reqwest::Client,
}

async fn forward(
    axum::extract::State(proxy): axum::extract::State<std::sync::Arc<Proxied>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let authorized = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| proxy.allowed.iter().any(|a| a == v));
    if !authorized {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            [("content-type", "application/json")],
            r#"{"error":{"message":"Not authorized","type":"NotAuthorizedException","code":401}}"#,
        )
            .into_response();
    }
    let method = request.method().clone();
    let path = request
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let content_type = request.headers().get("content-type").cloned();
    let body = axum::body::to_bytes(request.into_body(), 64 << 20)
        .await
        .unwrap_or_default();
    let mut upstream = proxy
        .http
        .request(method, format!("{}{path}", proxy.upstream))
        .body(body);
    if let Some(content_type) = content_type {
        upstream = upstream.header("content-type", content_type);
    }
    let Ok(answer) = upstream.send().await else {
        return axum::http::StatusCode::BAD_GATEWAY.into_response();
    };
    let status =
        axum::http::StatusCode::from_u16(answer.status().as_u16()).unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let text = answer
        .text()
        .await
        .unwrap_or_default()
        .replace(&proxy.upstream, &proxy.own);
    (status, [("content-type", content_type)], text).into_response()
}

/// TLS over a TCP listener, for axum::serve.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
