//! PostgreSQL helpers of the dataflow tests: a client of the test database
//! (`SLESS_TEST_PG`, default postgres://postgres@127.0.0.1/test), counting
//! and waiting, and connector specs.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub fn dsn() -> String {
    std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into())
}

pub async fn db() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", rand::random::<u32>())
}

/// A new table `{prefix}_N` of `rows` rows (`id serial`, a 200-byte
/// `payload`): a source long enough to be stopped mid-stream.
pub async fn bulk_table(db: &tokio_postgres::Client, prefix: &str, rows: i64) -> String {
    let table = unique(prefix);
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id serial PRIMARY KEY, payload text);
         INSERT INTO {table} (payload) SELECT repeat('x', 200) FROM generate_series(1, {rows});"
    ))
    .await
    .unwrap();
    table
}

/// A source of three rows, one of them (amount -5) refused by the new
/// destination's `positive` check: (source, destination).
pub async fn refusing_tables(db: &tokio_postgres::Client, prefix: &str) -> (String, String) {
    let (src, dst) = (unique(prefix), unique(&format!("{prefix}_dst")));
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, amount int);
         INSERT INTO {src} (amount) VALUES (1), (-5), (3);
         CREATE TABLE {dst} (id int PRIMARY KEY, amount int CONSTRAINT positive CHECK (amount > 0));"
    ))
    .await
    .unwrap();
    (src, dst)
}

/// Inserts rows 1 to `rows` (`id`, a 200-byte `payload`) into `table`, a
/// transaction of `per_transaction` rows each, committed one by one.
pub async fn insert_in_transactions(db: &tokio_postgres::Client, table: &str, rows: i64, per_transaction: i64) {
    db.batch_execute(&format!(
        "DO $$ BEGIN FOR t IN 0..{last} LOOP
           INSERT INTO {table} SELECT g, repeat('x', 200)
             FROM generate_series(t * {per_transaction} + 1, t * {per_transaction} + {per_transaction}) g;
           COMMIT;
         END LOOP; END $$;",
        last = rows / per_transaction - 1
    ))
    .await
    .unwrap();
}

pub async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.map(|r| r.get(0)).unwrap_or(-1)
}

pub async fn wait_for(db: &tokio_postgres::Client, sql: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = -1;
    while Instant::now() < deadline {
        got = count(db, sql).await;
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{sql}: wanted {want}, got {got}");
}

/// Waits until `sql` counts more than `above`, and checks it has not yet
/// reached `total` (the work is still under way): the count seen.
pub async fn wait_mid_stream(db: &tokio_postgres::Client, sql: &str, above: i64, total: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = count(db, sql).await;
        if n > above {
            assert!(n < total, "{sql}: all {total} done already; make the stream longer");
            return n;
        }
        assert!(Instant::now() < deadline, "{sql}: stuck at {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The dataflow's view once its counters satisfy `ready` (within 10 s).
pub async fn settled_view(client: &super::Client, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = client.get(&format!("/api/v1/dataflows/{name}")).await.1;
        if ready(&view["counters"]) || Instant::now() >= deadline {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn pg(table: &str, extra: Value) -> Value {
    let mut config = json!({"connectionString": dsn(), "table": table});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"type": "postgresql", "config": config})
}

/// The first `bytes` bytes of `text`'s SHA-256, in hex (as the platform
/// names slots and marks).
pub fn hex_digest(text: &str, bytes: usize) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())[..bytes]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The default slot of tenant a's dataflow `name`.
pub fn default_slot(name: &str) -> String {
    format!("sless_{}", hex_digest(&format!("a/{name}"), 10))
}

/// The comment on a publication (`None`: there is none).
pub async fn publication_comment(db: &tokio_postgres::Client, publication: &str) -> Option<Option<String>> {
    db.query_opt(
        "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
        &[&publication],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Waits until the publication no longer says its snapshot is pending.
pub async fn wait_snapshot_written(db: &tokio_postgres::Client, publication: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while publication_comment(db, publication)
        .await
        .flatten()
        .is_some_and(|c| c.ends_with("; snapshot pending"))
    {
        assert!(Instant::now() < deadline, "the snapshot was never written");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
