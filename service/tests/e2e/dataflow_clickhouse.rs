//! Dataflows with ClickHouse at either end (Debian's clickhouse-server
//! 18.16.1, started by the test on loopback), run by `sless dev`, with a
//! real PostgreSQL at the other end.

use std::time::Duration;

use crate::common::pg::{bulk_table, count, db, pg, unique, wait_for, wait_mid_stream};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::{Value, json};
use sless_testkit::clickhouse::{ClickHouseServer, PASSWORD};

#[tokio::test]
async fn postgresql_to_clickhouse_and_back_with_hostile_text_intact() {
    let ch = ClickHouseServer::start();
    let db = db().await;
    let src = unique("ch_src");
    let back = unique("ch_back");
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, name text, amount bigint);
         INSERT INTO {src} SELECT g, 'n' || g, g * 10 FROM generate_series(1, 40) g;
         INSERT INTO {src} VALUES (41, E'it''s \\\\ \"quoted\" \\n ünï', 9007199254740993);
         CREATE TABLE {back} (id int PRIMARY KEY, name text, amount bigint);"
    ))
    .await
    .unwrap();
    let typed = unique("typed");
    ch.query(&format!(
        "CREATE TABLE {typed} (id UInt64, name String, amount Int64, loaded DateTime DEFAULT now()) \
         ENGINE = MergeTree() ORDER BY id"
    ))
    .await;
    let raw = unique("raw");

    let dir = TempDir::new("df-ch");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "to-ch",
        "source": pg(&src, json!({"pollInterval": 1, "batchSize": 15})),
        "sink": ch.spec(&typed, json!({})),
    }))
    .await;
    a.create_dataflow(json!({
        "name": "to-ch-raw",
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": ch.spec(&raw, json!({"autoCreateTable": true})),
        "transformations": [{"type": "filter", "config": {"condition": "amount > 300"}}],
    }))
    .await;
    ch.wait_for(&format!("SELECT count() FROM {typed}"), 41).await;
    let hostile = ch
        .rows(&format!("SELECT name, amount FROM {typed} WHERE id = 41"))
        .await;
    assert_eq!(
        hostile,
        vec![json!({"name": "it's \\ \"quoted\" \n ünï", "amount": 9007199254740993_i64})]
    );
    // Columns without a key took their defaults.
    assert_eq!(
        ch.count(&format!(
            "SELECT count() FROM {typed} WHERE loaded > toDateTime('2020-01-01 00:00:00')"
        ))
        .await,
        41
    );
    ch.wait_for(&format!("SELECT count() FROM {raw}"), 11).await;
    let docs = ch.rows(&format!("SELECT data FROM {raw} ORDER BY created_at")).await;
    let ids: std::collections::BTreeSet<i64> = docs
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d["data"].as_str().unwrap()).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (31..=41).collect());

    // And back: ClickHouse as a source, read by its id, incrementally.
    a.create_dataflow(json!({
        "name": "from-ch",
        "source": ch.spec(&typed, json!({"pollInterval": 1, "batchSize": 7})),
        "sink": pg(&back, json!({"conflictKey": "id"})),
        "transformations": [{"type": "remove", "config": {"fields": ["loaded"]}}],
    }))
    .await;
    wait_for(&db, &format!("SELECT count(*) FROM {back}"), 41).await;
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM {back} b JOIN {src} s USING (id, name, amount)")
        )
        .await,
        41,
        "every row, every value, as PostgreSQL had it"
    );
    db.batch_execute(&format!(
        "INSERT INTO {src} SELECT g, 'late', g FROM generate_series(42, 50) g"
    ))
    .await
    .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {back}"), 50).await;

    // A wrong password: the dataflow says so, and never shows the secret.
    let wrong = ch.dsn().replace(PASSWORD, "not-the-password");
    a.create_dataflow(json!({
        "name": "refused",
        "source": pg(&src, json!({})),
        "sink": {"type": "clickhouse", "config": {"connectionString": wrong, "table": typed}},
    }))
    .await;
    let view = a.wait_for_phase("refused", "Error", Duration::from_secs(20)).await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(message.contains("password"), "{view}");
    assert!(
        !message.contains("not-the-password") && !message.contains(PASSWORD),
        "{view}"
    );

    // A table that is not there is a configuration error, not a retry loop.
    a.create_dataflow(json!({
        "name": "missing",
        "source": ch.spec("no_such_table", json!({})),
        "sink": pg(&back, json!({})),
    }))
    .await;
    let view = a.wait_for_phase("missing", "Error", Duration::from_secs(20)).await;
    assert!(
        view["message"].as_str().unwrap_or_default().contains("no_such_table"),
        "{view}"
    );

    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {back}"))
        .await
        .unwrap();
}

