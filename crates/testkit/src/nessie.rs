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
