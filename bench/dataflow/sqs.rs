//! The SQS→PG line of the dataflow benchmark.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sless_dataflow::context::PipelineContext;
use sless_dataflow::pipeline::Pipeline;
use sless_model::dataflow::DataFlowRequest;

use super::count;

/// Messages of the SQS line: SQS moves ten a request, so fewer rows.
pub const ROWS: i64 = 20_000;

/// Rows/s of a dataflow from a queue of `ROWS` messages (sent before
/// it starts) into PostgreSQL.
pub async fn to_pg(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<f64> {
    use sless_sqs::engine::server::EngineServer;
    use sless_sqs::engine::{Engine, EngineConfig};
    db.batch_execute("DROP TABLE IF EXISTS bench_sqs; CREATE TABLE bench_sqs (id int PRIMARY KEY, amount int);")
        .await?;
    let engine = Engine::open(
        EngineConfig {
            account_id: "000000000000".into(),
            region: "ru-msk-1".into(),
            base_url: "http://127.0.0.1".into(),
        },
        None,
    )?;
    let server = EngineServer::start(engine.clone(), "127.0.0.1:0".parse()?, None).await?;
    let url = engine.handle("CreateQueue", &json!({"QueueName": "bench"})).await?["QueueUrl"]
        .as_str()
        .unwrap_or_default()
        .replace("http://127.0.0.1", &format!("http://{}", server.addr));
    for chunk in (0..ROWS).collect::<Vec<_>>().chunks(10) {
        let entries: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"Id": i.to_string(), "MessageBody": json!({"id": i, "amount": i % 1000}).to_string()}))
            .collect();
        engine
            .handle("SendMessageBatch", &json!({"QueueUrl": url, "Entries": entries}))
            .await?;
    }
    let spec = serde_json::from_value::<DataFlowRequest>(json!({
        "source": {"type": "sqs", "config": {"queueUrl": url, "accessKeyId": "bench", "secretAccessKey": "bench",
                   "waitTimeSeconds": 1}},
        "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_sqs"}},
    }))?
    .into_spec(&sless_dataflow::registry::Registry)
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ctx = PipelineContext {
        id: "bench/sqs".into(),
        checkpoint: None,
        egress: Default::default(),
        queue_services: None,
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let task = tokio::spawn(Pipeline::connect(&spec, &ctx, Default::default()).await?.run(stopped));
    while count(db, "bench_sqs").await? < ROWS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = ROWS as f64 / started.elapsed().as_secs_f64();
    stop.send_replace(true);
    let _ = task.await;
    Ok(rate)
}
