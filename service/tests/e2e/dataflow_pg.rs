//! Dataflows run by `sless dev` against a real PostgreSQL
//! (`SLESS_TEST_PG`, default postgres://postgres@127.0.0.1/test).
//!
//! Over 500 lines: one scenario a test, each with its own tables.

use crate::common::pg::{
    bulk_table, count, db, dsn, pg, refusing_tables, settled_view, unique, wait_for, wait_mid_stream,
};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::{Value, json};

#[tokio::test]
async fn pg_to_pg_with_transformations_incremental_reads_and_checkpoints() {
    let db = db().await;
    let (src, dst) = (unique("src"), unique("dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, card text, \"firstName\" text, amount int);
         INSERT INTO {src} (card, \"firstName\", amount) SELECT '4111' || g, 'n' || g, g FROM generate_series(1, 100) g;
         CREATE TABLE {dst} (id int PRIMARY KEY, card text, first_name text, amount int, seen_at text);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-pg");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "copy",
        "source": pg(&src, json!({"pollInterval": 1, "batchSize": 30})),
        "sink": pg(&dst, json!({})),
        "transformations": [
            {"type": "filter", "config": {"condition": "amount > 10"}},
            {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
            {"type": "snakeCase", "config": {}},
            {"type": "timestamp", "config": {"fieldName": "seen_at"}}
        ]
    }))
    .await;
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 90).await;
    let row = db
        .query_one(
            &format!("SELECT card, first_name, amount, seen_at FROM {dst} WHERE id = 42"),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "******");
    assert_eq!(row.get::<_, String>(1), "n42");
    assert_eq!(row.get::<_, i32>(2), 42);
    assert!(row.get::<_, String>(3).ends_with('Z'));
    // The counters are updated just after each write and checkpoint.
    let view = settled_view(&a, "copy", |c| c["lastCheckpointAt"].is_string() && c["written"] == 90).await;
    assert_eq!(view["phase"], "Running");
    let counters = &view["counters"];
    assert_eq!(
        (counters["read"].as_u64(), counters["written"].as_u64()),
        (Some(100), Some(90)),
        "{view}"
    );
    assert_eq!(
        (counters["filtered"].as_u64(), counters["failed"].as_u64()),
        (Some(10), Some(0))
    );
    // The same counters on /metrics, labelled by tenant and dataflow.
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"sless_dataflow_messages_written_total{namespace="a",dataflow="copy"} 90"#,
        r#"sless_dataflow_messages_filtered_total{namespace="a",dataflow="copy"} 10"#,
        r#"sless_dataflow_checkpoint_age_seconds{namespace="a",dataflow="copy"}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing from {metrics}");
    }

    // New rows are read incrementally.
    db.batch_execute(&format!(
        "INSERT INTO {src} (card, \"firstName\", amount) SELECT 'c', 'm', 1000 + g FROM generate_series(1, 25) g"
    ))
    .await
    .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 115).await;

    // After kill -9 the checkpoint holds: rows added meanwhile arrive, once.
    server.kill9();
    db.batch_execute(&format!(
        "INSERT INTO {src} (card, \"firstName\", amount) SELECT 'c', 'k', 2000 + g FROM generate_series(1, 5) g"
    ))
    .await
    .unwrap();
    let server = DevServer::start(&dir.0);
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 120).await;
    assert_eq!(server.client(TOKEN_A).delete("/api/v1/dataflows/copy").await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

/// An update restarts the dataflow: it is Pending from the update's answer
/// on, until the new spec runs, and then shows how the new spec runs (an
/// Error for a table that is not there), never the old spec's Running, which
/// a caller waiting for it to leave Pending (Terraform) would take.
#[tokio::test]
async fn an_updated_dataflow_is_pending_until_its_new_spec_runs() {
    let db = db().await;
    let (src, dst) = (unique("upd_src"), unique("upd_dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY); CREATE TABLE {dst} (id int PRIMARY KEY);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-update");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let spec = |table: &str| json!({"source": pg(table, json!({"pollInterval": 1})), "sink": pg(&dst, json!({}))});
    let mut create = spec(&src);
    create["name"] = "updated".into();
    a.create_dataflow(create).await;
    a.wait_for_phase("updated", "Running", std::time::Duration::from_secs(30))
        .await;

    let missing = unique("upd_missing");
    let (status, view) = a.patch("/api/v1/dataflows/updated", spec(&missing)).await;
    assert_eq!((status, view["phase"].as_str()), (200, Some("Pending")), "{view}");
    let view = a
        .wait_for_phase("updated", "Error", std::time::Duration::from_secs(30))
        .await;
    assert!(view["message"].as_str().unwrap().contains(&missing), "{view}");

    let (status, view) = a.patch("/api/v1/dataflows/updated", spec(&src)).await;
    assert_eq!((status, view["phase"].as_str()), (200, Some("Pending")), "{view}");
    a.wait_for_phase("updated", "Running", std::time::Duration::from_secs(30))
        .await;
    assert_eq!(a.delete("/api/v1/dataflows/updated").await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {dst}")).await.unwrap();
}

/// The server drops the dataflow's connections (as a restart of PostgreSQL
/// or a failover does): the flow connects again by itself and goes on
/// from its checkpoint, every row once.
#[tokio::test]
async fn a_dataflow_whose_connections_are_dropped_connects_again_and_goes_on() {
    let db = db().await;
    let (src, dst) = (unique("cut_src"), unique("cut_dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, n int);
         INSERT INTO {src} (n) SELECT g FROM generate_series(1, 100) g;
         CREATE TABLE {dst} (id int PRIMARY KEY, n int);"
    ))
    .await
    .unwrap();
    // Its own application name marks this flow's connections among those
    // of the tests running beside it.
    let name = unique("sless_cut");
    let dsn = format!(
        "{}{}application_name={name}",
        dsn(),
        if dsn().contains('?') { '&' } else { '?' }
    );
    let dir = TempDir::new("df-cut");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "cut",
        "source": pg(&src, json!({"connectionString": dsn, "pollInterval": 1, "batchSize": 30})),
        "sink": pg(&dst, json!({"connectionString": dsn})),
    }))
    .await;
    let copied = format!("SELECT count(*) FROM {dst}");
    wait_for(&db, &copied, 100).await;
    let dropped = count(
        &db,
        &format!("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{name}'"),
    )
    .await;
    assert!(dropped >= 2, "the source's and the sink's connections: {dropped}");
    db.batch_execute(&format!(
        "INSERT INTO {src} (n) SELECT g FROM generate_series(101, 150) g"
    ))
    .await
    .unwrap();
    wait_for(&db, &copied, 150).await;
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {src} s JOIN {dst} d USING (id, n)")).await,
        150
    );
    assert_eq!(a.delete("/api/v1/dataflows/cut").await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn kill_9_mid_stream_loses_nothing_and_duplicates_at_most_two_batches() {
    let db = db().await;
    let src = bulk_table(&db, "bulk", 20000).await;
    let dst = unique("bulk_copy");
    let dir = TempDir::new("df-kill");
    let server = DevServer::start(&dir.0);
    let flow = json!({
        "name": "bulk",
        "source": pg(&src, json!({"batchSize": 50, "pollInterval": 1})),
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 50
    });
    assert_eq!(server.client(TOKEN_A).post("/api/v1/dataflows", flow).await.0, 201);
    wait_mid_stream(&db, &format!("SELECT count(*) FROM {dst}"), 0, 20000).await;
    server.kill9();
    let _server = DevServer::start(&dir.0);
    let distinct = format!("SELECT count(DISTINCT (data->>'id')) FROM {dst}");
    wait_for(&db, &distinct, 20000).await;
    let total = count(&db, &format!("SELECT count(*) FROM {dst}")).await;
    // The batch being written and the one whose commit was under way.
    assert!(
        total - 20000 <= 100,
        "{} duplicates: more than two batches",
        total - 20000
    );
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn sigterm_of_dev_commits_the_batch_in_hand_so_a_restart_duplicates_nothing() {
    let db = db().await;
    let src = bulk_table(&db, "graceful", 50000).await;
    let dst = unique("graceful_copy");
    let dir = TempDir::new("df-term");
    let server = DevServer::start(&dir.0);
    let flow = json!({
        "name": "graceful",
        "source": pg(&src, json!({"batchSize": 50, "pollInterval": 1})),
        // Raw JSONB rows have no key: a re-written batch shows as duplicates.
        "sink": pg(&dst, json!({"autoCreateTable": true})),
        "channelBufferSize": 50
    });
    assert_eq!(server.client(TOKEN_A).post("/api/v1/dataflows", flow).await.0, 201);
    let rows = format!("SELECT count(*) FROM {dst}");
    wait_mid_stream(&db, &rows, 0, 50000).await;
    let status = server.terminate();
    assert!(status.success(), "{status}");
    let written = count(&db, &rows).await;
    assert!(
        written < 50000,
        "copied everything before SIGTERM: make the table larger"
    );

    let _server = DevServer::start(&dir.0);
    wait_for(&db, &format!("SELECT count(DISTINCT (data->>'id')) FROM {dst}"), 50000).await;
    assert_eq!(count(&db, &rows).await, 50000, "a graceful stop duplicated rows");
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {dst}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_deleted_dataflow_stops_writing_and_its_successor_starts_from_the_beginning() {
    let db = db().await;
    let src = bulk_table(&db, "reborn", 20000).await;
    let (first, second) = (unique("reborn_a"), unique("reborn_b"));
    let dir = TempDir::new("df-reborn");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let flow = |sink: &str| {
        json!({
            "name": "reborn",
            "source": pg(&src, json!({"batchSize": 50, "pollInterval": 1})),
            "sink": pg(sink, json!({"autoCreateTable": true})),
            "channelBufferSize": 50
        })
    };
    assert_eq!(a.post("/api/v1/dataflows", flow(&first)).await.0, 201);
    let rows = format!("SELECT count(*) FROM {first}");
    wait_mid_stream(&db, &rows, 0, 20000).await;
    // DELETE answers once the processor has stopped.
    assert_eq!(a.delete("/api/v1/dataflows/reborn").await.0, 204);
    let stopped_at = count(&db, &rows).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(count(&db, &rows).await, stopped_at, "a deleted dataflow kept writing");
    assert!(
        stopped_at < 20000,
        "copied everything before the delete: make the table larger"
    );

    assert_eq!(a.post("/api/v1/dataflows", flow(&second)).await.0, 201);
    wait_for(
        &db,
        &format!("SELECT count(DISTINCT (data->>'id')) FROM {second}"),
        20000,
    )
    .await;
    assert_eq!(
        count(&db, &format!("SELECT min((data->>'id')::int)::int8 FROM {second}")).await,
        1,
        "the new dataflow resumed from its predecessor's position"
    );
    db.batch_execute(&format!("DROP TABLE {src}; DROP TABLE {first}; DROP TABLE {second}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn router_sinks_and_the_error_sink() {
    let db = db().await;
    let (src, sales, refunds, errors) = (unique("events"), unique("sales"), unique("refunds"), unique("errors"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, kind text, amount int);
         INSERT INTO {src} (kind, amount) VALUES ('sale', 10), ('refund', 5), ('sale', -3), ('sale', 7), ('refund', 1);
         CREATE TABLE {sales} (id int PRIMARY KEY, kind text, amount int CHECK (amount >= 0));
         CREATE TABLE {refunds} (id int PRIMARY KEY, kind text, amount int);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-route");
    let server = DevServer::start(&dir.0);
    let flow = json!({
        "name": "split",
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": pg(&sales, json!({})),
        "errors": pg(&errors, json!({"autoCreateTable": true})),
        "transformations": [{"type": "router", "config": {"routes": [{"condition": "kind == 'refund'", "sink": pg(&refunds, json!({}))}]}}]
    });
    let (status, body) = server.client(TOKEN_A).post("/api/v1/dataflows", flow).await;
    assert_eq!(status, 201, "{body}");
    wait_for(&db, &format!("SELECT count(*) FROM {refunds}"), 2).await;
    wait_for(&db, &format!("SELECT count(*) FROM {sales}"), 2).await;
    wait_for(&db, &format!("SELECT count(*) FROM {errors}"), 1).await;
    let view = settled_view(&server.client(TOKEN_A), "split", |c| {
        c["failed"] == 1 && c["written"] == 4
    })
    .await;
    assert_eq!(
        (
            view["counters"]["written"].as_u64(),
            view["counters"]["failed"].as_u64()
        ),
        (Some(4), Some(1)),
        "{view}"
    );
    assert_eq!(view["counters"]["read"], 5);
    let envelope: String = db
        .query_one(&format!("SELECT data::text FROM {errors}"), &[])
        .await
        .unwrap()
        .get(0);
    let envelope: Value = serde_json::from_str(&envelope).unwrap();
    assert_eq!(envelope["original_message"]["amount"], -3);
    assert_eq!(envelope["error"]["original_sink"], sales);
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("check constraint"),
        "{envelope}"
    );
    assert!(envelope["error"]["timestamp"].is_string() && envelope["error"]["metadata"].is_object());
    db.batch_execute(&format!(
        "DROP TABLE {src}; DROP TABLE {sales}; DROP TABLE {refunds}; DROP TABLE {errors}"
    ))
    .await
    .unwrap();
}

/// Rows sharing a change time across a batch boundary, and two transactions
/// that commit in the reverse order of their ids: every row arrives. The
/// position was the change time alone (`> $1`), which skipped both.
#[tokio::test]
async fn no_row_is_skipped_at_ties_or_when_transactions_commit_out_of_order() {
    let db = db().await;
    let (src, dst) = (unique("ties"), unique("ties_dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, changed timestamptz NOT NULL, v text);
         INSERT INTO {src} (changed, v) VALUES
           ('2026-01-01T00:00:01Z', 'a'), ('2026-01-01T00:00:02Z', 'b'),
           ('2026-01-01T00:00:03Z', 't1'), ('2026-01-01T00:00:03Z', 't2'), ('2026-01-01T00:00:03Z', 't3'),
           ('2026-01-01T00:00:04Z', 'c');
         CREATE TABLE {dst} (id int PRIMARY KEY, v text);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-ties");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "ties",
        // A batch of 3 ends inside the three rows changed at :03.
        "source": pg(&src, json!({"pollInterval": 1, "batchSize": 3, "incrementalColumn": "changed"})),
        "sink": pg(&dst, json!({})),
        "transformations": [{"type": "remove", "config": {"fields": ["changed"]}}]
    }))
    .await;
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 6).await;

    // Transaction 1 takes id 7 and stays open; transaction 2 takes id 8 and
    // commits first, both later in change time than everything read.
    let mut slow = crate::common::pg::db().await;
    let t1 = slow.transaction().await.unwrap();
    t1.execute(
        &format!("INSERT INTO {src} (changed, v) VALUES ('2026-01-01T00:00:05Z', 'slow')"),
        &[],
    )
    .await
    .unwrap();
    db.execute(
        &format!("INSERT INTO {src} (changed, v) VALUES ('2026-01-01T00:00:06Z', 'fast')"),
        &[],
    )
    .await
    .unwrap();
    // Several polls pass while transaction 1 is open: the fast row must wait
    // behind it, not be read past it.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(count(&db, &format!("SELECT count(*) FROM {dst}")).await, 6);
    t1.commit().await.unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 8).await;
    let rows = db
        .query(&format!("SELECT v FROM {dst} ORDER BY id"), &[])
        .await
        .unwrap();
    let values: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(values, ["a", "b", "t1", "t2", "t3", "c", "slow", "fast"]);
}

/// Without an error sink a refused message is retried, never dropped; the
/// dataflow showed `Ready` all along before. Now it shows the refusal (and
/// how often) while it retries, and `Ready` again once the sink accepts.
#[tokio::test]
async fn a_message_the_sink_refuses_shows_on_the_dataflow_while_it_is_retried() {
    let db = db().await;
    let (src, dst) = refusing_tables(&db, "refused").await;
    let dir = TempDir::new("df-refused");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(
        json!({"name": "refused", "source": pg(&src, json!({"pollInterval": 1})), "sink": pg(&dst, json!({}))}),
    )
    .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let view = loop {
        let (_, view) = a.get("/api/v1/dataflows/refused").await;
        if view["phase"] == "Error" && view["message"].as_str().is_some_and(|m| m.contains("refuses")) {
            break view;
        }
        assert!(std::time::Instant::now() < deadline, "the refusal never showed: {view}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let message = view["message"].as_str().unwrap();
    assert!(message.contains(&dst) && message.contains("no error sink"), "{message}");
    assert!(message.contains("time(s) so far"), "{message}");
    // The sink accepts again: the message is written, nothing was dropped.
    db.batch_execute(&format!("ALTER TABLE {dst} DROP CONSTRAINT positive"))
        .await
        .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 3).await;
    let view = settled_view(&a, "refused", |c| c["written"] == 3).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut view = view;
    while view["phase"] != "Running" {
        assert!(std::time::Instant::now() < deadline, "{view}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        view = a.get("/api/v1/dataflows/refused").await.1;
    }
    assert_eq!(view["message"], "running");
}

/// A write the sink keeps failing for a reason retrying may mend (here a
/// read-only session) takes the dataflow out of `Running`, with the reason,
/// while it is retried; once a new session can write, it runs again.
#[tokio::test]
async fn a_write_that_keeps_failing_shows_on_the_dataflow_while_it_is_retried() {
    let db = db().await;
    let (src, dst, role) = (unique("ro_src"), unique("ro_dst"), unique("ro_role"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, amount int); INSERT INTO {src} VALUES (1, 1), (2, 2);
         CREATE TABLE {dst} (id int PRIMARY KEY, amount int);
         CREATE ROLE {role} LOGIN; GRANT ALL ON {dst} TO {role};
         ALTER ROLE {role} SET default_transaction_read_only = on;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-read-only");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let sink = json!({"type": "postgresql", "config": {
        "connectionString": format!("postgres://{role}@127.0.0.1/test"), "table": dst, "exactlyOnce": false}});
    a.create_dataflow(json!({"name": "read-only", "source": pg(&src, json!({"pollInterval": 1})), "sink": sink}))
        .await;
    let view = a
        .wait_for_phase("read-only", "Error", std::time::Duration::from_secs(20))
        .await;
    // (The refused COPY also ends the session; the write's reason stays.)
    let message = view["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("writing to {dst} fails")) && message.contains("read-only transaction"),
        "{message}"
    );
    // New sessions may write; the sink's session is ended, it connects again.
    db.batch_execute(&format!(
        "ALTER ROLE {role} SET default_transaction_read_only = off;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}';"
    ))
    .await
    .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 2).await;
    let view = a
        .wait_for_phase("read-only", "Running", std::time::Duration::from_secs(20))
        .await;
    assert_eq!(view["message"], "running");
    assert_eq!(a.delete("/api/v1/dataflows/read-only").await.0, 204);
    drop(server);
    db.batch_execute(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}';
         DROP TABLE {src}, {dst}; DROP ROLE {role};"
    ))
    .await
    .unwrap();
}

