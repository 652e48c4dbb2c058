//! The PostgreSQL CDC line of the dataflow benchmark: rows inserted into a
//! captured table (in transactions of a batch each, after the slot exists)
//! are drained into another table by a `postgresql-cdc` dataflow; its rate,
//! from its start to the last row written, against the rate of the inserts
//! themselves (the server's own load of the same rows). Started after the
//! inserts, it measures throughput, not the poll interval's latency.

use std::time::Instant;

use super::{BATCH, Flow, ROWS, count};

use serde_json::json;

/// The slot (and publication) name `name` of the benchmark's dataflows,
/// with none of that name left by an aborted run (it would hand its changes
/// out again). Names a spec gives are scoped to the tenant (`bench`).
async fn fresh_slot(db: &tokio_postgres::Client, name: &str) -> anyhow::Result<String> {
    let slot = format!("{}{name}", sless_dataflow::sources::postgres_cdc::name_prefix("bench"));
    db.batch_execute(&format!(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{slot}';
         DROP PUBLICATION IF EXISTS {slot};"
    ))
    .await?;
    Ok(slot)
}

/// How the captured changes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Each Debezium-shaped event whole, in a JSONB column.
    Events,
    /// The row after the change (a `select` of `after`'s fields, as
    /// Debezium's "new record state" unwrapping before a JDBC sink), into a
    /// table of the source's columns.
    Rows,
}

/// Rows/s of the dataflow and of the inserts, and the CPU a row each took
/// (the dataflow's: this process, and the server's walsender and sink
/// backend; the inserts': the server's).
pub async fn to_pg(
    db: &tokio_postgres::Client,
    dsn: &str,
    written: Written,
) -> anyhow::Result<(f64, f64, String, String)> {
    let target = match written {
        Written::Events => {
            "CREATE TABLE bench_cdc_dst (id bigserial PRIMARY KEY, data jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        }
        Written::Rows => "CREATE TABLE bench_cdc_dst (id int PRIMARY KEY, customer_name text, card text, amount int)",
    };
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_cdc_src, bench_cdc_dst;
         CREATE TABLE bench_cdc_src (id int PRIMARY KEY, customer_name text, card text, amount int);
         {target};"
    ))
    .await?;
    let slot = fresh_slot(db, "cdc").await?;
    let transformations = match written {
        Written::Events => json!([]),
        Written::Rows => {
            json!([{"type": "select", "config": {"fields": ["after.id", "after.customer_name", "after.card", "after.amount"]}}])
        }
    };
    // Connecting creates the slot: only later changes are captured (no
    // snapshot: its chunks would also read rows inserted after the slot).
    let flow = Flow::connect(
        json!({
            "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "bench_cdc_src", "batchSize": BATCH,
                       "slotName": slot, "snapshot": "never"}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_cdc_dst"}},
            "transformations": transformations,
            "channelBufferSize": BATCH
        }),
        "bench/cdc",
    )
    .await?;
    let before_inserts = super::cpu(db).await?;
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
    let inserts_cpu = super::cpu_per_row(before_inserts, super::cpu(db).await?);
    let before_flow = super::cpu(db).await?;
    let walsender: i32 = db
        .query_one(
            "SELECT pid FROM pg_stat_replication WHERE application_name = 'sless' LIMIT 1",
            &[],
        )
        .await?
        .get(0);
    let walsender = u32::try_from(walsender)?;
    let walsender_before = super::support::own_cpu_time(walsender);
    let started = Instant::now();
    let (source, sink, ctx) = (flow.spec.source.clone(), flow.spec.sink.clone(), flow.ctx.clone());
    let running = flow.run();
    running.written(ROWS).await;
    let flow = ROWS as f64 / started.elapsed().as_secs_f64();
    let decoding = (super::support::own_cpu_time(walsender) - walsender_before).as_secs_f64() * 1e6 / ROWS as f64;
    let flow_cpu = format!(
        "{} (the walsender's decoding {decoding:.1})",
        super::cpu_per_row(before_flow, super::cpu(db).await?)
    );
    running.stop().await;
    let written = count(db, "bench_cdc_dst").await?;
    anyhow::ensure!(written == ROWS, "every change written once, not {written}");
    sless_dataflow::registry::release(&source, &sink, &ctx).await?;
    db.batch_execute("DROP TABLE bench_cdc_src, bench_cdc_dst").await?;
    Ok((flow, inserts, flow_cpu, inserts_cpu))
}

/// Rows in the table the snapshot line reads.
pub const SNAPSHOT_ROWS: i64 = 1_000_000;

