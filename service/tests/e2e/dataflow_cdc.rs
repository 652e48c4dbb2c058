//! PostgreSQL change data capture (`postgresql-cdc`) run by `sless dev`
//! against the local PostgreSQL (wal_level=logical, which
//! scripts/install-test-deps.sh sets): events in commit order, Debezium's
//! shape, the slot as the checkpoint across `kill -9`, and the slot and
//! publication gone with the dataflow.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::pg::{
    count, db, default_slot, dsn, hex_digest, insert_in_transactions, pg, publication_comment, unique, wait_for,
    wait_mid_stream, wait_snapshot_written,
};
use crate::common::{Client, DevServer, TOKEN_A, TempDir};
use serde_json::{Value, json};

/// A dataflow name no other test (or earlier run) uses: it names the slot.
fn flow_name(prefix: &str) -> String {
    format!("{prefix}-{}", rand::random::<u32>())
}

fn cdc(tables: &[&str], extra: Value) -> Value {
    let mut config = json!({"connectionString": dsn(), "tables": tables, "pollInterval": 1});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"type": "postgresql-cdc", "config": config})
}

/// `sless dev` in `dir` with tenant a's dataflow `name` (a `flow_name`)
/// from `source` into `sink`, Running and its snapshot written: each change
/// made from then on comes once. (A row changed before its chunk is read
/// comes twice by design, as its change and as the snapshot's read; CI
/// once changed rows while an empty table's chunk was still due.)
async fn running(dir: &TempDir, name: &str, source: Value, sink: Value, extra: Value) -> (DevServer, Client) {
    let started = snapshotting(dir, name, source, sink, extra).await;
    wait_snapshot_written(&db().await, &default_slot(name)).await;
    started
}

/// As [`running`], without waiting for the snapshot: its slot exists from
/// then on.
async fn snapshotting(dir: &TempDir, name: &str, source: Value, sink: Value, extra: Value) -> (DevServer, Client) {
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let mut request = json!({"name": name, "source": source, "sink": sink});
    request
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    a.create_dataflow(request).await;
    a.wait_for_phase(name, "Running", Duration::from_secs(30)).await;
    (server, a)
}