/// `kill -9` of `sless dev` mid-stream, both ways: ClickHouse → PostgreSQL
/// resumes from the checkpoint and every row lands once (by its key);
/// PostgreSQL → ClickHouse loses nothing and replays at most the batches
/// in flight (ClickHouse's plain MergeTree does not deduplicate).
#[tokio::test]
async fn clickhouse_at_either_end_survives_kill_9_mid_stream() {
    let ch = ClickHouseServer::start();
    let db = db().await;
    let rows = 20_000;
    let ch_src = unique("ch_bulk");
    ch.query(&format!(
        "CREATE TABLE {ch_src} (id UInt64, payload String) ENGINE = MergeTree() ORDER BY id"
    ))
    .await;
    ch.query(&format!(
        "INSERT INTO {ch_src} SELECT number + 1, '{}' FROM system.numbers LIMIT {rows}",
        "x".repeat(200)
    ))
    .await;
    let pg_dst = unique("ch_kill_dst");
    db.batch_execute(&format!("CREATE TABLE {pg_dst} (id bigint PRIMARY KEY, payload text)"))
        .await
        .unwrap();
    let pg_src = bulk_table(&db, "to_ch_kill", rows).await;
    let ch_dst = unique("ch_kill_sink");

    let dir = TempDir::new("df-ch-kill");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "from-ch",
        "source": ch.spec(&ch_src, json!({"pollInterval": 1, "batchSize": 50})),
        "sink": pg(&pg_dst, json!({"conflictKey": "id"})),
        "channelBufferSize": 50,
    }))
    .await;
    a.create_dataflow(json!({
        "name": "to-ch",
        "source": pg(&pg_src, json!({"pollInterval": 1, "batchSize": 50})),
        "sink": ch.spec(&ch_dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 50,
    }))
    .await;
    let landed = format!("SELECT count(*) FROM {pg_dst}");
    wait_mid_stream(&db, &landed, 0, rows).await;
    server.kill9();

    let _server = DevServer::start(&dir.0);
    wait_for(&db, &landed, rows).await;
    // 18.x's JSON functions: visitParamExtractInt reads a top-level key.
    let distinct = format!("SELECT uniqExact(visitParamExtractInt(data, 'id')) FROM {ch_dst}");
    ch.wait_for(&distinct, rows).await;
    let total = ch.count(&format!("SELECT count() FROM {ch_dst}")).await;
    // A replay is at most what was read and not yet committed.
    assert!(total - rows <= 200, "{} rows written twice", total - rows);
    db.batch_execute(&format!("DROP TABLE {pg_src}; DROP TABLE {pg_dst}"))
        .await
        .unwrap();
}

/// From the attack run: several ClickHouse sources of one tenant, each just
/// under the 64 MiB answer cap, took `sless dev` from 52 to 695 MB; there
/// was a bound per flow and none per tenant. Now a tenant's flows hold at
/// most their budget of answers at once (8 MiB here): a flow whose answers
/// pass it shows the reason and retries, and flows of smaller answers, the
/// tenant's and another's, run beside it.
#[tokio::test]
async fn a_tenants_dataflows_hold_no_more_answers_than_its_memory_budget() {
    let ch = ClickHouseServer::start();
    let db = db().await;
    let wide = unique("wide");
    ch.query(&format!(
        "CREATE TABLE {wide} (id UInt64, payload String) ENGINE = MergeTree() ORDER BY id"
    ))
    .await;
    // 2,000 rows of 10 kB: an answer of 1,000 rows is about 10 MB.
    ch.query(&format!("INSERT INTO {wide} SELECT number + 1, arrayStringConcat(arrayMap(x -> 'xxxxxxxxxx', range(1000))) FROM numbers(2000)"))
        .await;
    let dir = TempDir::new("df-ch-memory");
    let server = DevServer::start_with(&dir.0, "127.0.0.1:0", &["--tenant-dataflow-memory-limit-mb", "8"]);
    let (a, b) = (server.client(TOKEN_A), server.client(crate::common::TOKEN_B));
    let flow = |name: &str, batch: u32, dst: &str| {
        json!({"name": name,
            "source": ch.spec(&wide, json!({"pollInterval": 1, "batchSize": batch})),
            "sink": pg(dst, json!({"autoCreateTable": true}))})
    };
    let (big_a, small_a, small_b) = (unique("ch_big_a"), unique("ch_small_a"), unique("ch_small_b"));
    a.create_dataflow(flow("big", 1000, &big_a)).await;
    a.create_dataflow(flow("small", 100, &small_a)).await;
    b.create_dataflow(flow("small", 300, &small_b)).await;
    let view = a.wait_for_phase("big", "Error", Duration::from_secs(30)).await;
    let message = view["message"].as_str().unwrap();
    assert!(
        message.contains("tenant's dataflows may hold in memory") && message.contains("at most 8 MiB"),
        "{view}"
    );
    wait_for(&db, &format!("SELECT count(*) FROM {small_a}"), 2000).await;
    wait_for(&db, &format!("SELECT count(*) FROM {small_b}"), 2000).await;
    assert_eq!(count(&db, &format!("SELECT count(*) FROM {big_a}")).await, 0);
    a.delete("/api/v1/dataflows/big").await;
    for client in [&a, &b] {
        client.delete("/api/v1/dataflows/small").await;
    }
    db.batch_execute(&format!(
        "DROP TABLE {small_a}, {small_b}; DROP TABLE IF EXISTS {big_a}"
    ))
    .await
    .unwrap();
}
