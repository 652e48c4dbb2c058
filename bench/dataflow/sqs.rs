//! The SQS→PG line of the dataflow benchmark.

use std::time::Instant;

use super::{Flow, count};
use serde_json::{Value, json};

/// Messages of the SQS line: SQS moves ten a request, so fewer rows.
pub const ROWS: i64 = 20_000;

/// Rows/s of a dataflow from a queue of `ROWS` messages (sent before
/// it starts) into PostgreSQL.
pub async fn to_pg(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<f64> {
    db.batch_execute("DROP TABLE IF EXISTS bench_sqs; CREATE TABLE bench_sqs (id int PRIMARY KEY, amount int);")
        .await?;
    let loopback = sless_testkit::sqs::LoopbackEngine::start().await;
    let engine = &loopback.engine;
    let url = loopback.queue("bench").await;
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(10) {
        let entries: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"Id": i.to_string(), "MessageBody": json!({"id": i, "amount": i % 1000}).to_string()}))
            .collect();
        engine
            .handle("SendMessageBatch", &json!({"QueueUrl": url, "Entries": entries}))
            .await?;
    }
    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "sqs", "config": {"queueUrl": url, "accessKeyId": "bench", "secretAccessKey": "bench",
                       "waitTimeSeconds": 1}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_sqs"}},
        }),
        "bench/sqs",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let rate = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    anyhow::ensure!(count(db, "bench_sqs").await? >= ROWS, "every message written");
    Ok(rate)
}
