//! PG→PG dataflow throughput with three transformations, in rows/s, as a
//! ratio to a plain bulk INSERT of the same rows (read, then inserted in
//! batches of the same size) in the same run. Goal: ratio >= 0.5. A second
//! line drains the same rows from an SQS queue (a sless queue engine on
//! loopback) into PostgreSQL, as a ratio to the same bulk INSERT.
//!
//! Run: `cargo bench -p sless --bench dataflow_pg` (PostgreSQL at
//! `SLESS_TEST_PG`, default postgres://postgres@127.0.0.1/test).

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use sless_dataflow::context::PipelineContext;
use sless_dataflow::pipeline::Pipeline;
use sless_model::dataflow::DataFlowRequest;

const ROWS: i64 = 100_000;
const BATCH: i64 = 1000;

async fn count(db: &tokio_postgres::Client, table: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dsn = std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into());
    let (db, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
        .await
        .context("PostgreSQL")?;
    tokio::spawn(conn);
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_src, bench_plain, bench_flow;
         CREATE TABLE bench_src (id serial PRIMARY KEY, \"customerName\" text, card text, amount int, note text);
         INSERT INTO bench_src (\"customerName\", card, amount, note)
           SELECT 'customer ' || g, '4111111111111111', g % 1000, repeat('n', 40) FROM generate_series(1, {ROWS}) g;
         CREATE TABLE bench_plain (id int PRIMARY KEY, customer_name text, card text, amount int);
         CREATE TABLE bench_flow (id int PRIMARY KEY, customer_name text, card text, amount int);"
    ))
    .await?;

    // Baseline: the same rows read and inserted in batches, no transformations.
    let started = Instant::now();
    let mut after = 0i32;
    loop {
        let rows = db
            .query(
                &format!("SELECT json_agg(json_build_object('id', id, 'customer_name', \"customerName\", 'card', card, 'amount', amount))::text, max(id) FROM (SELECT * FROM bench_src WHERE id > $1 ORDER BY id LIMIT {BATCH}) q"),
                &[&after],
            )
            .await?;
        let Some(max) = rows[0].get::<_, Option<i32>>(1) else {
            break;
        };
        let docs: String = rows[0].get(0);
        db.execute(
            "INSERT INTO bench_plain SELECT * FROM jsonb_populate_recordset(NULL::bench_plain, $1::text::jsonb)",
            &[&docs],
        )
        .await?;
        after = max;
    }
    let plain = ROWS as f64 / started.elapsed().as_secs_f64();

    // The dataflow: filter + mask + snakeCase, then remove of a field.
    let spec = serde_json::from_value::<DataFlowRequest>(json!({
        "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_src", "batchSize": BATCH, "pollInterval": 1}},
        "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_flow"}},
        "transformations": [
            {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
            {"type": "snakeCase", "config": {}},
            {"type": "remove", "config": {"fields": ["note"]}}
        ],
        "channelBufferSize": BATCH
    }))?
    .into_spec(&sless_dataflow::registry::Registry)
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let ctx = PipelineContext {
        id: "bench/flow".into(),
        checkpoint: None,
        // PostgreSQL on loopback: the dev policy.
        egress: Default::default(),
    };
    let pipeline = Pipeline::connect(&spec, &ctx, Default::default()).await?;
    let task = tokio::spawn(pipeline.run(stopped));
    while count(&db, "bench_flow").await? < ROWS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let flow = ROWS as f64 / started.elapsed().as_secs_f64();
    stop.send_replace(true);
    let _ = task.await;
    let masked: Value = db
        .query_one("SELECT to_json(card)::text FROM bench_flow LIMIT 1", &[])
        .await
        .map(|r| serde_json::from_str::<Value>(&r.get::<_, String>(0)))??;
    assert_eq!(masked, json!("****************"), "the transformations ran");
    println!(
        "PG→PG {ROWS} rows, batches of {BATCH}: dataflow with 3 transformations {flow:.0} rows/s, \
         plain bulk INSERT {plain:.0} rows/s = ratio {:.2} (goal >= 0.5)",
        flow / plain
    );
    let sqs = sqs_to_pg(&db, &dsn).await?;
    println!(
        "SQS→PG {SQS_ROWS} messages, up to 100 a read: dataflow {sqs:.0} rows/s, plain bulk INSERT {plain:.0} rows/s \
         = ratio {:.2}",
        sqs / plain
    );
    db.batch_execute("DROP TABLE bench_src, bench_plain, bench_flow, bench_sqs")
        .await?;
    Ok(())
}

/// Messages of the SQS line: SQS moves ten a request, so fewer rows.
const SQS_ROWS: i64 = 20_000;

/// Rows/s of a dataflow from a queue of `SQS_ROWS` messages (sent before
/// it starts) into PostgreSQL.
async fn sqs_to_pg(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<f64> {
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
    for chunk in (0..SQS_ROWS).collect::<Vec<_>>().chunks(10) {
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
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let task = tokio::spawn(Pipeline::connect(&spec, &ctx, Default::default()).await?.run(stopped));
    while count(db, "bench_sqs").await? < SQS_ROWS {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = SQS_ROWS as f64 / started.elapsed().as_secs_f64();
    stop.send_replace(true);
    let _ = task.await;
    Ok(rate)
}
