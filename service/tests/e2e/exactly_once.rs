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
use crate::common::pg::{
    bulk_table, count, db, default_slot, dsn, insert_in_transactions, pg, unique, wait_for, wait_snapshot_written,
};
use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir};
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
    // The stored position goes with the dataflow (released in the
    // background: the DELETE does not wait for the database).
    wait_for(
        &db,
        &format!(
            "SELECT count(*) FROM {} WHERE dataflow = 'a/once {dst}'",
            sless_dataflow::positions_table("a")
        ),
        0,
    )
    .await;
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

/// The changes are made after the (empty) snapshot is written, in
/// transactions of 500 rows, so kills fall inside transactions too. A row
/// committed before its chunk is read comes twice by design (once as its
/// insert, once as the snapshot's read): CI once began inserting while the
/// empty table's chunk was still due, and 1,500 rows came twice.
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
    wait_snapshot_written(&db, &default_slot("once")).await;
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

/// N2 of the attack run: every tenant's positions were rows of one table,
/// `sless_dataflow_positions`, that any dataflow could name. Tenant b read
/// tenant a's row with a source and overwrote it with an upsert sink, and
/// a's flow, restarted, silently skipped the 50 rows added meanwhile; a
/// table b made first under that name stopped a's flow for ever. Now each
/// tenant has its own table, no spec may name one, each position carries
/// the tenant's seal, and the table's shape is checked before use.
#[tokio::test]
async fn another_tenant_cannot_read_forge_or_squat_a_flows_positions() {
    let db = db().await;
    let src = bulk_table(&db, "pos_src", 100).await;
    let dst = unique("pos_dst");
    let dir = TempDir::new("df-positions");
    let flow = json!({
        "name": "once",
        "source": pg(&src, json!({"batchSize": 10, "pollInterval": 1})),
        "sink": pg(&dst, json!({"autoCreateTable": true}))
    });
    let server = started(&dir, flow).await;
    let rows = format!("SELECT count(*) FROM {dst}");
    wait_for(&db, &rows, 100).await;
    let positions = sless_dataflow::positions_table("a");
    let stored = format!("SELECT count(*) FROM {positions} WHERE dataflow = 'a/once {dst}'");
    assert_eq!(count(&db, &stored).await, 1, "a's position is in its own table");

    // Read, forge and squat as tenant b: each refused when made, at its field.
    let copy = pg(&unique("b_copy"), json!({"autoCreateTable": true}));
    let query = json!({"type": "postgresql", "config": {"connectionString": dsn(), "table": "orders",
        "query": format!("SELECT dataflow AS id, position FROM {positions}")}});
    let cdc = json!({"type": "postgresql-cdc", "config": {"connectionString": dsn(), "tables": ["orders", positions]}});
    let attempts = [
        ("read", pg(&positions, json!({})), copy.clone(), "source.config.table"),
        ("read-by-query", query, copy.clone(), "source.config.query"),
        ("read-by-cdc", cdc, copy.clone(), "source.config.tables[1]"),
        (
            "forge",
            pg(&src, json!({})),
            pg(&positions, json!({"upsertMode": true, "conflictKey": "dataflow"})),
            "sink.config.table",
        ),
        (
            "squat",
            pg(&src, json!({})),
            pg(
                &format!("sq.{}", positions.to_uppercase()),
                json!({"autoCreateTable": true}),
            ),
            "sink.config.table",
        ),
        (
            "squat-the-shared-name",
            pg(&src, json!({})),
            pg("sq.sless_dataflow_positions", json!({"autoCreateTable": true})),
            "sink.config.table",
        ),
    ];
    let b = server.client(TOKEN_B);
    for (name, source, sink, field) in attempts {
        let (status, body) = b
            .post(
                "/api/v1/dataflows",
                json!({"name": name, "source": source, "sink": sink}),
            )
            .await;
        assert_eq!(status, 422, "{name}: {body}");
        assert_eq!(body["error"]["field"], field, "{name}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("exactly-once positions"),
            "{name}: {body}"
        );
    }

    // a's flow, killed, and restarted with rows added meanwhile, writes
    // each of them once.
    server.kill9();
    db.batch_execute(&format!(
        "INSERT INTO {src} (payload) SELECT repeat('y', 200) FROM generate_series(101, 150)"
    ))
    .await
    .unwrap();
    let server = DevServer::start(&dir.0);
    wait_for(&db, &rows, 150).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(&db, &rows).await, 150);
    let distinct = format!("SELECT count(DISTINCT data->>'id') FROM {dst}");
    assert_eq!(count(&db, &distinct).await, 150);

    // Below the API, on the shared database: a position changed by anyone
    // but the flow is refused with its reason, and nothing is skipped.
    server.kill9();
    db.batch_execute(&format!(
        "UPDATE {positions} SET position = position || ' ' WHERE dataflow = 'a/once {dst}';
         INSERT INTO {src} (payload) SELECT repeat('z', 200) FROM generate_series(151, 170)"
    ))
    .await
    .unwrap();
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let view = a.wait_for_phase("once", "Error", Duration::from_secs(30)).await;
    assert!(
        view["message"]
            .as_str()
            .unwrap()
            .contains("does not carry its tenant's seal"),
        "{view}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(count(&db, &rows).await, 150, "nothing written from a forged position");

    // A table of another shape where a flow keeps its positions (a squatter
    // with access to the database): refused with its reason, not written to.
    let schema = unique("squat");
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.{positions} (id bigserial PRIMARY KEY, data jsonb NOT NULL, created_at timestamptz)"
    ))
    .await
    .unwrap();
    a.create_dataflow(json!({
        "name": "into-squatted",
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": pg(&format!("{schema}.copy"), json!({"autoCreateTable": true}))
    }))
    .await;
    let view = a
        .wait_for_phase("into-squatted", "Error", Duration::from_secs(30))
        .await;
    assert!(
        view["message"]
            .as_str()
            .unwrap()
            .contains("is not a positions table as the platform makes it"),
        "{view}"
    );
    assert_eq!(count(&db, &format!("SELECT count(*) FROM {schema}.copy")).await, 0);

    for name in ["once", "into-squatted"] {
        assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    }
    // The row goes with the dataflow (released in the background).
    wait_for(&db, &stored, 0).await;
    db.batch_execute(&format!(
        "DROP SCHEMA {schema} CASCADE; DROP TABLE {src}; DROP TABLE {dst}"
    ))
    .await
    .unwrap();
}
