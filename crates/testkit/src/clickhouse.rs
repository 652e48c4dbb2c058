//! A real ClickHouse server for the dataflow tests: Debian's
//! clickhouse-server (18.16.1 here; scripts/install-test-deps.sh installs
//! it, `SLESS_TEST_CLICKHOUSE` overrides the binary), in a temporary
//! directory on a free loopback port, with a user `sless` whose password
//! the connectors must send, killed on drop. Queries go over its HTTP
//! interface, as the connectors' do.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::TempDir;

pub const USER: &str = "sless";
pub const PASSWORD: &str = "ch-secret-7";

pub struct ClickHouseServer {
    child: Child,
    _dir: TempDir,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    http: reqwest::Client,
}

impl ClickHouseServer {
    pub fn start() -> Self {
        let dir = TempDir::new("clickhouse");
        let root = dir.0.display().to_string();
        let port = crate::free_port();
        std::fs::write(
            dir.0.join("config.xml"),
            format!(
                r#"<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{root}/server.log</log><errorlog>{root}/error.log</errorlog></logger>
  <http_port>{port}</http_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <users_config>{root}/users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>5368709</mark_cache_size>
</yandex>
"#
            ),
        )
        .unwrap();
        std::fs::write(
            dir.0.join("users.xml"),
            format!(
                r#"<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <users>
    <{USER}><password>{PASSWORD}</password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></{USER}>
  </users>
  <quotas><default></default></quotas>
</yandex>
"#
            ),
        )
        .unwrap();
        let binary = std::env::var("SLESS_TEST_CLICKHOUSE").unwrap_or_else(|_| "clickhouse-server".into());
        let child = Command::new(&binary)
            .arg(format!("--config-file={root}/config.xml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{binary}: {e}; run scripts/install-test-deps.sh (Debian clickhouse-server)"));
        let server = Self {
            child,
            _dir: dir,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "clickhouse-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The connection string of a spec, with the password.
    pub fn dsn(&self) -> String {
        format!(
            "http://{USER}:{PASSWORD}@{}/default",
            self.url.trim_start_matches("http://")
        )
    }

    /// Runs `sql`; its answer, panicking on an error.
    pub async fn query(&self, sql: &str) -> String {
        let response = self
            .http
            .post(format!("{}/?output_format_json_quote_64bit_integers=0", self.url))
            .basic_auth(USER, Some(PASSWORD))
            .body(sql.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        assert!(status.is_success(), "{sql}: {text}");
        text
    }

    /// Runs `statement` (an INSERT … FORMAT) with `data` as its rows.
    pub async fn insert(&self, statement: &str, data: String) {
        let response = self
            .http
            .post(&self.url)
            .query(&[("query", statement)])
            .basic_auth(USER, Some(PASSWORD))
            .body(data)
            .send()
            .await
            .unwrap();
        let status = response.status();
        assert!(
            status.is_success(),
            "{statement}: {}",
            response.text().await.unwrap_or_default()
        );
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.query(sql).await.trim().parse().unwrap_or(-1)
    }

    /// Rows of `sql` (without a FORMAT), as JSON objects.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        self.query(&format!("{sql} FORMAT JSONEachRow"))
            .await
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub async fn wait_for(&self, sql: &str, want: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut got = -1;
        while Instant::now() < deadline {
            got = self.count(sql).await;
            if got == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{sql}: wanted {want}, got {got}");
    }

    /// A connector spec of `table` on this server.
    pub fn spec(&self, table: &str, extra: Value) -> Value {
        let mut config = json!({"connectionString": self.dsn(), "table": table});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"type": "clickhouse", "config": config})
    }
}

impl Drop for ClickHouseServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
