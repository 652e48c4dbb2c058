//! Exactly once into PostgreSQL: `sless dev` is killed with `kill -9` at
//! many points of a 50,000-row flow (each kill after a different amount of
//! progress and a different pause, so that it falls in different phases of
//! the batch cycle: reading, writing, the sink's commit, the source's
//! commit) and restarted, and the sink ends with every row exactly once,
//! checked by key and by count. The sink is a raw table without a key, so
//! a row written twice would stay there twice. The real PostgreSQL, Kafka
//! protocol broker (Tansu) and `sless` binary; nothing stands in.

use std::time::Duration;

use crate::common::kafka::{Broker, kafka};
use crate::common::pg::{bulk_table, count, db, dsn, insert_in_transactions, pg, unique, wait_for};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::{Value, json};

const ROWS: i64 = 50_000;
const KILLS: i64 = 6;

/// Creates tenant a's `flow` (named `once`) on a `sless dev` in `dir`,
/// Running.
async fn started(dir: &TempDir, flow: Value) -> DevServer {
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let (status, body) = a.post("/api/v1/dataflows", flow).await;
    assert_eq!(status, 201, "{body}");
    a.wait_for_phase("once", "Running", Duration::from_secs(30)).await;
    server
}

/// Kills `server` (running the flow `once` into `dst`) [`KILLS`] times as
/// the sink's row count grows, restarting it each time, and lets the last
/// run finish: the sink then holds `ROWS` rows, each key (`key`, an
/// expression over the row's `data`) once.
async fn kill_repeatedly_then_check(dir: &TempDir, server: DevServer, dst: &str, key: &str) {
    let db = db().await;
    let rows = format!("SELECT count(*) FROM {dst}");
    let mut server = Some(server);
    for kill in 1..=KILLS {
        // Past a further share of the rows, then a pause of its own.
        let mark = ROWS * kill / (KILLS + 2);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while count(&db, &rows).await < mark {
            assert!(std::time::Instant::now() < deadline, "stuck below {mark} rows");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis((kill as u64 * 7) % 23)).await;
        let at = count(&db, &rows).await;
        assert!(at < ROWS, "everything written before kill {kill}: make the flow longer");
        server.take().expect("running").kill9();
        server = Some(DevServer::start(&dir.0));
    }
    wait_for(&db, &format!("SELECT count(DISTINCT ({key})) FROM {dst}"), ROWS).await;
    // The last rows are in: any duplicate of an earlier one is in too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&db, &rows).await, ROWS, "rows written twice after {KILLS} kills");
    let server = server.expect("running");
    let a = server.client(TOKEN_A);
    assert_eq!(a.delete("/api/v1/dataflows/once").await.0, 204);
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM sless_dataflow_positions WHERE dataflow = 'a/once {dst}'")
        )
        .await,
        0,
        "the stored position goes with the dataflow"
    );
    db.batch_execute(&format!("DROP TABLE {dst}")).await.unwrap();
}

#[tokio::test]
async fn pg_to_pg_survives_kill_9_at_many_points_with_every_row_once() {
    let db = db().await;
    let src = bulk_table(&db, "once_src", ROWS).await;
    let dst = unique("once_dst");
    let dir = TempDir::new("df-once-pg");
    let flow = json!({
        "name": "once",
        "source": pg(&src, json!({"batchSize": 100, "pollInterval": 1})),
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 100
    });
    let server = started(&dir, flow).await;
    kill_repeatedly_then_check(&dir, server, &dst, "data->>'id'").await;
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}

/// The changes are captured after the slot exists (its snapshot is empty),
/// in transactions of 500 rows, so kills fall inside transactions too.
#[tokio::test]
async fn cdc_to_pg_survives_kill_9_at_many_points_with_every_change_once() {
    let db = db().await;
    let (src, dst) = (unique("once_cdc_src"), unique("once_cdc_dst"));
    db.batch_execute(&format!("CREATE TABLE {src} (id int PRIMARY KEY, payload text)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-once-cdc");
    let flow = json!({
        "name": "once",
        "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn(), "table": src, "batchSize": 100}},
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 100
    });
    let server = started(&dir, flow).await;
    insert_in_transactions(&db, &src, ROWS, 500).await;
    kill_repeatedly_then_check(&dir, server, &dst, "data->'after'->>'id'").await;
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}

#[tokio::test]
async fn kafka_to_pg_survives_kill_9_at_many_points_with_every_record_once() {
    let broker = Broker::start();
    let topic = unique("once_topic");
    broker.create_topic(&topic, 3).await;
    let records: Vec<(String, Value)> = (0..ROWS)
        .map(|i| (format!("k{i}"), json!({"id": i, "payload": "x".repeat(200)})))
        .collect();
    broker.produce(&topic, &records).await;
    let dst = unique("once_kafka_dst");
    let dir = TempDir::new("df-once-kafka");
    let flow = json!({
        "name": "once",
        "source": kafka(&broker, &topic, json!({})),
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 100
    });
    let server = started(&dir, flow).await;
    kill_repeatedly_then_check(&dir, server, &dst, "data->>'id'").await;
}
