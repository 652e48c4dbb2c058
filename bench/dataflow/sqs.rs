//! The SQS→PG line of the dataflow benchmark.

use std::time::Instant;

use super::{Flow, count};
use serde_json::{Value, json};

/// Messages of the SQS line: SQS moves ten a request, so fewer rows.
pub const ROWS: i64 = 20_000;

/// A loopback engine with a queue of `ROWS` messages; its URL.
async fn filled_queue() -> anyhow::Result<(sless_testkit::sqs::LoopbackEngine, String)> {
    let loopback = sless_testkit::sqs::LoopbackEngine::start().await;
    let url = loopback.queue("bench").await;
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(10) {
        let entries: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"Id": i.to_string(), "MessageBody": json!({"id": i, "amount": i % 1000}).to_string()}))
            .collect();
        loopback
            .engine
            .handle("SendMessageBatch", &json!({"QueueUrl": url, "Entries": entries}))
            .await?;
    }
    Ok((loopback, url))
}

fn source_config(url: &str) -> Value {
    json!({"queueUrl": url, "accessKeyId": "bench", "secretAccessKey": "bench", "waitTimeSeconds": 1})
}

/// Rows/s of a dataflow from a queue of `ROWS` messages (sent before
/// it starts) into PostgreSQL.
pub async fn to_pg(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<f64> {
    db.batch_execute("DROP TABLE IF EXISTS bench_sqs; CREATE TABLE bench_sqs (id int PRIMARY KEY, amount int);")
        .await?;
    let (_loopback, url) = filled_queue().await?;
    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "sqs", "config": source_config(&url)},
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

/// Rows/s of the dataflow's SQS source alone draining the same queue:
/// each read received (ten messages a request) and deleted (ten a
/// request), with no sink, one read's deletes overlapping the next read
/// as in the pipeline. What the SQS protocol lets a flow from a queue
/// reach.
pub async fn source_alone() -> anyhow::Result<f64> {
    use sless_dataflow::sources::{Open, Source};
    let (_loopback, url) = filled_queue().await?;
    let config = serde_json::from_value(source_config(&url))?;
    let ctx = sless_dataflow::context::PipelineContext {
        id: "bench/sqs-alone".into(),
        checkpoint: None,
        egress: Default::default(),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        positions_key: None,
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    };
    let source = sless_dataflow::sources::sqs::SqsSource::open(&config, &ctx).await?;
    let started = Instant::now();
    let (mut drained, mut done) = (0, Vec::new());
    while drained < ROWS {
        let (records, committed) = tokio::join!(source.read(), source.commit(&done));
        committed?;
        let records = records?;
        drained += records.len() as i64;
        done = records.into_iter().map(|r| r.position).collect();
    }
    source.commit(&done).await?;
    Ok(ROWS as f64 / started.elapsed().as_secs_f64())
}