/// The events in `table` (a raw-mode sink's), in the order written, once
/// there are `count` of them.
async fn events_once(db: &tokio_postgres::Client, table: &str, count: i64) -> Vec<Value> {
    wait_for(db, &format!("SELECT count(*) FROM {table}"), count).await;
    db.query(&format!("SELECT data::text FROM {table} ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r.get::<_, &str>(0)).unwrap())
        .collect()
}

/// The names of the slots and publications on the server.
async fn slots_and_publications(db: &tokio_postgres::Client) -> (Vec<String>, Vec<String>) {
    let slots = db
        .query("SELECT slot_name::text FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let publications = db
        .query("SELECT pubname::text FROM pg_publication", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    (slots, publications)
}

#[tokio::test]
async fn changes_arrive_in_commit_order_as_debezium_events_and_the_slot_goes_with_the_dataflow() {
    let db = db().await;
    let (items, notes, events) = (unique("cdc_items"), unique("cdc_notes"), unique("cdc_events"));
    db.batch_execute(&format!(
        "CREATE TABLE {items} (id int PRIMARY KEY, name text, qty int, doc jsonb);
         ALTER TABLE {items} REPLICA IDENTITY FULL;
         CREATE TABLE {notes} (id int PRIMARY KEY, body text);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc");
    let name = flow_name("cdc");
    let source = cdc(&[&items, &notes], json!({}));
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let (_server, a) = running(&dir, &name, source, sink, json!({})).await;

    // Interleaved transactions on two tables, one rolled back.
    db.batch_execute(&format!(
        "BEGIN;
         INSERT INTO {items} VALUES (1, 'a', 1, '{{\"tags\": [\"x\"]}}'), (2, 'b', 2, NULL);
         INSERT INTO {notes} VALUES (1, E'it''s \\\\ \"quoted\"');
         COMMIT;
         BEGIN; INSERT INTO {items} VALUES (99, 'never', 0, NULL); ROLLBACK;
         UPDATE {items} SET qty = 5 WHERE id = 1;
         BEGIN; DELETE FROM {items} WHERE id = 2; UPDATE {notes} SET body = 'edited' WHERE id = 1; COMMIT;"
    ))
    .await
    .unwrap();
    let rows = events_once(&db, &events, 6).await;
    let summary: Vec<(String, String)> = rows
        .iter()
        .map(|e| {
            (
                e["op"].as_str().unwrap().to_owned(),
                e["source"]["table"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("c", &items),
        ("c", &items),
        ("c", &notes),
        ("u", &items),
        ("d", &items),
        ("u", &notes),
    ]
    .iter()
    .map(|(op, t)| (op.to_string(), t.to_string()))
    .collect();
    assert_eq!(summary, expected, "commit order, nothing rolled back");
    assert_eq!(
        rows[0]["after"],
        json!({"id": 1, "name": "a", "qty": 1, "doc": {"tags": ["x"]}})
    );
    assert_eq!(rows[0]["before"], Value::Null);
    assert_eq!(rows[2]["after"]["body"], "it's \\ \"quoted\"");
    // REPLICA IDENTITY FULL: an update has the old row.
    assert_eq!(rows[3]["before"]["qty"], 1);
    assert_eq!(rows[3]["after"]["qty"], 5);
    assert_eq!(rows[4]["before"]["id"], 2);
    assert_eq!(rows[4]["after"], Value::Null);
    // Default identity: no old row on an update of notes.
    assert_eq!(rows[5]["before"], Value::Null);
    assert_eq!(rows[0]["source"]["txId"], rows[2]["source"]["txId"], "one transaction");
    assert_ne!(rows[0]["source"]["txId"], rows[3]["source"]["txId"]);
    assert!(rows[0]["source"]["lsn"].as_str().unwrap().contains('/'));

    // The dataflow's own slot and publication (other tests' run beside it).
    let (slots, publications) = slots_and_publications(&db).await;
    let slot = Some(format!("sless_{}", hex_digest(&format!("a/{name}"), 10)));
    assert!(
        slots.contains(slot.as_ref().unwrap()) && publications.contains(slot.as_ref().unwrap()),
        "{slot:?} not in {slots:?} {publications:?}"
    );

    // Deleted: the slot and the publication are dropped.
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (slots, publications) = slots_and_publications(&db).await;
        let slot = slot.as_ref().unwrap();
        if !slots.contains(slot) && !publications.contains(slot) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "slot {slot} still there: {slots:?} {publications:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    db.batch_execute(&format!("DROP TABLE {items}, {notes}, {events}"))
        .await
        .unwrap();
}

/// What users of change capture run into, as the events show it: a
/// TOASTed value an update left unchanged is left out of `after` (the
/// server does not send it), columns added and retyped between events are
/// in the events after, and a transaction of more changes than a batch
/// arrives whole.
#[tokio::test]
async fn unchanged_toast_schema_changes_and_a_transaction_larger_than_a_batch() {
    let db = db().await;
    let (docs, events) = (unique("cdc_docs"), unique("cdc_docs_events"));
    db.batch_execute(&format!("CREATE TABLE {docs} (id int PRIMARY KEY, qty int, big text);"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-behaviour");
    let name = flow_name("cdc-behaviour");
    let source = cdc(&[&docs], json!({"batchSize": 10}));
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let (_server, a) = running(&dir, &name, source, sink, json!({})).await;

    // 6,400 characters of hex: stored out of line (TOAST), barely compressible.
    db.batch_execute(&format!(
        "INSERT INTO {docs} SELECT 1, 1, string_agg(md5(g::text), '') FROM generate_series(1, 200) g;
         UPDATE {docs} SET qty = 2 WHERE id = 1;
         ALTER TABLE {docs} ADD COLUMN note text;
         INSERT INTO {docs} (id, qty, note) VALUES (2, 1, 'added');
         ALTER TABLE {docs} ALTER COLUMN qty TYPE bigint;
         INSERT INTO {docs} (id, qty) VALUES (3, 9007199254740993);
         INSERT INTO {docs} (id, qty) SELECT g, g FROM generate_series(100, 134) g;"
    ))
    .await
    .unwrap();
    let rows = events_once(&db, &events, 39).await;
    assert_eq!(rows[0]["after"]["big"].as_str().map(str::len), Some(6400));
    assert_eq!(rows[1]["op"], "u");
    assert_eq!(rows[1]["after"]["qty"], 2);
    assert!(
        rows[1]["after"].get("big").is_none(),
        "an unchanged TOASTed value is left out: {}",
        rows[1]["after"]
    );
    assert_eq!(
        rows[2]["after"],
        json!({"id": 2, "qty": 1, "big": null, "note": "added"})
    );
    // bigint after the retype, beyond what a double holds exactly.
    assert_eq!(rows[3]["after"]["qty"], json!(9007199254740993_i64));
    // 35 changes of one transaction, batches of 10: all of them, in order.
    let big: Vec<i64> = rows[4..].iter().map(|e| e["after"]["id"].as_i64().unwrap()).collect();
    assert_eq!(big, (100..=134).collect::<Vec<_>>());
    let tx = &rows[4]["source"]["txId"];
    assert!(rows[4..].iter().all(|e| &e["source"]["txId"] == tx), "one transaction");
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {docs}, {events}")).await.unwrap();
}

/// A source whose tables stay quiet while the server is busy elsewhere
/// moves its slot on all the same: otherwise the slot would hold the
/// server's WAL until the disk fills or the server invalidates it.
#[tokio::test]
async fn an_idle_source_moves_its_slot_past_other_tables_changes() {
    let db = db().await;
    let (quiet, busy, events) = (unique("cdc_quiet"), unique("cdc_busy"), unique("cdc_quiet_events"));
    db.batch_execute(&format!(
        "CREATE TABLE {quiet} (id int PRIMARY KEY); CREATE TABLE {busy} (id int);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-idle");
    let name = flow_name("cdc-idle");
    let source = cdc(&[&quiet], json!({}));
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let (_server, a) = running(&dir, &name, source, sink, json!({})).await;
    let slot = format!("sless_{}", hex_digest(&format!("a/{name}"), 10));
    // A change of ours begun before the other table's WAL and committed
    // only after the slot moved past it: moving must not skip it.
    let open = crate::common::pg::db().await;
    open.batch_execute(&format!("BEGIN; INSERT INTO {quiet} VALUES (2)"))
        .await
        .unwrap();
    db.batch_execute(&format!("INSERT INTO {busy} SELECT g FROM generate_series(1, 10000) g"))
        .await
        .unwrap();
    let busy_upto: String = db
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let moved: Option<bool> = db
            .query_one(
                "SELECT confirmed_flush_lsn >= $2::text::pg_lsn FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot, &busy_upto],
            )
            .await
            .unwrap()
            .get(0);
        if moved == Some(true) {
            break;
        }
        assert!(Instant::now() < deadline, "slot {slot} still short of {busy_upto}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    open.batch_execute("COMMIT").await.unwrap();
    // And it still captures what comes after.
    db.batch_execute(&format!("INSERT INTO {quiet} VALUES (1)"))
        .await
        .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {events}"), 2).await;
    let ids: Vec<i64> = db
        .query(
            &format!("SELECT (data->'after'->>'id')::bigint FROM {events} ORDER BY id"),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, [2, 1], "in commit order, the long transaction included");
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {quiet}, {busy}, {events}"))
        .await
        .unwrap();
}

/// A table added to a running dataflow's tables (a PATCH, which restarts
/// it) is captured from the moment its publication has it: every change
/// after that arrives, none from before, and the tables it had keep
/// flowing.
#[tokio::test]
async fn a_table_added_to_the_dataflow_is_captured_from_then_on() {
    let db = db().await;
    let (first, added, events) = (unique("cdc_first"), unique("cdc_added"), unique("cdc_added_events"));
    db.batch_execute(&format!(
        "CREATE TABLE {first} (id int PRIMARY KEY); CREATE TABLE {added} (id int PRIMARY KEY);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-added");
    let name = flow_name("cdc-added");
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let (_server, a) = running(&dir, &name, cdc(&[&first], json!({})), sink, json!({})).await;
    db.batch_execute(&format!("INSERT INTO {first} VALUES (1)"))
        .await
        .unwrap();
    events_once(&db, &events, 1).await;

    let (status, body) = a
        .patch(
            &format!("/api/v1/dataflows/{name}"),
            json!({"source": cdc(&[&first, &added], json!({}))}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Changes to the added table, one a transaction, until the restarted
    // dataflow captures one.
    let of_added = format!("SELECT count(*) FROM {events} WHERE data->'source'->>'table' = '{added}'");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut inserted = 0;
    while count(&db, &of_added).await == 0 {
        assert!(Instant::now() < deadline, "the added table was never captured");
        inserted += 1;
        db.batch_execute(&format!("INSERT INTO {added} VALUES ({inserted})"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    db.batch_execute(&format!(
        "INSERT INTO {added} VALUES (1000); INSERT INTO {first} VALUES (2)"
    ))
    .await
    .unwrap();
    // The last two changes in, the ones before them are in too.
    let last_two = format!(
        "SELECT count(*) FROM {events} WHERE (data->'source'->>'table', data->'after'->>'id') \
         IN (('{added}', '1000'), ('{first}', '2'))"
    );
    wait_for(&db, &last_two, 2).await;
    let total = count(&db, &format!("SELECT count(*) FROM {events}")).await;
    let all = events_once(&db, &events, total).await;
    let ids: Vec<i64> = all
        .iter()
        .filter(|e| e["source"]["table"] == added.as_str())
        .map(|e| e["after"]["id"].as_i64().unwrap())
        .collect();
    // A run of the last ones inserted, then 1000: none skipped after the first.
    let from = ids[0];
    let expected: Vec<i64> = (from..=inserted).chain([1000]).collect();
    assert_eq!(
        ids, expected,
        "every change of the added table from the first captured on"
    );
    assert_eq!(
        all.iter().filter(|e| e["source"]["table"] == first.as_str()).count(),
        2,
        "the first table keeps flowing"
    );
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {first}, {added}, {events}"))
        .await
        .unwrap();
}

/// Tenants sharing a database server: tenant b names tenant a's slot (its
/// default name is predictable from a's tenant and dataflow names), and a
/// publication in its own prefix that its dataflow did not make. Before,
/// b's dataflow rewrote a's publication, took a's changes, and dropped a's
/// slot and publication when deleted.
#[tokio::test]
async fn a_tenant_can_neither_adopt_nor_drop_another_tenants_slot_or_publication() {
    let db = db().await;
    let (table, events, stolen) = (unique("cdc_shared"), unique("cdc_a_events"), unique("cdc_b_events"));
    db.batch_execute(&format!("CREATE TABLE {table} (id int PRIMARY KEY)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-tenants");
    let server = DevServer::start(&dir.0);
    let (a, b) = (server.client(TOKEN_A), server.client(crate::common::TOKEN_B));
    let name = flow_name("shared");
    a.create_dataflow(json!({
        "name": name,
        "source": cdc(&[&table], json!({})),
        "sink": pg(&events, json!({"autoCreateTable": true})),
    }))
    .await;
    a.wait_for_phase(&name, "Running", Duration::from_secs(30)).await;
    let a_slot = format!("sless_{}", hex_digest(&format!("a/{name}"), 10));
    assert!(slots_and_publications(&db).await.0.contains(&a_slot));

    // b's prefix, and a publication in it that no dataflow made.
    let b_prefix = format!("sless_{}_", hex_digest("b", 6));
    let foreign = format!("{b_prefix}{}", rand::random::<u32>());
    db.batch_execute(&format!("CREATE PUBLICATION {foreign} FOR TABLE {table}"))
        .await
        .unwrap();
    // Names outside b's prefix are refused when made, naming the prefix.
    for (flow, extra, field) in [
        ("by-slot", json!({"slotName": a_slot}), "slotName"),
        ("by-publication", json!({"publicationName": a_slot}), "publicationName"),
    ] {
        let (status, body) = b
            .post(
                "/api/v1/dataflows",
                json!({"name": flow, "source": cdc(&[&table], extra), "sink": pg(&stolen, json!({}))}),
            )
            .await;
        assert_eq!(status, 422, "{flow}: {body}");
        assert_eq!(body["error"]["field"], format!("source.config.{field}"), "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("must begin with {b_prefix}")),
            "{flow}: {body}"
        );
    }
    // A name in b's prefix that b's dataflow did not make: refused when run.
    let flow = "foreign";
    b.create_dataflow(json!({
        "name": flow,
        "source": cdc(&[&table], json!({"slotName": format!("{b_prefix}x"), "publicationName": foreign})),
        "sink": pg(&stolen, json!({"autoCreateTable": true})),
    }))
    .await;
    let view = b.wait_for_phase(flow, "Error", Duration::from_secs(20)).await;
    assert!(
        view["message"]
            .as_str()
            .unwrap()
            .contains("was not made by this dataflow"),
        "{view}"
    );
    assert_eq!(b.delete(&format!("/api/v1/dataflows/{flow}")).await.0, 204);
    // Deleting b's dataflows dropped nothing of a's, nor the foreign one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (slots, publications) = slots_and_publications(&db).await;
    assert!(
        slots.contains(&a_slot) && publications.contains(&a_slot),
        "{slots:?} {publications:?}"
    );
    assert!(publications.contains(&foreign), "{publications:?}");
    // a still captures its changes, all of them.
    db.batch_execute(&format!("INSERT INTO {table} SELECT generate_series(1, 20)"))
        .await
        .unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {events}"), 20).await;
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP PUBLICATION {foreign}; DROP TABLE {table}, {events}"))
        .await
        .unwrap();
}

/// `kill -9` of `sless dev` while captured changes stream into PostgreSQL:
/// after the restart the slot delivers again from its confirmed position,
/// so every change lands; what repeats is what was written and not yet
/// confirmed (changes are confirmed as they are written: a few batches),
/// never the stream from its start.
#[tokio::test]
async fn capture_survives_kill_9_mid_stream_from_the_confirmed_lsn() {
    const ROWS: i64 = 40_000;
    let db = db().await;
    let (src, dst) = (unique("cdc_kill_src"), unique("cdc_kill_dst"));
    db.batch_execute(&format!("CREATE TABLE {src} (id int PRIMARY KEY, payload text)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-kill");
    let name = flow_name("cdc-kill");
    let source = cdc(&[&src], json!({"batchSize": 50}));
    let sink = pg(&dst, json!({"autoCreateTable": true}));
    let (server, _) = running(&dir, &name, source, sink, json!({"channelBufferSize": 50})).await;
    // 40,000 rows in 800 transactions of 50.
    insert_in_transactions(&db, &src, ROWS, 50).await;
    let landed = format!("SELECT count(*) FROM {dst}");
    let at_kill = wait_mid_stream(&db, &landed, ROWS * 3 / 8, ROWS).await;
    server.kill9();

    let server = DevServer::start(&dir.0);
    let distinct = format!("SELECT count(DISTINCT (data->'after'->>'id')) FROM {dst}");
    wait_for(&db, &distinct, ROWS).await;
    let repeated = count(&db, &landed).await - ROWS;
    assert!(
        repeated <= 10 * 50,
        "{repeated} changes delivered twice of {at_kill} written before the kill: more than ten batches, \
         so not resumed from the position confirmed as they were written"
    );
    let a = server.client(TOKEN_A);
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {dst}")).await.unwrap();
}

/// A private PostgreSQL cluster with settings of its own, stopped on drop:
/// initdb and pg_ctl of the installed server, run as `postgres` when the
/// test runs as root.
struct PrivateCluster {
    dir: TempDir,
    port: u16,
}

fn as_postgres(program: &str) -> Command {
    let bin = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .and_then(|versions| versions.filter_map(Result::ok).map(|v| v.path()).max())
        .map(|v| v.join("bin").join(program))
        .expect("a PostgreSQL server under /usr/lib/postgresql");
    if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl PrivateCluster {
    /// Started with `settings` (`-c name=value …`).
    fn start(settings: &str) -> Self {
        let dir = TempDir::new("pg-replica");
        if running_as_root() {
            assert!(
                Command::new("chown")
                    .args(["-R", "postgres"])
                    .arg(&dir.0)
                    .status()
                    .unwrap()
                    .success()
            );
        }
        let data = dir.0.join("data");
        let out = as_postgres("initdb")
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = sless_testkit::free_port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 {settings}",
            dir.0.display()
        );
        let out = as_postgres("pg_ctl")
            .args(["-w", "-D"])
            .arg(&data)
            .args(["-o", &options, "-l"])
            .arg(dir.0.join("log"))
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { dir, port }
    }
}

impl PrivateCluster {
    /// Its connection string, and a client connected to it.
    async fn connect(&self) -> (String, tokio_postgres::Client) {
        let dsn = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let (client, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        (dsn, client)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = as_postgres("pg_ctl")
            .args(["-D"])
            .arg(self.dir.0.join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

#[tokio::test]
async fn a_server_without_logical_wal_is_a_clear_error() {
    // PostgreSQL's default.
    let cluster = PrivateCluster::start("-c wal_level=replica");
    let (dsn, client) = cluster.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-replica");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "no-logical",
        "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "t"}},
        "sink": pg(&unique("never"), json!({"autoCreateTable": true})),
    }))
    .await;
    let view = a.wait_for_phase("no-logical", "Error", Duration::from_secs(20)).await;
    let message = view["message"].as_str().unwrap();
    assert!(
        message.contains("wal_level = logical") && message.contains("replica"),
        "{message}"
    );
    let slots: i64 = client
        .query_one("SELECT count(*) FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "nothing was created");
}

/// A slot the server invalidated (its WAL removed past
/// `max_slot_wal_keep_size` while the dataflow was down) stops the
/// dataflow with that reason, instead of capturing on from a new slot and
/// skipping what was lost.
#[tokio::test]
async fn a_slot_the_server_invalidated_stops_the_dataflow_with_the_reason() {
    let cluster = PrivateCluster::start("-c wal_level=logical -c max_slot_wal_keep_size=1MB");
    let (dsn, client) = cluster.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int)")
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-lost");
    let source =
        json!({"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "t", "pollInterval": 1}});
    let sink =
        json!({"type": "postgresql", "config": {"connectionString": dsn, "table": "events", "autoCreateTable": true}});
    let (server, _) = running(&dir, "lost", source, sink, json!({})).await;
    client.batch_execute("INSERT INTO t VALUES (1)").await.unwrap();
    wait_for(&client, "SELECT count(*) FROM events", 1).await;

    // Down, while the server writes more WAL than the slot may hold back.
    server.kill9();
    client.batch_execute("INSERT INTO t VALUES (2)").await.unwrap();
    for i in 0..4 {
        client
            .batch_execute(&format!("INSERT INTO other VALUES ({i}); SELECT pg_switch_wal()"))
            .await
            .unwrap();
    }
    client.batch_execute("CHECKPOINT").await.unwrap();
    let status: Option<String> = client
        .query_one("SELECT wal_status FROM pg_replication_slots", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status.as_deref(), Some("lost"), "the server invalidated the slot");

    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let view = a.wait_for_phase("lost", "Error", Duration::from_secs(30)).await;
    let message = view["message"].as_str().unwrap();
    assert!(
        message.contains("invalidated") && message.contains("max_slot_wal_keep_size"),
        "{message}"
    );
    assert_eq!(
        count(&client, "SELECT count(*) FROM events").await,
        1,
        "nothing captured after the loss"
    );
}

/// Applies change events in order to rows by `id`: what a consumer of the
/// stream holds.
fn replay(events: &[Value]) -> std::collections::BTreeMap<i64, Value> {
    let mut rows = std::collections::BTreeMap::new();
    for e in events {
        match e["op"].as_str().unwrap() {
            "r" | "c" | "u" => {
                rows.insert(e["after"]["id"].as_i64().unwrap(), e["after"].clone());
            }
            "d" => {
                rows.remove(&e["before"]["id"].as_i64().unwrap());
            }
            other => panic!("unexpected op {other}"),
        }
    }
    rows
}

/// That replaying `events` gives `table`'s rows; on failure, says how they
/// differ (not the rows themselves: there are thousands).
async fn assert_replays_to(db: &tokio_postgres::Client, events: &[Value], table: &str) {
    let (replayed, rows) = (replay(events), table_rows(db, table).await);
    let differ: Vec<&i64> = replayed
        .keys()
        .chain(rows.keys())
        .filter(|id| replayed.get(id) != rows.get(id))
        .take(5)
        .collect();
    assert!(
        differ.is_empty(),
        "the {} events replay to {} rows where the table has {}; they differ at ids {differ:?}, e.g. {:?} vs {:?}",
        events.len(),
        replayed.len(),
        rows.len(),
        differ.first().and_then(|id| replayed.get(id)),
        differ.first().and_then(|id| rows.get(id)),
    );
}

/// The table's rows as events carry them.
async fn table_rows(db: &tokio_postgres::Client, table: &str) -> std::collections::BTreeMap<i64, Value> {
    db.query(&format!("SELECT id, row_to_json(t)::text FROM {table} t"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                i64::from(r.get::<_, i32>(0)),
                serde_json::from_str(r.get::<_, &str>(1)).unwrap(),
            )
        })
        .collect()
}

/// Transactions of inserts, updates and deletes on `table` (ids from
/// `first` up), one every few milliseconds until `stop`; the number made.
fn churn(
    table: String,
    first: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<i32> {
    tokio::spawn(async move {
        let db = db().await;
        let mut n = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let id = first + n;
            db.batch_execute(&format!(
                "BEGIN;
                 INSERT INTO {table} VALUES ({id}, 0, 'new');
                 UPDATE {table} SET v = v + 1, note = 'touched' WHERE id = {touched};
                 DELETE FROM {table} WHERE id = {gone};
                 COMMIT;",
                touched = 1 + (n * 7) % 5000,
                gone = 5001 + n,
            ))
            .await
            .unwrap();
            n += 1;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        n
    })
}

/// The initial snapshot: 10,000 rows already in the table arrive as `op: r`
/// events, consistent with the stream that follows: transactions committed
/// all the while (before the slot, during the snapshot's read, after it)
/// are never lost, each row is read at most once (one changed before its
/// chunk comes as the change, then as read), so replaying the events in
/// order gives the table.
#[tokio::test]
async fn a_snapshot_of_existing_rows_then_interleaved_transactions_replay_to_the_table() {
    const EXISTING: i32 = 10_000;
    let db = db().await;
    let (src, events) = (unique("cdc_snap_src"), unique("cdc_snap_events"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO {src} SELECT g, 0, 'old' FROM generate_series(1, {EXISTING}) g;"
    ))
    .await
    .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = churn(src.clone(), 100_000, stop.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dir = TempDir::new("df-cdc-snapshot");
    let name = flow_name("cdc-snap");
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let source = cdc(&[&src], json!({"batchSize": 500, "snapshotChunkSize": 1000}));
    let (_server, a) = snapshotting(&dir, &name, source, sink, json!({})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let transactions = writer.await.unwrap();
    assert!(transactions > 50, "only {transactions} transactions interleaved");
    // After the snapshot: its last chunk would read the row too.
    wait_snapshot_written(&db, &default_slot(&name)).await;
    db.batch_execute(&format!("INSERT INTO {src} VALUES (999999, 0, 'last')"))
        .await
        .unwrap();
    wait_for(
        &db,
        &format!("SELECT count(*) FROM {events} WHERE data->'after'->>'id' = '999999'"),
        1,
    )
    .await;
    let all = events_once(
        &db,
        &events,
        count(&db, &format!("SELECT count(*) FROM {events}")).await,
    )
    .await;
    let snapshot: Vec<&Value> = all.iter().filter(|e| e["op"] == "r").collect();
    let ids: std::collections::BTreeSet<i64> = snapshot.iter().map(|e| e["after"]["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), snapshot.len(), "no row twice in the snapshot");
    // Rows 1 to 5,000 are never deleted: each is read (one the churn
    // changed while its chunk was read, as of the chunk's end).
    let unread: Vec<i64> = (1..=5000).filter(|id| !ids.contains(id)).take(5).collect();
    assert!(unread.is_empty(), "rows never read: {unread:?}");
    assert_eq!(snapshot[0]["source"]["snapshot"], true);
    assert_eq!(snapshot[0]["source"]["table"], src.as_str());
    assert!(all.len() - snapshot.len() > 100, "changes streamed after the snapshot");
    assert_replays_to(&db, &all, &src).await;
    assert_eq!(
        publication_comment(&db, &default_slot(&name))
            .await
            .flatten()
            .as_deref(),
        Some(format!("made by sless dataflow {}", hex_digest(&format!("a/{name}"), 8)).as_str()),
        "the snapshot is marked written"
    );
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {events}")).await.unwrap();
}

/// `kill -9` while the snapshot's chunks are being written: the restarted
/// dataflow goes on from the chunk it was at (the checkpoint says which;
/// the exactly-once sink says whether the chunk out was written), not
/// from the start, while the changes made meanwhile (a delete of a row a
/// chunk wrote, too) stream in. Every row comes once as a snapshot row,
/// and the events replay to the table.
#[tokio::test]
async fn kill_9_in_the_snapshot_goes_on_from_its_chunk_and_loses_nothing() {
    const ROWS: i64 = 40_000;
    let db = db().await;
    let (src, dst) = (unique("cdc_snapkill_src"), unique("cdc_snapkill_dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO {src} SELECT g, 0, repeat('x', 200) FROM generate_series(1, {ROWS}) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-snapkill");
    let name = flow_name("cdc-snapkill");
    let source = cdc(&[&src], json!({"batchSize": 50, "snapshotChunkSize": 700}));
    let sink = pg(&dst, json!({"autoCreateTable": true}));
    let (server, _) = snapshotting(&dir, &name, source, sink, json!({"channelBufferSize": 50})).await;
    let landed = format!("SELECT count(*) FROM {dst}");
    wait_mid_stream(&db, &landed, ROWS / 4, ROWS).await;
    server.kill9();
    let before_restart = count(&db, &landed).await;
    let publication = default_slot(&name);
    assert!(
        publication_comment(&db, &publication)
            .await
            .flatten()
            .unwrap()
            .ends_with("; snapshot pending")
    );
    db.batch_execute(&format!(
        "UPDATE {src} SET v = 1 WHERE id <= 10; DELETE FROM {src} WHERE id = 11; INSERT INTO {src} VALUES ({}, 0, 'late')",
        ROWS + 1
    ))
    .await
    .unwrap();

    let server = DevServer::start(&dir.0);
    wait_snapshot_written(&db, &publication).await;
    wait_for(
        &db,
        &format!(
            "SELECT count(*) FROM {dst} WHERE data->>'op' = 'c' AND data->'after'->>'id' = '{}'",
            ROWS + 1
        ),
        1,
    )
    .await;
    let all = events_once(&db, &dst, count(&db, &landed).await).await;
    let snapshot_ids: Vec<i64> = all
        .iter()
        .filter(|e| e["op"] == "r")
        .map(|e| e["after"]["id"].as_i64().unwrap())
        .collect();
    let once: std::collections::BTreeSet<i64> = snapshot_ids.iter().copied().collect();
    assert_eq!(
        once.len(),
        snapshot_ids.len(),
        "a snapshot row came twice: it started over"
    );
    assert!(before_restart > 0 && once.len() as i64 >= ROWS - 1);
    assert_replays_to(&db, &all, &src).await;
    let a = server.client(TOKEN_A);
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {dst}")).await.unwrap();
}

/// `snapshot: never` streams changes from the slot's creation only;
/// `snapshot: initial_only` reads the rows, keeps no slot (no WAL held),
/// captures no change, and does not read the rows again after a restart.
#[tokio::test]
async fn snapshot_never_and_initial_only() {
    let db = db().await;
    let (src, never_events, only_events) = (unique("cdc_modes"), unique("cdc_never"), unique("cdc_only"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY); INSERT INTO {src} VALUES (1), (2), (3);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-modes");
    let (never, only) = (flow_name("cdc-never"), flow_name("cdc-only"));
    let (server, a) = running(
        &dir,
        &never,
        cdc(&[&src], json!({"snapshot": "never"})),
        pg(&never_events, json!({"autoCreateTable": true})),
        json!({}),
    )
    .await;
    a.create_dataflow(
        json!({"name": only, "source": cdc(&[&src], json!({"snapshot": "initial_only"})),
                              "sink": pg(&only_events, json!({"autoCreateTable": true}))}),
    )
    .await;
    a.wait_for_phase(&only, "Running", Duration::from_secs(30)).await;
    let snapshot = events_once(&db, &only_events, 3).await;
    assert!(snapshot.iter().all(|e| e["op"] == "r"));
    let written = format!("made by sless dataflow {}", hex_digest(&format!("a/{only}"), 8));
    let deadline = Instant::now() + Duration::from_secs(10);
    while publication_comment(&db, &default_slot(&only))
        .await
        .flatten()
        .as_deref()
        != Some(written.as_str())
    {
        assert!(
            Instant::now() < deadline,
            "the initial_only snapshot never marked written"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.batch_execute(&format!("INSERT INTO {src} VALUES (4)"))
        .await
        .unwrap();
    let changes = events_once(&db, &never_events, 1).await;
    assert_eq!(changes[0]["op"], "c");
    assert_eq!(changes[0]["after"]["id"], 4);
    let (slots, _) = slots_and_publications(&db).await;
    assert!(slots.contains(&default_slot(&never)));
    assert!(!slots.contains(&default_slot(&only)), "initial_only holds no slot");

    server.kill9();
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.wait_for_phase(&only, "Running", Duration::from_secs(30)).await;
    db.batch_execute(&format!("INSERT INTO {src} VALUES (5)"))
        .await
        .unwrap();
    events_once(&db, &never_events, 2).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {only_events}")).await,
        3,
        "initial_only read the rows once and captured nothing after"
    );
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {never_events}")).await,
        2,
        "never: the two inserts after its slot, nothing before"
    );
    for name in [&never, &only] {
        assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    }
    db.batch_execute(&format!("DROP TABLE {src}, {never_events}, {only_events}"))
        .await
        .unwrap();
}

/// The replication connection takes the connection string's TLS as every
/// connector's does: over `verify-full` to a server whose certificate names
/// the host, changes flow; a certificate naming another host is refused
/// and the dataflow says so. (The TLS end is a test proxy in front of the
/// local PostgreSQL: see `common/pg_tls.rs`.)
#[tokio::test]
async fn capture_over_tls_verify_full_and_a_misnamed_certificate_refused() {
    let db = db().await;
    let (table, events) = (unique("cdc_tls"), unique("cdc_tls_events"));
    db.batch_execute(&format!("CREATE TABLE {table} (id int PRIMARY KEY)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-tls");
    let (server, misnamed) = crate::common::pg_tls::named_and_misnamed(&dir.0).await;
    let tls = |port: u16| {
        json!({"type": "postgresql-cdc", "config": {
            "connectionString": format!("postgres://postgres@localhost:{port}/test?sslmode=verify-full&sslrootcert=ca.pem"),
            "table": table}})
    };
    let name = flow_name("cdc-tls");
    let (_server, a) = running(
        &dir,
        &name,
        tls(server.port),
        pg(&events, json!({"autoCreateTable": true})),
        json!({}),
    )
    .await;
    db.batch_execute(&format!("INSERT INTO {table} VALUES (7)"))
        .await
        .unwrap();
    let got = events_once(&db, &events, 1).await;
    assert_eq!(got[0]["after"]["id"], 7);
    let (slots, _) = slots_and_publications(&db).await;
    assert!(slots.contains(&default_slot(&name)));

    let refused = flow_name("cdc-tls-misnamed");
    a.create_dataflow(json!({"name": refused, "source": tls(misnamed.port),
                              "sink": pg(&events, json!({"autoCreateTable": true}))}))
        .await;
    a.wait_for_phase(&refused, "Error", Duration::from_secs(15)).await;
    for name in [&name, &refused] {
        assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    }
    db.batch_execute(&format!("DROP TABLE {table}, {events}"))
        .await
        .unwrap();
}

/// A transaction larger than the server's `logical_decoding_work_mem`
/// (64kB here, set by the connection string's `options`) is streamed by
/// the server while it runs (pgoutput protocol 2): its changes are kept
/// (over a MiB of them: in a file) until its commit and come as one
/// transaction in commit order, after the small transactions that
/// committed while it ran; a subtransaction it rolled back and a large
/// transaction that aborted leave nothing. The server's own statistics
/// show that it streamed.
#[tokio::test]
async fn a_transaction_streamed_while_in_progress_arrives_at_its_commit_without_what_aborted() {
    let db = db().await;
    let (src, events) = (unique("cdc_streamed"), unique("cdc_streamed_events"));
    db.batch_execute(&format!("CREATE TABLE {src} (id int PRIMARY KEY, payload text)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-streamed");
    let name = flow_name("cdc-streamed");
    let source = json!({"type": "postgresql-cdc", "config": {
        "connectionString": format!("{}?options=-c%20logical_decoding_work_mem%3D64kB", dsn()),
        "table": src, "batchSize": 500}});
    let (_server, a) = running(
        &dir,
        &name,
        source,
        pg(&events, json!({"autoCreateTable": true})),
        json!({}),
    )
    .await;

    let big = db_connection().await;
    big.batch_execute(&format!(
        "BEGIN;
         INSERT INTO {src} SELECT g, repeat('x', 200) FROM generate_series(1, 6000) g;
         SAVEPOINT s;
         INSERT INTO {src} SELECT g, repeat('y', 200) FROM generate_series(10001, 11000) g;
         ROLLBACK TO SAVEPOINT s;"
    ))
    .await
    .unwrap();
    for id in 30001..30021 {
        db.batch_execute(&format!("INSERT INTO {src} VALUES ({id}, 'small')"))
            .await
            .unwrap();
    }
    big.batch_execute(&format!(
        "UPDATE {src} SET payload = 'updated' WHERE id <= 10; COMMIT;
         BEGIN; INSERT INTO {src} SELECT g, repeat('z', 200) FROM generate_series(20001, 23000) g; ROLLBACK;"
    ))
    .await
    .unwrap();
    db.batch_execute(&format!("INSERT INTO {src} VALUES (99999, 'last')"))
        .await
        .unwrap();
    wait_for(
        &db,
        &format!("SELECT count(*) FROM {events} WHERE data->'after'->>'id' = '99999'"),
        1,
    )
    .await;
    let all = events_once(
        &db,
        &events,
        count(&db, &format!("SELECT count(*) FROM {events}")).await,
    )
    .await;
    assert_eq!(all.len(), 6000 + 20 + 10 + 1, "no change of what aborted");
    let ids: Vec<i64> = all.iter().map(|e| e["after"]["id"].as_i64().unwrap()).collect();
    assert!(
        ids[..20].iter().all(|id| (30001..30021).contains(id)),
        "the small transactions first: they committed first"
    );
    assert!(
        ids[20..6030].iter().all(|id| (1..=6000).contains(id)),
        "then the large one, whole"
    );
    assert_eq!(ids[6030], 99999);
    assert_replays_to(&db, &all, &src).await;
    let streamed: i64 = db
        .query_one(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = $1",
            &[&default_slot(&name)],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        streamed >= 1,
        "the server streamed no transaction: the test does not test streaming"
    );
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {events}")).await.unwrap();
}

/// A second connection of its own.
async fn db_connection() -> tokio_postgres::Client {
    db().await
}

/// Keepalives answered: on a server whose `wal_sender_timeout` is 2 s, a
/// source idle for five times that keeps its replication connection (the
/// same walsender process, never ended by the server for silence), and a
/// change made then still arrives on it.
#[tokio::test]
async fn an_idle_stream_answers_keepalives_within_a_short_wal_sender_timeout() {
    let cluster = PrivateCluster::start("-c wal_level=logical -c wal_sender_timeout=2s");
    let (dsn, client) = cluster.connect().await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY)")
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-keepalive");
    let source = json!({"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "t"}});
    let sink =
        json!({"type": "postgresql", "config": {"connectionString": dsn, "table": "events", "autoCreateTable": true}});
    let (_server, _) = running(&dir, "keepalive", source, sink, json!({})).await;
    let walsender = || async {
        client
            .query_opt("SELECT pid FROM pg_stat_replication", &[])
            .await
            .unwrap()
            .map(|r| r.get::<_, i32>(0))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(pid) = walsender().await {
            break pid;
        }
        assert!(Instant::now() < deadline, "no replication connection");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        walsender().await,
        Some(first),
        "the server ended the idle replication connection"
    );
    client.batch_execute("INSERT INTO t VALUES (1)").await.unwrap();
    wait_for(&client, "SELECT count(*) FROM events", 1).await;
    assert_eq!(walsender().await, Some(first));
}

/// A table dropped from `tables` (an update, which restarts the dataflow
/// and sets the publication's tables) is no longer captured; the other
/// table flows on with none of its changes lost across the restart.
#[tokio::test]
async fn a_table_dropped_from_the_dataflow_is_no_longer_captured() {
    let db = db().await;
    let (kept, dropped, events) = (unique("cdc_kept"), unique("cdc_dropped"), unique("cdc_dropped_events"));
    db.batch_execute(&format!(
        "CREATE TABLE {kept} (id int PRIMARY KEY); CREATE TABLE {dropped} (id int PRIMARY KEY);"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-dropped");
    let name = flow_name("cdc-dropped");
    let sink = pg(&events, json!({"autoCreateTable": true}));
    let (_server, a) = running(&dir, &name, cdc(&[&kept, &dropped], json!({})), sink, json!({})).await;
    db.batch_execute(&format!(
        "INSERT INTO {kept} VALUES (1); INSERT INTO {dropped} VALUES (1)"
    ))
    .await
    .unwrap();
    events_once(&db, &events, 2).await;

    let (status, body) = a
        .patch(
            &format!("/api/v1/dataflows/{name}"),
            json!({"source": cdc(&[&kept], json!({}))}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Written while the dataflow restarts, and after.
    db.batch_execute(&format!(
        "INSERT INTO {kept} VALUES (2); INSERT INTO {dropped} VALUES (2)"
    ))
    .await
    .unwrap();
    a.wait_for_phase(&name, "Running", Duration::from_secs(30)).await;
    db.batch_execute(&format!(
        "INSERT INTO {dropped} VALUES (3); INSERT INTO {kept} VALUES (3)"
    ))
    .await
    .unwrap();
    let of_kept = format!("SELECT count(*) FROM {events} WHERE data->'source'->>'table' = '{kept}'");
    wait_for(&db, &of_kept, 3).await;
    let of_dropped = format!(
        "SELECT count(*) FROM {events} WHERE data->'source'->>'table' = '{dropped}' AND data->'after'->>'id' = '3'"
    );
    assert_eq!(
        count(&db, &of_dropped).await,
        0,
        "a change of the dropped table was captured"
    );
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {kept}, {dropped}, {events}"))
        .await
        .unwrap();
}

/// The files in `dir` (none where it does not exist).
fn files_in(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| entries.count())
}

/// N4 of the attack run: each run spilled streamed transactions into a new
/// `/tmp/sless-cdc-<slot>-<random>` that only a clean stop removed: after
/// two `kill -9` three copies of one transaction were on disk, and two
/// stayed after the dataflow was deleted. Now a dataflow spills into its
/// own directory under the data directory, emptied when its source opens
/// and removed with the dataflow. The transaction here stays open across
/// both kills, so each run spills it again from its start.
#[tokio::test]
async fn a_streamed_transactions_spill_outlives_neither_a_kill_nor_the_dataflow() {
    let db = db().await;
    let (src, events) = (unique("cdc_spill"), unique("cdc_spill_events"));
    db.batch_execute(&format!("CREATE TABLE {src} (id int PRIMARY KEY, payload text)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-cdc-spill");
    let name = flow_name("cdc-spill");
    let source = json!({"type": "postgresql-cdc", "config": {
        "connectionString": format!("{}?options=-c%20logical_decoding_work_mem%3D64kB", dsn()),
        "table": src, "batchSize": 500}});
    let sink = pg(&events, json!({"autoCreateTable": true}));
    // A leftover of an earlier release, under the system's temporary directory.
    let slot = format!("sless_{}", hex_digest(&format!("a/{name}"), 10));
    let old = std::env::temp_dir().join(format!("sless-cdc-{slot}-12345"));
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("7.1"), b"an old run's rows").unwrap();
    let (server, _) = running(&dir, &name, source, sink, json!({})).await;
    let spill = sless_dataflow::budget::spill_dir(&dir.0.join("spill"), &format!("a/{name}"));

    // About 8 MB of changes in one transaction, left open.
    let big = db_connection().await;
    big.batch_execute(&format!(
        "BEGIN; INSERT INTO {src} SELECT g, repeat('x', 1000) FROM generate_series(1, 8000) g;"
    ))
    .await
    .unwrap();
    let spilled = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while files_in(&spill) == 0 {
            assert!(Instant::now() < deadline, "nothing spilled to {}", spill.display());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    spilled().await;
    assert!(
        !old.exists(),
        "an earlier release's spill of this slot is removed when the source opens"
    );
    let mut server = server;
    for _ in 0..2 {
        server.kill9();
        server = DevServer::start(&dir.0);
        // The source opens afresh: the directory holds this run's file only.
        spilled().await;
        assert_eq!(files_in(&spill), 1, "one file for the one transaction");
    }
    big.batch_execute("COMMIT").await.unwrap();
    wait_for(&db, &format!("SELECT count(*) FROM {events}"), 8000).await;
    assert_eq!(files_in(&spill), 0, "the committed transaction's file is gone");
    let a = server.client(TOKEN_A);
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    let deadline = Instant::now() + Duration::from_secs(15);
    while spill.exists() {
        assert!(Instant::now() < deadline, "the spill directory outlived the dataflow");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("sless-cdc-{slot}"))
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    db.batch_execute(&format!("DROP TABLE {src}, {events}")).await.unwrap();
}
