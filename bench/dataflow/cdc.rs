//! The PostgreSQL CDC line of the dataflow benchmark: rows inserted into a
//! captured table (in transactions of a batch each, after the slot exists)
//! are drained into another table by a `postgresql-cdc` dataflow; its rate,
//! from its start to the last row written, against the rate of the inserts
//! themselves (the server's own load of the same rows). Started after the
//! inserts, it measures throughput, not the poll interval's latency.

use std::time::Instant;

use super::{BATCH, Flow, ROWS, count};
use serde_json::json;

/// Rows/s of the dataflow and of the inserts.
pub async fn to_pg(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<(f64, f64)> {
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_cdc_src, bench_cdc_dst;
         CREATE TABLE bench_cdc_src (id int PRIMARY KEY, customer_name text, card text, amount int);
         CREATE TABLE bench_cdc_dst (id bigserial PRIMARY KEY, data jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());",
    )
    .await?;
    // Names a spec gives are scoped to the tenant (`bench`, of `bench/cdc`).
    let slot = format!("{}cdc", sless_dataflow::sources::postgres_cdc::name_prefix("bench"));
    // A slot left by an aborted run would hand its changes out again.
    db.batch_execute(&format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}';
         DROP PUBLICATION IF EXISTS {slot};"
    ))
    .await?;
    // Connecting creates the slot: only later changes are captured.
    let flow = Flow::connect(
        json!({
            "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "bench_cdc_src", "batchSize": BATCH,
                       "pollInterval": 1, "slotName": slot}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_cdc_dst"}},
            "channelBufferSize": BATCH
        }),
        "bench/cdc",
    )
    .await?;
    let started = Instant::now();
    for t in 0..ROWS / BATCH {
        db.batch_execute(&format!(
            "INSERT INTO bench_cdc_src SELECT g, 'customer ' || g, '4111111111111111', g % 1000
             FROM generate_series({} , {}) g",
            t * BATCH + 1,
            (t + 1) * BATCH
        ))
        .await?;
    }
    let inserts = ROWS as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let (source, ctx) = (flow.spec.source.clone(), flow.ctx.clone());
    let running = flow.run();
    running.written(ROWS).await;
    let flow = ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    let written = count(db, "bench_cdc_dst").await?;
    anyhow::ensure!(written == ROWS, "every change written once, not {written}");
    sless_dataflow::registry::release_source(&source, &ctx).await?;
    db.batch_execute("DROP TABLE bench_cdc_src, bench_cdc_dst").await?;
    Ok((flow, inserts))
}
