//! Dataflows with Nessie at either end (Nessie 0.99 with moto's S3 server,
//! one each for this test binary, started on loopback by sless-testkit),
//! run by `sless dev`, with a real PostgreSQL at the other end and Trino's
//! Iceberg connector as the independent reader and writer of the tables.

use std::time::{Duration, Instant};

use crate::common::pg::{bulk_table, count, db, pg, unique, wait_for};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::json;
use sless_testkit::nessie::NessieServer;
use sless_testkit::trino::TrinoServer;

/// Until `sql` (a count through Trino) is above 0, and asserts it is below
/// `total`: the flow is mid-stream.
async fn wait_mid_stream(trino: &TrinoServer, sql: &str, total: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = trino.count("iceberg", sql).await;
        if n > 0 {
            assert!(n < total, "{sql}: all {total} done already; make the stream longer");
            return;
        }
        assert!(Instant::now() < deadline, "{sql}: nothing written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `kill -9` of `sless dev` mid-stream, two exactly-once flows at once,
/// without checkpoints (a source that resumed from anything but the sink's
/// stored position would read from the start again):
/// - PostgreSQL → Nessie (a commit a batch, the position in a table
///   property of the same commit) resumes from the table: every row once;
/// - Nessie → PostgreSQL (three commits of Trino's, read by sequence
///   number) resumes where the PostgreSQL sink stored the position, inside
///   a commit: every row once.
#[tokio::test]
async fn nessie_at_either_end_survives_kill_9_mid_stream_exactly_once() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    trino.add_iceberg(nessie).await;
    let db = db().await;
    let rows = 3_000;
    let namespace = unique("e2e");
    trino
        .query("iceberg", &format!("CREATE SCHEMA iceberg.{namespace}"))
        .await;
    let written = format!("iceberg.{namespace}.written");
    let read = format!("iceberg.{namespace}.read");
    trino
        .query(
            "iceberg",
            &format!("CREATE TABLE {written} (id bigint, payload varchar)"),
        )
        .await;
    trino
        .query("iceberg", &format!("CREATE TABLE {read} (id bigint, payload varchar)"))
        .await;
    for part in 0..3 {
        trino
            .query(
                "iceberg",
                &format!(
                    "INSERT INTO {read} SELECT x, 'row ' || CAST(x AS varchar) \
                     FROM UNNEST(sequence({}, {})) t(x)",
                    part * 1000 + 1,
                    part * 1000 + 1000
                ),
            )
            .await;
    }
    let pg_src = bulk_table(&db, "to_nessie", rows).await;
    let pg_dst = unique("from_nessie");
    db.batch_execute(&format!("CREATE TABLE {pg_dst} (id bigint, payload text)"))
        .await
        .unwrap();

    let dir = TempDir::new("df-nessie-kill");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "to-nessie",
        "source": pg(&pg_src, json!({"pollInterval": 1, "batchSize": 100})),
        "sink": nessie.spec(&namespace, "written", json!({})),
        "channelBufferSize": 100,
        // Only the sink's stored position says where to resume.
        "checkpointPersistence": false,
    }))
    .await;
    a.create_dataflow(json!({
        "name": "from-nessie",
        "source": nessie.spec(&namespace, "read", json!({"pollInterval": 1, "batchSize": 100})),
        "sink": pg(&pg_dst, json!({})),
        "channelBufferSize": 100,
        "checkpointPersistence": false,
    }))
    .await;
    wait_mid_stream(trino, &format!("SELECT count(*) FROM {written}"), rows).await;
    server.kill9();

    let _server = DevServer::start(&dir.0);
    wait_for(&db, &format!("SELECT count(*) FROM {pg_dst}"), rows).await;
    trino
        .wait_for("iceberg", &format!("SELECT count(*) FROM {written}"), rows)
        .await;
    // Settled: nothing more arrives, and no row is there twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        trino.count("iceberg", &format!("SELECT count(*) FROM {written}")).await,
        rows
    );
    assert_eq!(
        trino
            .count("iceberg", &format!("SELECT count(DISTINCT id) FROM {written}"))
            .await,
        rows
    );
    assert_eq!(count(&db, &format!("SELECT count(*) FROM {pg_dst}")).await, rows);
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM (SELECT DISTINCT id, payload FROM {pg_dst}) d WHERE payload = 'row ' || id")
        )
        .await,
        rows
    );
    db.batch_execute(&format!("DROP TABLE {pg_src}, {pg_dst}"))
        .await
        .unwrap();
}

/// What a tenant gets wrong shows in the dataflow's status: a table that
/// is not there, a branch that is not there.
#[tokio::test]
async fn a_missing_table_and_a_missing_branch_show_in_the_status() {
    let nessie = NessieServer::shared();
    let db = db().await;
    let src = bulk_table(&db, "nessie_status", 3).await;
    let dir = TempDir::new("df-nessie-status");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let namespace = unique("status");
    a.create_dataflow(json!({
        "name": "missing-table",
        "source": nessie.spec(&namespace, "no_such_table", json!({})),
        "sink": pg(&src, json!({})),
    }))
    .await;
    a.create_dataflow(json!({
        "name": "missing-branch",
        "source": pg(&src, json!({})),
        "sink": nessie.spec(&namespace, "t", json!({"branch": "no-such-branch", "autoCreateTable": true})),
    }))
    .await;
    let view = a
        .wait_for_phase("missing-table", "Error", Duration::from_secs(30))
        .await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no_such_table") && message.contains("no such"),
        "{view}"
    );
    let view = a
        .wait_for_phase("missing-branch", "Error", Duration::from_secs(30))
        .await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(message.contains("no-such-branch"), "{view}");
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}
