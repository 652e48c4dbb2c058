//! A real Trino server for the dataflow tests: Trino 476 from Maven Central
//! (`io.trino:trino-server`, the last release published there), unpacked by
//! scripts/install-test-deps.sh into `$SLESS_CACHE/trino-476` with only the
//! plugins the tests use, run on the Temurin 25 JDK (Trino 476 needs Java 24
//! or newer; the machine's default Java is 17). `SLESS_TRINO_HOME` and
//! `SLESS_TRINO_JAVA_HOME` override both.
//!
//! One server serves a whole test binary ([`TrinoServer::shared`]): it takes
//! about 10 s to start and 1 GB of memory. It listens on loopback only:
//! - plain HTTP, where Trino takes the user its client names (no login);
//! - HTTPS with a certificate of a CA made at start ([`TrinoServer::ca`]),
//!   where a client logs in with a password ([`USER`], [`PASSWORD`]) or a
//!   bearer JWT signed with the server's HMAC key ([`TrinoServer::token`]).
//!
//! Catalogs: `memory` (tables in the server's memory) and `postgresql` (the
//! test database, `SLESS_TEST_PG`, with MERGE enabled).
//!
//! The server is [`Watched`]: it never outlives its tests. A start that
//! fails fails the tests at once. Tests that read Iceberg tables add the
//! `iceberg` catalog of a Nessie server ([`TrinoServer::add_iceberg`]).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::server::{Watched, ask, cache_dir, java_home, shared};
use crate::tls::Ca;

pub const VERSION: &str = "476";
pub const USER: &str = "sless";
pub const PASSWORD: &str = "trino-secret-7";

pub struct TrinoServer {
    _process: Watched,
    /// `http://127.0.0.1:PORT`: no login.
    pub http_url: String,
    /// `https://localhost:PORT`: a password or a bearer token.
    pub https_url: String,
    /// The CA of the HTTPS port's certificate.
    pub ca: Ca,
    jwt_key: Vec<u8>,
    http: reqwest::Client,
}

/// Where the unpacked server is.
pub fn home() -> PathBuf {
    std::env::var_os("SLESS_TRINO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join(format!("trino-{VERSION}")))
}

/// The test database as Trino's JDBC connector names it: (URL, user).
fn jdbc_of_test_database() -> (String, String) {
    let dsn = std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into());
    let url = reqwest::Url::parse(&dsn).unwrap();
    let user = match url.username() {
        "" => "postgres".to_owned(),
        user => user.to_owned(),
    };
    (
        format!(
            "jdbc:postgresql://{}:{}{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432),
            url.path()
        ),
        user,
    )
}

/// Trino's `etc/` in `root`: node, JVM and server settings (plain HTTP on
/// `http_port`; HTTPS with `tls_pem`, passwords and HS256 JWTs on
/// `https_port`), and the static catalogs. Catalogs are dynamic too
/// (`CREATE CATALOG`).
fn write_etc(root: &std::path::Path, http_port: u16, https_port: u16, tls_pem: &str, jwt_key: &[u8]) {
    let hash = bcrypt::hash_with_result(PASSWORD, 8)
        .unwrap()
        .format_for_version(bcrypt::Version::TwoY);
    let (jdbc, pg_user) = jdbc_of_test_database();
    let etc = root.join("etc");
    std::fs::create_dir_all(etc.join("catalog")).unwrap();
    let write = |name: &str, text: String| std::fs::write(etc.join(name), text).unwrap();
    std::fs::write(root.join("tls.pem"), tls_pem).unwrap();
    std::fs::write(
        root.join("jwt.key"),
        base64::engine::general_purpose::STANDARD.encode(jwt_key),
    )
    .unwrap();
    std::fs::write(root.join("password.db"), format!("{USER}:{hash}\n")).unwrap();
    let root_text = root.display();
    write(
        "node.properties",
        format!(
            "node.environment=test\nnode.id=sless-test\nnode.data-dir={root_text}/data\n\
             node.internal-address=127.0.0.1\nnode.bind-ip=127.0.0.1\n"
        ),
    );
    write(
        "jvm.config",
        "-server\n-Xmx1G\n-XX:+UseG1GC\n-XX:+ExitOnOutOfMemoryError\n-Djdk.attach.allowAttachSelf=true\n\
         -XX:+EnableDynamicAgentLoading\n-Dfile.encoding=UTF-8\n"
            .into(),
    );
    write(
        "config.properties",
        format!(
            "coordinator=true\nnode-scheduler.include-coordinator=true\n\
             http-server.http.port={http_port}\ndiscovery.uri=http://127.0.0.1:{http_port}\n\
             query.max-memory=512MB\nquery.max-memory-per-node=256MB\n\
             catalog.management=dynamic\n\
             http-server.https.enabled=true\nhttp-server.https.port={https_port}\n\
             http-server.https.keystore.path={root_text}/tls.pem\n\
             http-server.authentication.type=PASSWORD,JWT\n\
             http-server.authentication.allow-insecure-over-http=true\n\
             http-server.authentication.jwt.key-file={root_text}/jwt.key\n\
             internal-communication.shared-secret={}\n",
            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
        ),
    );
    write(
        "password-authenticator.properties",
        format!("password-authenticator.name=file\nfile.password-file={root_text}/password.db\n"),
    );
    write(
        "catalog/memory.properties",
        "connector.name=memory\nmemory.max-data-per-node=128MB\n".into(),
    );
    write(
        "catalog/postgresql.properties",
        format!(
            "connector.name=postgresql\nconnection-url={jdbc}\nconnection-user={pg_user}\n\
             merge.non-transactional-merge.enabled=true\n"
        ),
    );
}

