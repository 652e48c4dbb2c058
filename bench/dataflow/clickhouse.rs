//! The ClickHouse lines of the dataflow benchmark, on a private
//! clickhouse-server: PG→ClickHouse against ClickHouse's own bulk load of
//! the same rows (one `INSERT … FORMAT JSONEachRow` of them all), and
//! ClickHouse→PG against the PostgreSQL bulk INSERT of the main line.

use std::time::Instant;

use serde_json::json;
use sless_testkit::clickhouse::ClickHouseServer;

use super::{BATCH, Flow, ROWS, count};

const COLUMNS: &str = "(id UInt64, customer_name String, card String, amount Int64, note String)";

/// Prints both lines; `plain` is the PostgreSQL bulk INSERT's rows/s.
pub async fn lines(db: &tokio_postgres::Client, dsn: &str, plain: f64) -> anyhow::Result<()> {
    let ch = ClickHouseServer::start();
    for table in ["bench_bulk", "bench_flow"] {
        ch.query(&format!(
            "CREATE TABLE {table} {COLUMNS} ENGINE = MergeTree() ORDER BY id"
        ))
        .await;
    }

    // Baseline: the same rows, read from PostgreSQL as JSON lines and
    // loaded into ClickHouse in one INSERT.
    let started = Instant::now();
    let rows: String = db
        .query_one(
            "SELECT string_agg(json_build_object('id', id, 'customer_name', \"customerName\", 'card', card, \
             'amount', amount, 'note', note)::text, E'\\n' ORDER BY id) FROM bench_src",
            &[],
        )
        .await?
        .get(0);
    ch.insert("INSERT INTO bench_bulk FORMAT JSONEachRow", rows).await;
    let bulk = ROWS as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_src", "batchSize": BATCH, "pollInterval": 1}},
            "sink": {"type": "clickhouse", "config": {"connectionString": ch.dsn(), "table": "bench_flow"}},
            "transformations": [{"type": "snakeCase", "config": {}}],
            "channelBufferSize": BATCH
        }),
        "bench/to-clickhouse",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let to_ch = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(
        ch.count("SELECT count() FROM bench_flow").await == ROWS,
        "every row written once"
    );
    println!(
        "PG→ClickHouse {ROWS} rows, batches of {BATCH}: dataflow {to_ch:.0} rows/s, ClickHouse bulk load \
         (one JSONEachRow INSERT) {bulk:.0} rows/s = ratio {:.2}",
        to_ch / bulk
    );

    db.batch_execute(
        "DROP TABLE IF EXISTS bench_from_ch; CREATE TABLE bench_from_ch (id int PRIMARY KEY, customer_name text, card text, amount int, note text);",
    )
    .await?;
    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "clickhouse", "config": {"connectionString": ch.dsn(), "table": "bench_bulk", "batchSize": BATCH, "pollInterval": 1}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_from_ch"}},
            "channelBufferSize": BATCH
        }),
        "bench/from-clickhouse",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let from_ch = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(count(db, "bench_from_ch").await? == ROWS, "every row written once");
    println!(
        "ClickHouse→PG {ROWS} rows, batches of {BATCH}: dataflow {from_ch:.0} rows/s, plain bulk INSERT {plain:.0} rows/s \
         = ratio {:.2}",
        from_ch / plain
    );
    db.batch_execute("DROP TABLE bench_from_ch").await?;
    Ok(())
}
