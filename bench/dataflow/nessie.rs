//! The Nessie lines of the dataflow benchmark, on sless-testkit's Nessie
//! 0.99 (moto's S3 server as its store) with Trino 476's Iceberg connector
//! as the other writer and reader: PG→Nessie (a Parquet file and a commit a
//! batch) against Trino's own bulk load of the same rows into an Iceberg
//! table of the same catalog (one `INSERT … SELECT` from its postgresql
//! catalog), and Nessie→PG (the source reading what Trino loaded) against
//! Trino's own read of it (one SELECT) and the PostgreSQL bulk INSERT of the
//! main line.

use std::time::Instant;

use serde_json::json;
use sless_testkit::nessie::NessieServer;
use sless_testkit::trino::TrinoServer;

use super::{BATCH, Flow, ROWS, count};

const COLUMNS: &str = "(id bigint, customer_name varchar, card varchar, amount bigint, note varchar)";

/// Prints both lines; `plain` is the PostgreSQL bulk INSERT's rows/s.
pub async fn lines(db: &tokio_postgres::Client, dsn: &str, plain: f64) -> anyhow::Result<()> {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    trino.add_iceberg(nessie).await;
    let namespace = format!("bench_{}", std::process::id());
    trino
        .query("iceberg", &format!("CREATE SCHEMA iceberg.{namespace}"))
        .await;
    for table in ["bulk", "flow"] {
        trino
            .query(
                "iceberg",
                &format!("CREATE TABLE iceberg.{namespace}.{table} {COLUMNS}"),
            )
            .await;
    }

    // Baseline: Trino loads the same rows itself, PostgreSQL to Iceberg.
    let started = Instant::now();
    trino
        .query(
            "iceberg",
            &format!(
                "INSERT INTO iceberg.{namespace}.bulk SELECT id, \"customerName\", card, amount, note \
                 FROM postgresql.public.bench_src"
            ),
        )
        .await;
    let bulk = ROWS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_src", "batchSize": BATCH, "pollInterval": 1}},
            "sink": nessie.spec(&namespace, "flow", json!({})),
            "transformations": [{"type": "snakeCase", "config": {}}],
            "channelBufferSize": BATCH
        }),
        "bench/to-nessie",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let to_nessie = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(
        trino
            .count("iceberg", &format!("SELECT count(*) FROM iceberg.{namespace}.flow"))
            .await
            == ROWS,
        "every row written once"
    );
    println!(
        "PG→Nessie {ROWS} rows, batches of {BATCH} (a Parquet file and a commit each): dataflow {to_nessie:.0} rows/s, \
         Trino's own INSERT … SELECT into an Iceberg table of the same catalog {bulk:.0} rows/s = ratio {:.2}",
        to_nessie / bulk
    );

    // Baseline of the source: Trino's own read of the rows it loaded.
    let started = Instant::now();
    let read = trino
        .query("iceberg", &format!("SELECT * FROM iceberg.{namespace}.bulk"))
        .await
        .len();
    anyhow::ensure!(read as i64 == ROWS, "Trino read {read} rows");
    let trino_read = ROWS as f64 / started.elapsed().as_secs_f64();
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_from_nessie; CREATE TABLE bench_from_nessie (id int PRIMARY KEY, customer_name text, card text, amount int, note text);",
    )
    .await?;
    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": nessie.spec(&namespace, "bulk", json!({"batchSize": BATCH, "pollInterval": 1})),
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_from_nessie"}},
            "channelBufferSize": BATCH
        }),
        "bench/from-nessie",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let from_nessie = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(count(db, "bench_from_nessie").await? == ROWS, "every row written once");
    println!(
        "Nessie→PG {ROWS} rows, batches of {BATCH}: dataflow {from_nessie:.0} rows/s, Trino's own read of them \
         (one SELECT) {trino_read:.0} rows/s = ratio {:.2}; plain bulk INSERT {plain:.0} rows/s = ratio {:.2}",
        from_nessie / trino_read,
        from_nessie / plain
    );
    db.batch_execute("DROP TABLE bench_from_nessie").await?;
    Ok(())
}