/// `sslmode` through rustls against PostgreSQL behind TLS (a certificate
/// made at test time): `verify-full` checks chain and name, `verify-ca` the
/// chain only, `require` encrypts without checking; the root certificate
/// comes from the platform's TLS directory.
#[tokio::test]
async fn sslmode_require_verify_ca_and_verify_full() {
    use crate::common::pg_tls::{TlsPostgres, named_and_misnamed};
    use sless_testkit::tls::Ca;
    let db = db().await;
    let src = unique("tls_src");
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, v text); INSERT INTO {src} (v) VALUES ('over tls');"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-tls");
    let (server, misnamed) = named_and_misnamed(&dir.0).await;
    let stranger = Ca::new("another CA");
    let (stranger_cert, stranger_key) = stranger.issue(&["localhost"], &[]);
    let untrusted = TlsPostgres::start(&stranger_cert, &stranger_key).await;

    let dev = DevServer::start(&dir.0);
    let a = dev.client(TOKEN_A);
    let cases = [
        ("full", server.port, "verify-full", true),
        ("full-misnamed", misnamed.port, "verify-full", false),
        ("ca-misnamed", misnamed.port, "verify-ca", true),
        ("full-untrusted", untrusted.port, "verify-full", false),
        ("require-untrusted", untrusted.port, "require", true),
    ];
    for (name, port, mode, _) in cases {
        let dsn = format!("postgres://postgres@localhost:{port}/test?sslmode={mode}&sslrootcert=ca.pem");
        let dst = format!("{src}_{}", name.replace('-', "_"));
        a.create_dataflow(json!({
            "name": name,
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": src, "pollInterval": 1}},
            "sink": pg(&dst, json!({"autoCreateTable": true}))
        }))
        .await;
    }
    for (name, _, mode, connects) in cases {
        let dst = format!("{src}_{}", name.replace('-', "_"));
        if connects {
            wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 1).await;
        } else {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let (_, view) = a.get(&format!("/api/v1/dataflows/{name}")).await;
                if view["phase"] == "Error" {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{name} ({mode}) connected: {view}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

/// `conflictKey` was spliced into SQL inside quotes it could close.
#[tokio::test]
async fn a_conflict_key_cannot_inject_sql() {
    let db = db().await;
    let (src, dst, victim) = (unique("ck_src"), unique("ck_dst"), unique("ck_victim"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, \"we\"\"ird\" text);
         INSERT INTO {src} (\"we\"\"ird\") VALUES ('a');
         CREATE TABLE {dst} (id int PRIMARY KEY, \"we\"\"ird\" text);
         CREATE TABLE {victim} (x int);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-ck");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let injected = format!("id\") DO NOTHING; DROP TABLE {victim}; --");
    a.create_dataflow(json!({"name": "inject", "source": pg(&src, json!({"pollInterval": 1})),
                   "sink": pg(&dst, json!({"upsertMode": true, "conflictKey": injected}))}))
        .await;
    let view = settled_view(&a, "inject", |_| false).await;
    assert_eq!(view["phase"], "Error", "{view}");
    assert!(view["message"].as_str().unwrap().contains("not a column"), "{view}");
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {victim}")).await,
        0,
        "the victim table is still there"
    );
    // A real key, and a column whose name holds a quote, work.
    a.create_dataflow(json!({"name": "upsert", "source": pg(&src, json!({"pollInterval": 1})),
                   "sink": pg(&dst, json!({"upsertMode": true, "conflictKey": "id"}))}))
        .await;
    wait_for(&db, &format!("SELECT count(*) FROM {dst} WHERE \"we\"\"ird\" = 'a'"), 1).await;
}
