//! Dataflows with Trino at either end (Trino 476, one server for this test
//! binary, started on loopback by sless-testkit), run by `sless dev`, with
//! a real PostgreSQL at the other end and behind Trino's postgresql catalog.

use std::time::Duration;

use crate::common::pg::{bulk_table, count, db, pg, unique, wait_for, wait_mid_stream};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::json;
use sless_testkit::trino::{PASSWORD, TrinoServer, USER};

/// `kill -9` of `sless dev` mid-stream, three flows at once:
/// - Trino → PostgreSQL resumes where its exactly-once sink stored the
///   position: every row lands once;
/// - PostgreSQL → Trino with `upsertMode` (one MERGE a batch) replays the
///   batches in flight onto the same keys: the table equals the source;
/// - PostgreSQL → Trino's memory catalog (INSERT) loses nothing and writes
///   at most the batches in flight twice.
#[tokio::test]
async fn trino_at_either_end_survives_kill_9_mid_stream() {
    let trino = TrinoServer::shared();
    let db = db().await;
    let rows = 3_000;
    let read_by_trino = bulk_table(&db, "trino_read", rows).await;
    let pg_dst = unique("trino_kill_dst");
    let pg_src = bulk_table(&db, "to_trino", rows).await;
    let merged = unique("trino_merged");
    db.batch_execute(&format!(
        "CREATE TABLE {pg_dst} (id bigint PRIMARY KEY, payload text);
         CREATE TABLE {merged} (id int PRIMARY KEY, payload text);"
    ))
    .await
    .unwrap();
    let inserted = unique("trino_inserted");

    let dir = TempDir::new("df-trino-kill");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "from-trino",
        "source": trino.spec("postgresql", &read_by_trino, json!({"pollInterval": 1, "batchSize": 200})),
        "sink": pg(&pg_dst, json!({"conflictKey": "id"})),
        "channelBufferSize": 200,
    }))
    .await;
    a.create_dataflow(json!({
        "name": "to-trino-merge",
        "source": pg(&pg_src, json!({"pollInterval": 1, "batchSize": 200})),
        "sink": trino.spec("postgresql", &merged, json!({"upsertMode": true, "conflictKey": "id"})),
        "channelBufferSize": 200,
    }))
    .await;
    a.create_dataflow(json!({
        "name": "to-trino-insert",
        "source": pg(&pg_src, json!({"pollInterval": 1, "batchSize": 200})),
        "sink": trino.spec("memory", &inserted, json!({"autoCreateTable": true})),
        "channelBufferSize": 200,
    }))
    .await;
    // Each MERGE takes about a second: the kill comes in the middle of
    // the slowest flow, when the others are most likely mid-stream too.
    let landed = format!("SELECT count(*) FROM {pg_dst}");
    wait_mid_stream(&db, &format!("SELECT count(*) FROM {merged}"), 0, rows).await;
    server.kill9();

    let _server = DevServer::start(&dir.0);
    wait_for(&db, &landed, rows).await;
    wait_for(&db, &format!("SELECT count(*) FROM {merged}"), rows).await;
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM {merged} m JOIN {pg_src} s USING (id, payload)")
        )
        .await,
        rows,
        "the merged table equals its source"
    );
    let distinct = format!("SELECT count(DISTINCT json_extract_scalar(json_parse(data), '$.id')) FROM {inserted}");
    trino.wait_for("memory", &distinct, rows).await;
    let total = trino.count("memory", &format!("SELECT count(*) FROM {inserted}")).await;
    // A replay is at most what was read and not yet committed.
    assert!(total - rows <= 1_000, "{} rows written twice", total - rows);
    db.batch_execute(&format!("DROP TABLE {read_by_trino}, {pg_dst}, {pg_src}, {merged}"))
        .await
        .unwrap();
}

/// What a tenant gets wrong shows in the dataflow's status, as a reason
/// that names no secret: a wrong password (over HTTPS, with the server's
/// CA from the TLS directory), a missing table.
#[tokio::test]
async fn a_refused_login_and_a_missing_table_show_in_the_status() {
    let trino = TrinoServer::shared();
    let db = db().await;
    let src = bulk_table(&db, "trino_refused", 3).await;
    let tls = TempDir::new("df-trino-tls");
    std::fs::write(tls.0.join("trino-ca.pem"), &trino.ca.pem).unwrap();
    let dir = TempDir::new("df-trino-status");
    let tls_dir = tls.0.display().to_string();
    let server = DevServer::start_with(&dir.0, "127.0.0.1:0", &["--tls-dir", &tls_dir]);
    let a = server.client(TOKEN_A);
    let table = unique("trino_status");
    trino
        .query("memory", &format!("CREATE TABLE {table} (data varchar)"))
        .await;
    let https = |password: &str| {
        json!({"type": "trino", "config": {"serverURL": trino.https_url, "catalog": "memory",
            "schema": "default", "table": table, "user": USER, "password": password,
            "tls": {"caFile": "trino-ca.pem"}}})
    };
    let wrong = "not-the-password-q7";
    a.create_dataflow(json!({"name": "refused", "source": pg(&src, json!({})), "sink": https(wrong)}))
        .await;
    a.create_dataflow(
        json!({"name": "allowed", "source": pg(&src, json!({"pollInterval": 1})), "sink": https(PASSWORD)}),
    )
    .await;
    a.create_dataflow(json!({
        "name": "missing",
        "source": trino.spec("memory", "no_such_table", json!({})),
        "sink": pg(&src, json!({})),
    }))
    .await;
    let view = a.wait_for_phase("refused", "Error", Duration::from_secs(30)).await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(message.contains("refused the login"), "{view}");
    assert!(!message.contains(wrong) && !message.contains(PASSWORD), "{view}");
    trino
        .wait_for("memory", &format!("SELECT count(*) FROM {table}"), 3)
        .await;
    let view = a.wait_for_phase("missing", "Error", Duration::from_secs(30)).await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no_such_table") && message.contains("no such table"),
        "{view}"
    );
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}