impl TrinoServer {
    /// The test binary's one server, started on first use.
    pub fn shared() -> &'static TrinoServer {
        static SERVER: OnceLock<Result<TrinoServer, String>> = OnceLock::new();
        shared(&SERVER, "Trino", Self::start)
    }

    fn start() -> Self {
        let home = home();
        assert!(
            home.join("bin/launcher").exists() && home.join(".complete").exists(),
            "no Trino server at {}: run scripts/install-test-deps.sh",
            home.display()
        );
        let (http_port, https_port) = (crate::free_port(), crate::free_port());
        let ca = Ca::new("sless test CA (trino)");
        let (cert, key) = ca.issue(&["localhost"], &[]);
        let jwt_key: Vec<u8> = (0..32).map(|_| rand::random::<u8>()).collect();
        let java = java_home();
        let process = Watched::start(
            "trino",
            &home.join("bin/launcher"),
            &["run", "--etc-dir=etc", "--data-dir=data"],
            &[("JAVA_HOME", &java)],
            |root| write_etc(root, http_port, https_port, &format!("{cert}{key}"), &jwt_key),
        );
        process.wait_until(Duration::from_secs(120), || {
            ask(http_port, "GET /v1/info HTTP/1.1").is_some_and(|a| a.contains("\"starting\":false"))
        });
        Self {
            _process: process,
            http_url: format!("http://127.0.0.1:{http_port}"),
            https_url: format!("https://localhost:{https_port}"),
            ca,
            jwt_key,
            // Tests share the server from runtimes of their own: a pooled
            // connection of one test's runtime is dead in the next.
            http: reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap(),
        }
    }

    /// A bearer token for `user`, signed with the server's key (HS256).
    pub fn token(&self, user: &str) -> String {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let header = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = b64(json!({"sub": user}).to_string().as_bytes());
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.jwt_key).unwrap();
        mac.update(format!("{header}.{claims}").as_bytes());
        format!("{header}.{claims}.{}", b64(&mac.finalize().into_bytes()))
    }

    /// Runs `sql` over plain HTTP in `catalog` (schema `public` for
    /// `postgresql`, else `default`): the rows, panicking on an error.
    pub async fn query(&self, catalog: &str, sql: &str) -> Vec<Vec<Value>> {
        let schema = if catalog == "postgresql" { "public" } else { "default" };
        let mut answer: Value = self
            .http
            .post(format!("{}/v1/statement", self.http_url))
            .header("X-Trino-User", "sless-test")
            .header("X-Trino-Catalog", catalog)
            .header("X-Trino-Schema", schema)
            .body(sql.to_owned())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let mut rows = Vec::new();
        loop {
            assert!(answer.get("error").is_none(), "{sql}: {}", answer["error"]["message"]);
            if let Some(data) = answer["data"].as_array() {
                rows.extend(data.iter().map(|r| r.as_array().cloned().unwrap_or_default()));
            }
            let Some(next) = answer["nextUri"].as_str() else {
                return rows;
            };
            answer = self.http.get(next).send().await.unwrap().json().await.unwrap();
        }
    }

    /// Adds catalog `iceberg`, the tables of `nessie`'s branch `main`
    /// through its Iceberg REST API and S3 store (once per server): Trino is
    /// the tests' independent reader and second writer of Iceberg tables.
    pub async fn add_iceberg(&self, nessie: &crate::nessie::NessieServer) {
        static ADDED: tokio::sync::Mutex<bool> = tokio::sync::Mutex::const_new(false);
        let mut added = ADDED.lock().await;
        if !*added {
            let properties = [
                ("iceberg.catalog.type", "rest".to_owned()),
                ("iceberg.rest-catalog.uri", format!("{}/main", nessie.iceberg_url)),
                ("iceberg.rest-catalog.warehouse", crate::nessie::WAREHOUSE.to_owned()),
                ("fs.native-s3.enabled", "true".to_owned()),
                ("s3.endpoint", nessie.s3_endpoint.clone()),
                ("s3.path-style-access", "true".to_owned()),
                ("s3.region", crate::nessie::S3_REGION.to_owned()),
                ("s3.aws-access-key", crate::nessie::S3_KEY.to_owned()),
                ("s3.aws-secret-key", crate::nessie::S3_SECRET.to_owned()),
            ]
            .iter()
            .map(|(k, v)| format!("\"{k}\" = '{v}'"))
            .collect::<Vec<_>>()
            .join(", ");
            self.query(
                "memory",
                &format!("CREATE CATALOG iceberg USING iceberg WITH ({properties})"),
            )
            .await;
            *added = true;
        }
    }

    /// The one number `sql` answers.
    pub async fn count(&self, catalog: &str, sql: &str) -> i64 {
        self.query(catalog, sql).await[0][0].as_i64().unwrap()
    }

    /// Until `sql` (a count) answers `want`, for 30 s.
    pub async fn wait_for(&self, catalog: &str, sql: &str, want: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = -1;
        while Instant::now() < deadline {
            got = self.count(catalog, sql).await;
            if got == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("{sql}: wanted {want}, got {got}");
    }

    /// A connector spec of `table` in `catalog` over plain HTTP.
    pub fn spec(&self, catalog: &str, table: &str, extra: Value) -> Value {
        let schema = if catalog == "postgresql" { "public" } else { "default" };
        let mut config = json!({"serverURL": self.http_url, "catalog": catalog, "schema": schema, "table": table});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"type": "trino", "config": config})
    }
}
