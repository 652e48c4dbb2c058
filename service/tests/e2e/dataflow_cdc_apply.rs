//! `postgresql-cdc` → `postgresql` with `applyChanges`, run by `sless dev`
//! on the local PostgreSQL: after a random workload the sink table equals
//! the source table, row by row, value by value.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::common::pg::{count, db, dsn, pg, unique};
use crate::common::{DevServer, TOKEN_A, TempDir};

/// The rows of `a` missing from `b` and of `b` missing from `a`, compared
/// as JSON text (so `1.10` differs from `1.1`, and key order counts) and
/// as the row's own text (where a jsonb `null` is not NULL).
fn differences(a: &str, b: &str) -> String {
    format!(
        "SELECT count(*) FROM ((SELECT row_to_json(x)::text, x::text FROM {a} x \
           EXCEPT ALL SELECT row_to_json(y)::text, y::text FROM {b} y) \
         UNION ALL (SELECT row_to_json(y)::text, y::text FROM {b} y \
           EXCEPT ALL SELECT row_to_json(x)::text, x::text FROM {a} x)) d"
    )
}

/// A random value for each column but the key, NULL now and then.
fn values(rng: &mut impl Rng, k: u32) -> Vec<String> {
    let numeric = match rng.random_range(0..3) {
        0 => format!("'{}.{:0<4}'", rng.random_range(0..100_000), rng.random_range(0..100)),
        1 => format!(
            "'{}{:010}.{:010}'",
            rng.random_range(1..99_999),
            rng.random::<u32>(),
            rng.random::<u32>()
        ),
        _ => "'1.10'".to_owned(),
    };
    let bytes = format!("'\\x00ff{:08x}'::bytea", rng.random::<u32>());
    let texts = [
        numeric,
        format!("'2026-01-01 00:00:00+00'::timestamptz + interval '{k} seconds 123456 microseconds'"),
        // JSON's null now and then: not NULL in the sink either.
        match rng.random_ratio(1, 5) {
            true => "'null'".to_owned(),
            false => format!("'{{\"k\": {k}, \"a\": [1, null, \"x\"], \"o\": {{}}}}'"),
        },
        format!("ARRAY['a', 'b{k}', NULL]"),
        bytes,
        "gen_random_uuid()".to_owned(),
        format!("E'it''s \\\\ {k} ünï'"),
        // A domain over jsonb: read as jsonb is, its JSON null too.
        match rng.random_ratio(1, 4) {
            true => "'null'".to_owned(),
            false => format!("'[{k}, {{\"d\": true}}]'"),
        },
    ];
    texts
        .into_iter()
        .map(|text| {
            if rng.random_ratio(1, 10) {
                "NULL".to_owned()
            } else {
                text
            }
        })
        .collect()
}

/// A large value stored out of line (TOAST): random hex, too long to stay
/// in the row even compressed.
const BIG: &str = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))";

const COLUMNS: [&str; 8] = ["n", "ts", "doc", "tags", "raw", "u", "note", "dd"];

