//! `sless processor` as its own process, against a real PostgreSQL: the
//! spec from a file, the position in a checkpoint file, metrics and probes
//! on HTTP, and a graceful SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::TempDir;
use crate::common::pg::{bulk_table, count, db, pg, unique, wait_for, wait_mid_stream};
use serde_json::{Value, json};

pub(crate) struct Processor {
    child: Child,
    pub(crate) port: u16,
    metrics: String,
}

impl Processor {
    /// A processor allowed to reach the test PostgreSQL on loopback.
    pub(crate) fn start(dir: &Path, spec: &Value) -> Self {
        Self::start_with(dir, spec, &["--egress-allow", "127.0.0.1/32"])
    }

    fn start_with(dir: &Path, spec: &Value, extra: &[&str]) -> Self {
        let spec_path = dir.join("spec.json");
        std::fs::write(&spec_path, spec.to_string()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        // The tenant's positions key, as the operator mounts it: one per
        // directory, kept across restarts.
        let key = dir.join("positions.key");
        if !key.exists() {
            std::fs::write(&key, sless_dataflow::context::PositionsKey::generate().to_text()).unwrap();
        }
        let child = Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["processor", "--namespace", "team-a", "--name", "copy"])
            .arg("--spec-path")
            .arg(&spec_path)
            .arg("--checkpoint-file")
            .arg(dir.join("position"))
            .arg("--positions-key-file")
            .arg(&key)
            .arg("--spill-dir")
            .arg(dir.join("spill"))
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env("SLESS_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sless processor");
        Self {
            child,
            port,
            metrics: format!("http://127.0.0.1:{port}"),
        }
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match reqwest::get(format!("{}{path}", self.metrics)).await {
                Ok(r) => return (r.status().as_u16(), r.text().await.unwrap_or_default()),
                Err(e) if Instant::now() > deadline => panic!("{path}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        crate::common::terminate(&mut self.child)
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn sigterm_writes_and_commits_the_batch_in_hand_so_a_restart_duplicates_nothing() {
    let db = db().await;
    let src = bulk_table(&db, "proc_src", 50000).await;
    let dst = unique("proc_dst");
    let dir = TempDir::new("processor");
    let spec = json!({
        "source": pg(&src, json!({"batchSize": 50, "pollInterval": 1})),
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "transformations": [{"type": "remove", "config": {"fields": ["payload"]}}],
        "channelBufferSize": 50
    });
    let processor = Processor::start(&dir.0, &spec);
    let rows = format!("SELECT count(*) FROM {dst}");
    wait_mid_stream(&db, &rows, 0, 50000).await;
    let (status, ready) = processor.get("/readyz").await;
    assert_eq!((status, ready.as_str()), (200, "running"));
    let (_, metrics) = processor.get("/metrics").await;
    assert!(
        metrics.contains(r#"sless_dataflow_messages_read_total{namespace="team-a",dataflow="copy"}"#),
        "{metrics}"
    );

    let status = processor.terminate();
    assert!(status.success(), "{status}");
    let written = count(&db, &rows).await;
    assert!(
        written < 50000,
        "copied everything before SIGTERM: make the table larger"
    );
    // Everything written is committed, and nothing unwritten is.
    let position: i64 = std::fs::read_to_string(dir.0.join("position"))
        .expect("a checkpoint")
        .parse()
        .unwrap();
    assert_eq!(position, written);
    assert_eq!(
        count(&db, &format!("SELECT max((data->>'id')::int)::int8 FROM {dst}")).await,
        written
    );

    let _again = Processor::start(&dir.0, &spec);
    wait_for(&db, &format!("SELECT count(DISTINCT (data->>'id')) FROM {dst}"), 50000).await;
    assert_eq!(count(&db, &rows).await, 50000, "a graceful stop duplicated rows");
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

/// Two processors of one dataflow at once, as a replacement pod started
/// while the old one still stops, or a cut-off node's pod still running:
/// the second waits on the first's lock on the position row, says so and
/// is not ready; once the first is killed (`kill -9`) mid-stream its
/// database session ends, and the second goes on from the stored position.
/// Every row lands once.
#[tokio::test]
async fn a_second_processor_of_a_dataflow_waits_for_the_first_and_takes_over_when_it_dies() {
    let db = db().await;
    let src = bulk_table(&db, "fence_src", 100_000).await;
    let dst = unique("fence_dst");
    let (first_dir, second_dir) = (TempDir::new("fence-1"), TempDir::new("fence-2"));
    let spec = json!({
        "source": pg(&src, json!({"batchSize": 50, "pollInterval": 1})),
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "transformations": [{"type": "remove", "config": {"fields": ["payload"]}}],
        "channelBufferSize": 50
    });
    let mut first = Processor::start(&first_dir.0, &spec);
    let rows = format!("SELECT count(*) FROM {dst}");
    wait_mid_stream(&db, &rows, 0, 100_000).await;
    // Both pods mount the tenant's one positions key.
    std::fs::copy(first_dir.0.join("positions.key"), second_dir.0.join("positions.key")).unwrap();
    let second = Processor::start(&second_dir.0, &spec);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, status) = second.get("/status").await;
        if status.contains("another processor of this dataflow") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second processor does not wait: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(second.get("/readyz").await.0, 503);
    assert!(
        count(&db, &rows).await < 100_000,
        "copied everything before the kill: make the table larger"
    );

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    wait_for(
        &db,
        &format!("SELECT count(DISTINCT (data->>'id')) FROM {dst}"),
        100_000,
    )
    .await;
    assert_eq!(count(&db, &rows).await, 100_000, "a row written twice");
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

#[test]
fn a_bad_spec_stops_the_processor_with_the_field_named() {
    let dir = TempDir::new("processor-bad");
    let spec_path = dir.0.join("spec.json");
    let spec = json!({
        "source": {"type": "postgresql", "config": {"table": "t"}},
        "sink": {"type": "kafka", "config": {"brokers": ["127.0.0.1:1"], "topic": "t"}}
    });
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sless"))
        .args([
            "processor",
            "--namespace",
            "ns",
            "--name",
            "bad",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--spec-path")
        .arg(&spec_path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("source.config.connectionString"), "{stderr}");
}

/// Outside `sless dev` a tenant's connection string cannot reach the
/// platform's own network (loopback, the metadata service) nor tell open
/// from closed ports there, and a TLS file cannot be any file of the host.
#[tokio::test]
async fn the_egress_policy_keeps_connectors_off_the_platform() {
    let dir = TempDir::new("processor-egress");
    let reason = |processor: Processor| async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, body) = processor.get("/readyz").await;
            if status == 503 && !body.contains("connecting") {
                return body;
            }
            assert!(Instant::now() < deadline, "{status} {body}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // PostgreSQL on loopback (open) and a closed loopback port answer alike.
    let mut reasons = Vec::new();
    // The third names loopback only as its hostaddr, behind a public name.
    // (The metadata service is denied too: egress.rs's unit tests check
    // that without sending it a packet, should the policy be wrong.)
    for dsn in [
        "postgres://postgres@127.0.0.1:5432/test",
        "postgres://postgres@127.0.0.1:1/test",
        "host=db.example.com hostaddr=127.0.0.1 user=postgres dbname=test",
    ] {
        let spec = json!({
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "t"}},
            // The sink connects first: it names the same address.
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "t"}}
        });
        reasons.push(reason(Processor::start_with(&dir.0, &spec, &[])).await);
    }
    assert_eq!(reasons[0], reasons[1]);
    assert_eq!(reasons[0], reasons[2]);
    assert!(reasons[0].contains("egress policy"), "{}", reasons[0]);
    assert!(
        !reasons[0].contains("127.0.0.1") && !reasons[0].contains("5432"),
        "{}",
        reasons[0]
    );
    // A Kafka CA file outside the TLS directory: existing or not, one answer
    // (the broker is a closed loopback port the test permits: the file is
    // checked before connecting).
    let mut answers = Vec::new();
    for ca in ["/etc/shadow", "/etc/no-such-file"] {
        let kafka =
            json!({"type": "kafka", "config": {"brokers": ["127.0.0.1:1"], "topic": "t", "tls": {"caFile": ca}}});
        let spec = json!({"source": kafka, "sink": kafka});
        let tls_dir = dir.0.join("tls");
        std::fs::create_dir_all(&tls_dir).unwrap();
        answers.push(
            reason(Processor::start_with(
                &dir.0,
                &spec,
                &["--tls-dir", tls_dir.to_str().unwrap(), "--egress-allow", "127.0.0.1/32"],
            ))
            .await,
        );
    }
    assert_eq!(answers[0], answers[1]);
    assert!(answers[0].contains("TLS directory"), "{}", answers[0]);
}
