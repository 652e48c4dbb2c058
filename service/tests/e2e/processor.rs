//! `sless processor` as its own process, against a real PostgreSQL: the
//! spec from a file, the position in a checkpoint file, metrics and probes
//! on HTTP, and a graceful SIGTERM.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::TempDir;
use crate::common::pg::{bulk_table, count, db, pg, unique, wait_for, wait_mid_stream};
use serde_json::{Value, json};

struct Processor {
    child: Child,
    metrics: String,
}

impl Processor {
    fn start(dir: &Path, spec: &Value) -> Self {
        let spec_path = dir.join("spec.json");
        std::fs::write(&spec_path, spec.to_string()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["processor", "--namespace", "team-a", "--name", "copy"])
            .arg("--spec-path")
            .arg(&spec_path)
            .arg("--checkpoint-file")
            .arg(dir.join("position"))
            .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
            .env("SLESS_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sless processor");
        Self {
            child,
            metrics: format!("http://127.0.0.1:{port}"),
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
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
