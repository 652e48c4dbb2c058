//! `postgresql-cdc` → `postgresql` with `applyChanges`, run by `sless dev`
//! on the local PostgreSQL: after a random workload the sink table equals
//! the source table, row by row, value by value.

use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;

use crate::common::pg::{count, db, dsn, pg, unique};
use crate::common::{DevServer, TOKEN_A, TempDir};

/// The rows of `a` missing from `b` and of `b` missing from `a`, compared
/// as JSON text (so `1.10` differs from `1.1`, and key order counts).
fn differences(a: &str, b: &str) -> String {
    format!(
        "SELECT count(*) FROM ((SELECT row_to_json(x)::text FROM {a} x EXCEPT ALL SELECT row_to_json(y)::text FROM {b} y) \
         UNION ALL (SELECT row_to_json(y)::text FROM {b} y EXCEPT ALL SELECT row_to_json(x)::text FROM {a} x)) d"
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
        format!("'{{\"k\": {k}, \"a\": [1, null, \"x\"], \"o\": {{}}}}'"),
        format!("ARRAY['a', 'b{k}', NULL]"),
        bytes,
        "gen_random_uuid()".to_owned(),
        format!("E'it''s \\\\ {k} ünï'"),
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

const COLUMNS: [&str; 7] = ["n", "ts", "doc", "tags", "raw", "u", "note"];

/// 50,000 random changes (inserts, updates of some columns and of the
/// key, updates that leave a TOASTed value alone, deletes, NULLs, one
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
        "CREATE TABLE {src} (id int PRIMARY KEY, n numeric(30, 10), ts timestamptz, doc jsonb, tags text[], \
           raw bytea, u uuid, note text, big text);
         CREATE TABLE {dst} (LIKE {src} INCLUDING ALL);
         INSERT INTO {src} SELECT g, g * 1.5, now(), jsonb_build_object('g', g), ARRAY['s'], '\\x01', \
           gen_random_uuid(), 'snapshot', {BIG} FROM generate_series(1, 500) g;"
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
    db.batch_execute(&format!("DROP TABLE {src}, {dst}")).await.unwrap();
}