/// 50,000 random changes (inserts, updates of some columns and of the
/// key, updates that leave a TOASTed value alone, deletes, NULLs and jsonb
/// `null`s (not NULL), one
/// TRUNCATE) on a table of numeric, timestamptz, jsonb, text[], bytea,
/// uuid and text columns, captured from a table that had rows already (a
/// snapshot first) and applied by key: the sink ends equal to the source.
#[tokio::test]
async fn a_random_workload_applied_by_key_leaves_the_sink_equal_to_the_source() {
    const TRANSACTIONS: u32 = 50;
    const OPS: u32 = 1000;
    let db = db().await;
    let (src, dst) = (unique("apply_src"), unique("apply_dst"));
    db.batch_execute(&format!(
        "CREATE DOMAIN {src}_doc AS jsonb;
         CREATE TABLE {src} (id int PRIMARY KEY, n numeric(30, 10), ts timestamptz, doc jsonb, tags text[], \
           raw bytea, u uuid, note text, dd {src}_doc, big text);
         CREATE TABLE {dst} (LIKE {src} INCLUDING ALL);
         INSERT INTO {src} SELECT g, g * 1.5, now(), \
           CASE g % 3 WHEN 0 THEN 'null'::jsonb WHEN 1 THEN jsonb_build_object('g', g) END, ARRAY['s'], '\\x01', \
           gen_random_uuid(), 'snapshot', CASE g % 2 WHEN 0 THEN 'null' ELSE jsonb_build_array(g) END, {BIG} \
           FROM generate_series(1, 500) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-apply");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("apply-{}", rand::random::<u32>());
    a.create_dataflow(json!({
        "name": name,
        "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn(), "tables": [src], "pollInterval": 1}},
        "sink": pg(&dst, json!({"applyChanges": true})),
    }))
    .await;
    a.wait_for_phase(&name, "Running", Duration::from_secs(30)).await;

    let mut rng = rand::rng();
    let mut live: Vec<u32> = (1..=500).collect();
    let mut next = 501;
    for t in 0..TRANSACTIONS {
        let mut sql = String::from("BEGIN;");
        if t == TRANSACTIONS / 2 {
            sql.push_str(&format!("TRUNCATE {src};"));
            live.clear();
        }
        for _ in 0..OPS {
            let pick = |rng: &mut rand::rngs::ThreadRng, live: &Vec<u32>| live[rng.random_range(0..live.len())];
            match rng.random_range(0..100) {
                _ if live.len() < 50 => {
                    let v = values(&mut rng, next);
                    sql.push_str(&format!("INSERT INTO {src} VALUES ({next}, {}, {BIG});", v.join(", ")));
                    live.push(next);
                    next += 1;
                }
                0..30 => {
                    let v = values(&mut rng, next);
                    let big = if rng.random_ratio(1, 5) { "NULL" } else { BIG };
                    sql.push_str(&format!("INSERT INTO {src} VALUES ({next}, {}, {big});", v.join(", ")));
                    live.push(next);
                    next += 1;
                }
                30..65 => {
                    // Some columns, never the TOASTed one: it is left out of the event.
                    let id = pick(&mut rng, &live);
                    let v = values(&mut rng, id);
                    let set: Vec<String> = COLUMNS
                        .iter()
                        .zip(&v)
                        .filter(|_| rng.random_ratio(1, 3))
                        .map(|(c, v)| format!("{c} = {v}"))
                        .collect();
                    let set = if set.is_empty() {
                        "note = 'touched'".to_owned()
                    } else {
                        set.join(", ")
                    };
                    sql.push_str(&format!("UPDATE {src} SET {set} WHERE id = {id};"));
                }
                65..75 => {
                    let id = pick(&mut rng, &live);
                    sql.push_str(&format!("UPDATE {src} SET big = {BIG} WHERE id = {id};"));
                }
                75..85 => {
                    // The key changes; the TOASTed value stays with the row.
                    let i = rng.random_range(0..live.len());
                    sql.push_str(&format!(
                        "UPDATE {src} SET id = {next}, note = 'moved' WHERE id = {};",
                        live[i]
                    ));
                    live[i] = next;
                    next += 1;
                }
                _ => {
                    let i = rng.random_range(0..live.len());
                    sql.push_str(&format!("DELETE FROM {src} WHERE id = {};", live.swap_remove(i)));
                }
            }
        }
        sql.push_str("COMMIT;");
        db.batch_execute(&sql).await.unwrap();
    }

    let differ = differences(&src, &dst);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = count(&db, &differ).await;
        if left == 0 {
            break;
        }
        let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
        assert!(
            Instant::now() < deadline,
            "{left} rows differ after 180 s; the dataflow: {view}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {dst}")).await,
        live.len() as i64
    );
    assert!(
        count(
            &db,
            &format!("SELECT count(*) FROM {dst} WHERE note = 'moved' AND length(big) > 6000")
        )
        .await
            > 0,
        "moved rows kept their TOASTed value"
    );
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {dst}; DROP DOMAIN {src}_doc"))
        .await
        .unwrap();
}