/// The initial snapshot of a table of [`SNAPSHOT_ROWS`] rows, read in
/// chunks of `chunk` rows while the stream runs, into a table like the
/// source's: the dataflow's rows/s from its start to the last row written,
/// and `COPY … TO STDOUT`'s of the same table (the server's own fastest
/// way out).
pub async fn snapshot(db: &tokio_postgres::Client, dsn: &str, chunk: u32) -> anyhow::Result<(f64, f64)> {
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_snap_src, bench_snap_dst;
         CREATE TABLE bench_snap_src (id int PRIMARY KEY, customer_name text, card text, amount int);
         INSERT INTO bench_snap_src SELECT g, 'customer ' || g, '4111111111111111', g % 1000
           FROM generate_series(1, {SNAPSHOT_ROWS}) g;
         CREATE TABLE bench_snap_dst (LIKE bench_snap_src INCLUDING ALL);"
    ))
    .await?;
    db.batch_execute("VACUUM ANALYZE bench_snap_src").await?;
    let started = Instant::now();
    let out = db.copy_out("COPY bench_snap_src TO STDOUT").await?;
    futures_util::pin_mut!(out);
    let mut lines = 0i64;
    while let Some(chunk) = futures_util::StreamExt::next(&mut out).await {
        lines += chunk?.iter().filter(|b| **b == b'\n').count() as i64;
    }
    let copy = lines as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(lines == SNAPSHOT_ROWS, "COPY gave {lines} rows");
    let slot = fresh_slot(db, "snap").await?;
    let started = Instant::now();
    let flow = Flow::connect(
        json!({
            "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "bench_snap_src",
                       "batchSize": BATCH, "snapshotChunkSize": chunk, "slotName": slot}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_snap_dst", "applyChanges": true}},
            "channelBufferSize": BATCH
        }),
        "bench/snapshot",
    )
    .await?;
    let (source, sink, ctx) = (flow.spec.source.clone(), flow.spec.sink.clone(), flow.ctx.clone());
    let running = flow.run();
    running.written(SNAPSHOT_ROWS).await;
    let rate = SNAPSHOT_ROWS as f64 / started.elapsed().as_secs_f64();
    running.stop().await;
    let written = count(db, "bench_snap_dst").await?;
    anyhow::ensure!(written == SNAPSHOT_ROWS, "every row written once, not {written}");
    sless_dataflow::registry::release(&source, &sink, &ctx).await?;
    db.batch_execute("DROP TABLE bench_snap_src, bench_snap_dst").await?;
    Ok((rate, copy))
}

/// The time from a change's commit to its row in the sink, at a steady
/// `rate` rows/s (transactions of `per_transaction` rows) for `seconds`:
/// p50 and p99 in milliseconds. Each captured row carries `clock_timestamp()` of its insert
/// (its transaction commits right after); the sink's row carries it of its
/// write (its batch commits right after).
pub async fn latency(
    db: &tokio_postgres::Client,
    dsn: &str,
    rate: u64,
    seconds: u64,
    per_transaction: u64,
) -> anyhow::Result<Latency> {
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_cdc_lat_src, bench_cdc_lat_dst;
         CREATE TABLE bench_cdc_lat_src (id int PRIMARY KEY, at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE TABLE bench_cdc_lat_dst (id bigserial PRIMARY KEY, data jsonb NOT NULL,
                                         written timestamptz NOT NULL DEFAULT clock_timestamp());",
    )
    .await?;
    let slot = fresh_slot(db, "cdc_lat").await?;
    let flow = Flow::connect(
        json!({
            "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": "bench_cdc_lat_src",
                       "batchSize": BATCH, "slotName": slot, "snapshot": "never"}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_cdc_lat_dst"}},
            "channelBufferSize": BATCH
        }),
        "bench/cdc-latency",
    )
    .await?;
    let (source, sink, ctx) = (flow.spec.source.clone(), flow.spec.sink.clone(), flow.ctx.clone());
    let running = flow.run();
    let (writer, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let rss_before = super::support::rss_kib(std::process::id())?;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(rss) = super::support::rss_kib(std::process::id()) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
    };
    let every = std::time::Duration::from_micros(1_000_000 * per_transaction / rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let n = per_transaction as i64;
    let total = (rate * seconds) as i64;
    let started = Instant::now();
    for t in 0..total / n {
        tick.tick().await;
        writer
            .batch_execute(&format!(
                "INSERT INTO bench_cdc_lat_src (id) SELECT g FROM generate_series({}, {}) g",
                t * n + 1,
                t * n + n
            ))
            .await?;
    }
    let achieved = total as f64 / started.elapsed().as_secs_f64();
    running.written(total).await;
    running.stop().await;
    sampler.abort();
    let row = db
        .query_one(
            "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY
                    extract(epoch FROM written - (data->'after'->>'at')::timestamptz) * 1000)
             FROM bench_cdc_lat_dst",
            &[],
        )
        .await?;
    let percentiles: Vec<f64> = row.get(0);
    anyhow::ensure!(percentiles.len() == 2, "two percentiles");
    sless_dataflow::registry::release(&source, &sink, &ctx).await?;
    db.batch_execute("DROP TABLE bench_cdc_lat_src, bench_cdc_lat_dst")
        .await?;
    Ok(Latency {
        p50: percentiles[0],
        p99: percentiles[1],
        achieved,
        rss_before_mib: rss_before as f64 / 1024.0,
        rss_peak_mib: peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0,
    })
}

/// Commit-to-sink latency at a steady rate, in milliseconds, and the
/// resident memory of this process (which runs the dataflow) before the
/// flow and at its peak.
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    /// The rate the inserts kept, rows/s.
    pub achieved: f64,
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
}
