//! The Trino lines of the dataflow benchmark, on sless-testkit's Trino 476:
//! PG→Trino (the sink's `INSERT … SELECT` statements into the memory
//! catalog) against Trino's own bulk move of the same rows (one
//! `INSERT … SELECT` from its postgresql catalog into its memory catalog),
//! and Trino→PG (the source reading the postgresql catalog) against Trino's
//! own read of the same rows (one SELECT) and the PostgreSQL bulk INSERT of
//! the main line.

use std::time::Instant;

use serde_json::json;
use sless_testkit::trino::TrinoServer;

use super::{BATCH, Flow, ROWS, count};

const COLUMNS: &str = "(id bigint, customer_name varchar, card varchar, amount bigint, note varchar)";

/// Prints both lines; `plain` is the PostgreSQL bulk INSERT's rows/s.
pub async fn lines(db: &tokio_postgres::Client, dsn: &str, plain: f64) -> anyhow::Result<()> {
    let trino = TrinoServer::shared();
    for table in ["bench_bulk", "bench_flow"] {
        trino.query("memory", &format!("DROP TABLE IF EXISTS {table}")).await;
        trino.query("memory", &format!("CREATE TABLE {table} {COLUMNS}")).await;
    }

    // Baseline: Trino moves the same rows itself, catalog to catalog.
    let started = Instant::now();
    trino
        .query(
            "memory",
            "INSERT INTO bench_bulk SELECT id, \"customerName\", card, amount, note FROM postgresql.public.bench_src",
        )
        .await;
    let bulk = ROWS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_src", "batchSize": BATCH, "pollInterval": 1}},
            "sink": trino.spec("memory", "bench_flow", json!({})),
            "transformations": [{"type": "snakeCase", "config": {}}],
            "channelBufferSize": BATCH
        }),
        "bench/to-trino",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let to_trino = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(
        trino.count("memory", "SELECT count(*) FROM bench_flow").await == ROWS,
        "every row written once"
    );
    println!(
        "PG→Trino (memory catalog) {ROWS} rows, batches of {BATCH}: dataflow {to_trino:.0} rows/s, Trino's own \
         INSERT … SELECT from its postgresql catalog {bulk:.0} rows/s = ratio {:.2}",
        to_trino / bulk
    );

    // Baseline of the source: Trino's own read of the same rows, one
    // statement streamed through its client protocol.
    let started = Instant::now();
    let read = trino.query("postgresql", "SELECT * FROM bench_src").await.len();
    anyhow::ensure!(read as i64 == ROWS, "Trino read {read} rows");
    let trino_read = ROWS as f64 / started.elapsed().as_secs_f64();

    // Each statement costs Trino about 0.1 s whatever it reads (parse,
    // plan, schedule, six or seven exchanges of its protocol): polls of
    // 1,000 and of 10,000 rows.
    for batch in [BATCH, 10 * BATCH] {
        db.batch_execute(
            "DROP TABLE IF EXISTS bench_from_trino; CREATE TABLE bench_from_trino (id int PRIMARY KEY, \"customerName\" text, card text, amount int, note text);",
        )
        .await?;
        let started = Instant::now();
        let running = Flow::connect(
            json!({
                "source": trino.spec("postgresql", "bench_src", json!({"batchSize": batch, "pollInterval": 1})),
                "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_from_trino"}},
                "channelBufferSize": batch
            }),
            &format!("bench/from-trino-{batch}"),
        )
        .await?
        .run();
        running.written(ROWS).await;
        let from_trino = ROWS as f64 / started.elapsed().as_secs_f64();
        running.stop().await;
        anyhow::ensure!(count(db, "bench_from_trino").await? == ROWS, "every row written once");
        println!(
            "Trino (postgresql catalog)→PG {ROWS} rows, polls of {batch}: dataflow {from_trino:.0} rows/s, Trino's own \
             read of them (one SELECT) {trino_read:.0} rows/s = ratio {:.2}; plain bulk INSERT {plain:.0} rows/s = ratio {:.2}",
            from_trino / trino_read,
            from_trino / plain
        );
    }
    db.batch_execute("DROP TABLE bench_from_trino").await?;
    Ok(())
}