/// Waits until `sql` (a count of differing rows) is 0, showing the
/// dataflow's view if it never is.
async fn wait_equal(db: &tokio_postgres::Client, a: &crate::common::Client, name: &str, sql: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = count(db, sql).await;
        if left == 0 {
            return;
        }
        let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
        assert!(
            Instant::now() < deadline,
            "{left} rows differ after 60 s; the dataflow: {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for the phase `Error` with a message holding `words`.
async fn wait_for_error(a: &crate::common::Client, name: &str, words: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
        let message = view["message"].as_str().unwrap_or_default().to_owned();
        if view["phase"] == "Error" && message.contains(words) {
            return message;
        }
        assert!(Instant::now() < deadline, "{name} never stopped on {words:?}: {view}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One flow captures two tables and routes each to its own sink table;
/// then the source's schema changes under it. A column added to the source
/// stops the flow with the column's name in its status (its values are
/// never dropped) until the sink has the column; a widened type's larger
/// value stops it until the sink's column is widened; a dropped column
/// leaves the sink's column with the values it had. The sinks then equal
/// the sources.
#[tokio::test]
async fn several_tables_route_to_their_sinks_and_schema_changes_stop_or_follow() {
    let db = db().await;
    let (src_a, dst_a, src_b, dst_b) = (
        unique("schema_src_a"),
        unique("schema_dst_a"),
        unique("schema_src_b"),
        unique("schema_dst_b"),
    );
    db.batch_execute(&format!(
        "CREATE TABLE {src_a} (id int PRIMARY KEY, name text, n int);
         CREATE TABLE {dst_a} (LIKE {src_a} INCLUDING ALL);
         CREATE TABLE {src_b} (id int PRIMARY KEY, v text);
         CREATE TABLE {dst_b} (LIKE {src_b} INCLUDING ALL);
         INSERT INTO {src_a} SELECT g, 'a' || g, g FROM generate_series(1, 20) g;
         INSERT INTO {src_b} SELECT g, 'b' || g FROM generate_series(1, 30) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-schema");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("schema-{}", rand::random::<u32>());
    a.create_dataflow(json!({
        "name": name,
        "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn(), "tables": [src_a, src_b]}},
        "transformations": [{"type": "router", "config": {"routes": [
            {"condition": format!("$.source.table == '{src_b}'"), "sink": pg(&dst_b, json!({"applyChanges": true}))},
        ]}}],
        "sink": pg(&dst_a, json!({"applyChanges": true})),
    }))
    .await;
    let (same_a, same_b) = (differences(&src_a, &dst_a), differences(&src_b, &dst_b));
    db.batch_execute(&format!(
        "INSERT INTO {src_b} VALUES (31, 'b31'); UPDATE {src_a} SET name = 'changed' WHERE id = 3; \
         DELETE FROM {src_b} WHERE id = 1;"
    ))
    .await
    .unwrap();
    wait_equal(&db, &a, &name, &same_a).await;
    wait_equal(&db, &a, &name, &same_b).await;

    // A column added to the source: refused, named, until the sink has it.
    db.batch_execute(&format!(
        "ALTER TABLE {src_a} ADD COLUMN extra text; \
         INSERT INTO {src_a} VALUES (100, 'new', 100, 'kept'); UPDATE {src_a} SET extra = 'e' WHERE id = 1;"
    ))
    .await
    .unwrap();
    let message = wait_for_error(&a, &name, "\"extra\"").await;
    assert!(message.contains(&dst_a), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        count(&db, &format!("SELECT count(*) FROM {dst_a} WHERE id = 100")).await,
        0,
        "nothing from the change on is written without its column"
    );
    db.batch_execute(&format!("ALTER TABLE {dst_a} ADD COLUMN extra text"))
        .await
        .unwrap();
    wait_equal(&db, &a, &name, &same_a).await;
    a.wait_for_phase(&name, "Running", Duration::from_secs(30)).await;

    // A widened type: its larger values wait for the sink's column.
    db.batch_execute(&format!(
        "ALTER TABLE {src_a} ALTER COLUMN n TYPE bigint; UPDATE {src_a} SET n = 10000000000 WHERE id = 2;"
    ))
    .await
    .unwrap();
    wait_for_error(&a, &name, "out of range").await;
    db.batch_execute(&format!("ALTER TABLE {dst_a} ALTER COLUMN n TYPE bigint"))
        .await
        .unwrap();
    wait_equal(&db, &a, &name, &same_a).await;

    // A dropped column stays in the sink with the values it had.
    db.batch_execute(&format!(
        "ALTER TABLE {src_a} DROP COLUMN name; INSERT INTO {src_a} VALUES (101, 5, 'z'); \
         UPDATE {src_a} SET n = 6 WHERE id = 1; INSERT INTO {src_b} VALUES (32, 'b32');"
    ))
    .await
    .unwrap();
    let kept = format!("(SELECT id, n, extra FROM {dst_a})");
    wait_equal(&db, &a, &name, &differences(&src_a, &kept)).await;
    wait_equal(&db, &a, &name, &same_b).await;
    assert_eq!(
        count(
            &db,
            &format!("SELECT count(*) FROM {dst_a} WHERE id = 1 AND name = 'a1'")
        )
        .await,
        1
    );
    a.wait_for_phase(&name, "Running", Duration::from_secs(30)).await;
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src_a}, {dst_a}, {src_b}, {dst_b}"))
        .await
        .unwrap();
}

/// The snapshot in chunks of 100 rows while both tables change: a table
/// keyed by (text, int) with quotes, backslashes and non-ASCII in its keys
/// and a TOASTed column the concurrent updates leave alone (each chunk row
/// is handed out as of its high watermark, that value included), applied
/// by key: the sink ends equal to the source. A table without a primary
/// key is read by `ctid`: every row it ends with came as a snapshot row, an
/// insert or an update.
#[tokio::test]
async fn a_snapshot_in_chunks_reads_composite_and_keyless_tables_while_they_change() {
    let db = db().await;
    let (keyed, keyed_dst, keyless, events) = (
        unique("chunk_keyed"),
        unique("chunk_keyed_dst"),
        unique("chunk_keyless"),
        unique("chunk_events"),
    );
    db.batch_execute(&format!(
        "CREATE TABLE {keyed} (region text, n int, v int, big text, PRIMARY KEY (region, n));
         CREATE TABLE {keyed_dst} (LIKE {keyed} INCLUDING ALL);
         CREATE TABLE {keyless} (x int, note text); ALTER TABLE {keyless} REPLICA IDENTITY FULL;
         INSERT INTO {keyed} SELECT r, g, 0, {BIG} FROM generate_series(1, 1000) g,
           unnest(ARRAY['o''brien', 'back\\slash \"q\"', 'zürich']) r;
         INSERT INTO {keyless} SELECT g, 'old' FROM generate_series(1, 2000) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-chunks");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("chunks-{}", rand::random::<u32>());
    let source = json!({"type": "postgresql-cdc", "config": {
        "connectionString": dsn(), "tables": [keyed, keyless], "snapshotChunkSize": 100, "batchSize": 200}});
    a.create_dataflow(json!({
        "name": name,
        "source": source,
        "transformations": [{"type": "router", "config": {"routes": [
            {"condition": format!("$.source.table == '{keyed}'"), "sink": pg(&keyed_dst, json!({"applyChanges": true}))},
        ]}}],
        "sink": pg(&events, json!({"autoCreateTable": true})),
    }))
    .await;
    // Changes while the chunks are read, one transaction of 20 every few
    // milliseconds (so that chunks' windows catch some): updates leaving
    // the TOASTed value alone, key changes, deletes, inserts.
    let publication = format!(
        "SELECT count(*) FROM pg_publication WHERE obj_description(oid, 'pg_publication') LIKE '%pending' \
         AND pubname IN (SELECT pubname FROM pg_publication_tables WHERE tablename = '{keyless}')"
    );
    let (writer_keyed, writer_keyless) = (keyed.clone(), keyless.clone());
    let writer = tokio::spawn(async move {
        let db = crate::common::pg::db().await;
        let mut rng = rand::rngs::StdRng::from_os_rng();
        let mut t = 0;
        while t < 20 || count(&db, &publication).await > 0 && t < 400 {
            let mut sql = String::from("BEGIN;");
            for _ in 0..20 {
                let n = rng.random_range(1..=1000);
                let region = ["'o''brien'", "'zürich'"][rng.random_range(0..2)];
                sql.push_str(&match rng.random_range(0..10) {
                    0..6 => format!("UPDATE {writer_keyed} SET v = v + 1 WHERE region = {region} AND n = {n};"),
                    6 => format!("DELETE FROM {writer_keyed} WHERE region = {region} AND n = {n};"),
                    7 => format!(
                        "UPDATE {writer_keyed} SET n = n + 5000 + {t} * 1000 WHERE region = {region} AND n = {n};"
                    ),
                    8 => format!("UPDATE {writer_keyless} SET note = 'changed' WHERE x = {n};"),
                    _ => format!(
                        "INSERT INTO {writer_keyless} VALUES ({}, 'new');",
                        10_000 + t * 100 + n % 100
                    ),
                });
            }
            sql.push_str("COMMIT;");
            db.batch_execute(&sql).await.unwrap();
            t += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    writer.await.unwrap();
    let differ = differences(&keyed, &keyed_dst);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = count(&db, &differ).await;
        let written = count(
            &db,
            &format!(
                "SELECT count(*) FROM pg_publication WHERE obj_description(oid, 'pg_publication') NOT LIKE '%pending' \
                 AND pubname IN (SELECT pubname FROM pg_publication_tables WHERE tablename = '{keyless}')"
            ),
        )
        .await;
        if left == 0 && written == 1 {
            break;
        }
        let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
        assert!(
            Instant::now() < deadline,
            "{left} rows differ after 120 s; the dataflow: {view}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A row an update moved back to where the chunks had passed comes as
    // that update, whole (REPLICA IDENTITY FULL, which updates of a table
    // without a key need).
    let missing = format!(
        "SELECT count(*) FROM {keyless} k WHERE NOT EXISTS (SELECT 1 FROM {events} e \
         WHERE e.data->>'op' IN ('r', 'c', 'u') AND (e.data->'after'->>'x')::int = k.x)"
    );
    wait_for_zero(&db, &missing).await;
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {keyed}, {keyed_dst}, {keyless}, {events}"))
        .await
        .unwrap();
}

async fn wait_for_zero(db: &tokio_postgres::Client, sql: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(db, sql).await != 0 {
        assert!(Instant::now() < deadline, "{sql} never became 0");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A partitioned table (its changes come under its partitions' names)
/// snapshotted in chunks of 50 while rows move between partitions and
/// change without their TOASTed value, applied by key: the sink ends equal.
/// (A change that commits between a chunk's select and its high watermark
/// is rare here; the matching by partition is the unit tests'.)
#[tokio::test]
async fn a_partitioned_table_is_snapshotted_in_chunks_while_it_changes() {
    let db = db().await;
    let (src, dst) = (unique("chunk_parted"), unique("chunk_parted_dst"));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int, part int, v int, big text, PRIMARY KEY (id, part)) PARTITION BY LIST (part);
         CREATE TABLE {src}_a PARTITION OF {src} FOR VALUES IN (1);
         CREATE TABLE {src}_b PARTITION OF {src} FOR VALUES IN (2);
         CREATE TABLE {dst} (id int, part int, v int, big text, PRIMARY KEY (id, part));
         INSERT INTO {src} SELECT g, 1 + g % 2, 0, {BIG} FROM generate_series(1, 2000) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-parted");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("parted-{}", rand::random::<u32>());
    a.create_dataflow(json!({
        "name": name,
        "source": {"type": "postgresql-cdc", "config": {
            "connectionString": dsn(), "table": src, "snapshotChunkSize": 50, "batchSize": 100}},
        "sink": pg(&dst, json!({"applyChanges": true})),
    }))
    .await;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    for _ in 0..150 {
        let mut sql = String::from("BEGIN;");
        for _ in 0..10 {
            let id = rng.random_range(1..=2000);
            sql.push_str(&match rng.random_range(0..4) {
                0..2 => format!("UPDATE {src} SET v = v + 1 WHERE id = {id};"),
                2 => format!("DELETE FROM {src} WHERE id = {id};"),
                _ => format!("UPDATE {src} SET part = 3 - part WHERE id = {id};"),
            });
        }
        sql.push_str("COMMIT;");
        db.batch_execute(&sql).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    wait_equal(&db, &a, &name, &differences(&src, &dst)).await;
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    db.batch_execute(&format!("DROP TABLE {src}, {dst}")).await.unwrap();
}

/// Keys of arrays, jsonb (strings and numbers), 25-digit numerics,
/// timestamps and text with quotes go from chunk to chunk (each read back
/// as its column's type): every row comes once as a snapshot row.
#[tokio::test]
async fn keys_of_every_common_type_go_from_chunk_to_chunk() {
    let db = db().await;
    let events = unique("chunk_keys_events");
    let tables: Vec<(String, &str)> = vec![
        (unique("chunk_key_array"), "ARRAY[g, g % 3]"),
        (
            unique("chunk_key_jsonb"),
            "CASE WHEN g % 2 = 0 THEN to_jsonb(g) ELSE to_jsonb('s' || g) END",
        ),
        (
            unique("chunk_key_numeric"),
            "('1234567890123456789012345.' || lpad(g::text, 3, '0'))::numeric",
        ),
        (
            unique("chunk_key_time"),
            "'2026-01-01 00:00:00+00'::timestamptz + g * interval '1.000001 seconds'",
        ),
        (unique("chunk_key_text"), "'it''s \\ ' || g"),
    ];
    for (table, key) in &tables {
        let ty = match *key {
            k if k.starts_with("ARRAY") => "int[]",
            k if k.starts_with("CASE") => "jsonb",
            k if k.contains("numeric") => "numeric",
            k if k.contains("timestamptz") => "timestamptz",
            _ => "text",
        };
        db.batch_execute(&format!(
            "CREATE TABLE {table} (k {ty} PRIMARY KEY, v int);
             INSERT INTO {table} SELECT {key}, g FROM generate_series(1, 60) g;"
        ))
        .await
        .unwrap();
    }
    let dir = TempDir::new("df-cdc-keys");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("keys-{}", rand::random::<u32>());
    let names: Vec<&String> = tables.iter().map(|(t, _)| t).collect();
    a.create_dataflow(json!({
        "name": name,
        "source": {"type": "postgresql-cdc", "config": {
            "connectionString": dsn(), "tables": names, "snapshotChunkSize": 7}},
        "sink": pg(&events, json!({"autoCreateTable": true})),
    }))
    .await;
    let snapshot_rows = format!("SELECT count(*) FROM {events} WHERE data->>'op' = 'r'");
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&db, &snapshot_rows).await < 300 {
        let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
        assert!(
            Instant::now() < deadline,
            "not every snapshot row came; the dataflow: {view}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (table, _) in &tables {
        let distinct = format!(
            "SELECT count(DISTINCT data->'after'->>'k') FROM {events} WHERE data->>'op' = 'r' \
             AND data->'source'->>'table' = '{table}'"
        );
        assert_eq!(count(&db, &distinct).await, 60, "{table}");
    }
    assert_eq!(count(&db, &snapshot_rows).await, 300, "no row twice");
    assert_eq!(a.delete(&format!("/api/v1/dataflows/{name}")).await.0, 204);
    let all: Vec<&str> = tables.iter().map(|(t, _)| t.as_str()).collect();
    db.batch_execute(&format!("DROP TABLE {}, {events}", all.join(", ")))
        .await
        .unwrap();
}

/// A table is read again on request (`POST .../snapshots`) while the
/// stream goes on, and repairs a sink that lost rows; the table not asked
/// for is not read again. The request is kept by an update (as Terraform's
/// PUT sends it) and read once: after it, a damaged sink stays damaged.
/// Requests the source cannot take are refused at their field.
#[tokio::test]
async fn a_table_is_read_again_on_request_and_only_once() {
    let db = db().await;
    let (src_a, dst_a, src_b, dst_b) = (
        unique("again_src_a"),
        unique("again_dst_a"),
        unique("again_src_b"),
        unique("again_dst_b"),
    );
    db.batch_execute(&format!(
        "CREATE TABLE {src_a} (id int PRIMARY KEY, v int, big text);
         CREATE TABLE {dst_a} (LIKE {src_a} INCLUDING ALL);
         CREATE TABLE {src_b} (id int PRIMARY KEY, v int);
         CREATE TABLE {dst_b} (LIKE {src_b} INCLUDING ALL);
         INSERT INTO {src_a} SELECT g, 0, {BIG} FROM generate_series(1, 3000) g;
         INSERT INTO {src_b} SELECT g, 0 FROM generate_series(1, 500) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-cdc-again");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let name = format!("again-{}", rand::random::<u32>());
    let route = |src: &str, dst: &str| json!({"condition": format!("$.source.table == '{src}'"), "sink": pg(dst, json!({"applyChanges": true}))});
    let spec = json!({
        "source": {"type": "postgresql-cdc", "config": {
            "connectionString": dsn(), "tables": [src_a, src_b], "snapshotChunkSize": 200}},
        "transformations": [{"type": "router", "config": {"routes": [route(&src_a, &dst_a)]}}],
        "sink": pg(&dst_b, json!({"applyChanges": true})),
    });
    let mut created = spec.clone();
    created["name"] = json!(name);
    a.create_dataflow(created).await;
    wait_equal(&db, &a, &name, &differences(&src_a, &dst_a)).await;
    wait_equal(&db, &a, &name, &differences(&src_b, &dst_b)).await;

    // Both sinks lose rows (restored from an old backup, say).
    let damage = format!("DELETE FROM {dst_a} WHERE id % 3 = 0; DELETE FROM {dst_b} WHERE id % 5 = 0;");
    db.batch_execute(&damage).await.unwrap();
    let path = format!("/api/v1/dataflows/{name}/snapshots");
    let (status, request) = a.post(&path, json!({"tables": [src_a]})).await;
    assert_eq!(status, 202, "{request}");
    assert_eq!(request["tables"], json!([src_a]));
    // The stream goes on while the table is read: updates that leave the
    // TOASTed value alone, deletes, inserts.
    for round in 0..20 {
        db.batch_execute(&format!(
            "UPDATE {src_a} SET v = v + 1 WHERE id % 7 = {};
             DELETE FROM {src_a} WHERE id = {};
             INSERT INTO {src_a} VALUES ({}, {round}, 'new');",
            round % 7,
            round * 100 + 1,
            10_000 + round
        ))
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_equal(&db, &a, &name, &differences(&src_a, &dst_a)).await;
    let b_lost = count(&db, &differences(&src_b, &dst_b)).await;
    assert_eq!(b_lost, 100, "the table not asked for is not read again");
    let view = a.get(&format!("/api/v1/dataflows/{name}")).await.1;
    assert_eq!(view["snapshots"], json!([request]), "{view}");

    // An update keeps the request; the processor it restarts does not read
    // the table again: the sink stays damaged after a change flows through.
    let (status, view) = a.put(&format!("/api/v1/dataflows/{name}"), spec.clone()).await;
    assert_eq!((status, &view["snapshots"]), (200, &json!([request])), "{view}");
    db.batch_execute(&format!("DELETE FROM {dst_a} WHERE id % 3 = 0"))
        .await
        .unwrap();
    db.batch_execute(&format!("INSERT INTO {src_a} VALUES (20000, 0, 'marker')"))
        .await
        .unwrap();
    wait_for_zero(
        &db,
        &format!("SELECT count(*) FROM {src_a} s WHERE s.id = 20000 AND NOT EXISTS (SELECT 1 FROM {dst_a} d WHERE d.id = s.id)"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        count(&db, &differences(&src_a, &dst_a)).await > 0,
        "read again without a new request"
    );

    // Requests it cannot take, each refused at its field.
    for (body, field, words) in [
        (
            json!({"tables": ["public.nope"]}),
            "tables[0]",
            "not a table the source captures",
        ),
        (json!({"tables": []}), "tables", "at least one"),
        (json!({"tables": [src_b, src_b]}), "tables[1]", "twice"),
        (
            json!({"tables": [src_a, src_b, src_a]}),
            "tables",
            "names 3 tables; the source captures 2",
        ),
    ] {
        let (status, answer) = a.post(&path, body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let detail = &answer["error"];
        assert_eq!(detail["field"], field, "{answer}");
        assert!(
            detail["message"].as_str().unwrap_or_default().contains(words),
            "{answer}"
        );
    }
    assert_eq!(a.post(&path, json!({"tables": [src_a], "all": true})).await.0, 400);
    let other = server.client(crate::common::TOKEN_B);
    assert_eq!(
        other.post(&path, json!({"tables": [src_a]})).await.0,
        404,
        "another tenant's dataflow"
    );
    assert_eq!(
        a.post("/api/v1/dataflows/nope/snapshots", json!({"tables": [src_a]}))
            .await
            .0,
        404
    );
    let copy = format!("copy-{}", rand::random::<u32>());
    a.create_dataflow(json!({"name": copy, "source": pg(&src_b, json!({})), "sink": pg(&dst_b, json!({}))}))
        .await;
    let (status, answer) = a
        .post(
            &format!("/api/v1/dataflows/{copy}/snapshots"),
            json!({"tables": [src_b]}),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer.to_string().contains("only a postgresql-cdc source"), "{answer}");

    for flow in [&name, &copy] {
        assert_eq!(a.delete(&format!("/api/v1/dataflows/{flow}")).await.0, 204);
    }
    db.batch_execute(&format!("DROP TABLE {src_a}, {dst_a}, {src_b}, {dst_b}"))
        .await
        .unwrap();
}
