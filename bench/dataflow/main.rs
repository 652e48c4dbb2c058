//! Dataflow throughput, each line in rows/s as a ratio to a baseline of the
//! same run:
//! - PG→PG with three transformations, against PostgreSQL's own ways of
//!   moving the same rows: `COPY … TO STDOUT` streamed into `COPY … FROM
//!   STDIN` on a second connection (goal: ratio >= 0.5), a server-side
//!   `INSERT … SELECT` (the ceiling, reported), and a plain bulk INSERT
//!   (read, then inserted in batches of the same size).
//! - SQS→PG (a sless queue engine on loopback), against the same bulk INSERT.
//! - PG→ClickHouse and ClickHouse→PG (`clickhouse.rs`), against
//!   ClickHouse's own bulk load of the same rows and the bulk INSERT.
//! - PG→Trino and Trino→PG (`trino.rs`, Trino 476 of sless-testkit),
//!   against Trino's own move of the same rows between its catalogs and the
//!   bulk INSERT.
//! - PG→Nessie and Nessie→PG (`nessie.rs`, Nessie 0.99 of sless-testkit),
//!   against Trino's own load of the same rows into an Iceberg table of the
//!   same catalog, its read of them, and the bulk INSERT.
//! - PostgreSQL CDC→PG (`cdc.rs`), against the rate of the captured inserts;
//!   its initial snapshot of 1,000,000 rows in chunks, against `COPY … TO`.
//!
//!   Also the time from a commit to its row in the sink at 1,000 and 10,000
//!   rows/s, with the resident memory of the process running the dataflow.
//!
//! Run: `cargo bench -p sless --bench dataflow` (PostgreSQL at
//! `SLESS_TEST_PG`, default postgres://postgres@127.0.0.1/test;
//! clickhouse-server from Debian's package; Trino from
//! scripts/install-test-deps.sh); `SLESS_BENCH_ONLY=cdc` runs the CDC lines
//! alone, `SLESS_BENCH_ONLY=trino` the Trino lines and their baseline,
//! `SLESS_BENCH_ONLY=nessie` the Nessie lines.

// A benchmark's output is its figures, on stdout.
#![allow(clippy::print_stdout)]

mod cdc;
mod clickhouse;
mod nessie;
mod sqs;
#[path = "../support.rs"]
mod support;
mod trino;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use sless_dataflow::checkpoint::file::FileCheckpoint;
use sless_dataflow::context::PipelineContext;
use sless_dataflow::pipeline::{Pipeline, Stats};
use sless_model::dataflow::{DataFlowRequest, DataFlowSpec};

// The allocator of the `sless` binary, which runs the processor.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub const ROWS: i64 = 100_000;
pub const BATCH: i64 = 1000;

/// A dataflow of the benchmark, connected (its source made what it needs,
/// a CDC slot) under the dev egress policy (servers on loopback). Its
/// position is saved to a file after every batch, as `sless processor`
/// saves it outside Kubernetes (write, fsync, rename, fsync).
pub struct Flow {
    pub spec: DataFlowSpec,
    pub ctx: PipelineContext,
    pipeline: Pipeline,
    stats: Arc<Stats>,
}

impl Flow {
    /// Connects the dataflow of `request` (the API's JSON body) as `id`.
    pub async fn connect(request: Value, id: &str) -> anyhow::Result<Self> {
        let spec = serde_json::from_value::<DataFlowRequest>(request)?
            .into_spec(&sless_dataflow::registry::Registry)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        std::fs::create_dir_all(checkpoints())?;
        let position = checkpoints().join(format!("{}.position", id.replace('/', "-")));
        let _ = std::fs::remove_file(&position);
        let ctx = PipelineContext {
            id: id.into(),
            checkpoint: Some(Arc::new(FileCheckpoint::new(position))),
            egress: Default::default(),
            queue_services: None,
            resume: None,
            snapshots: Vec::new(),
            positions_key: Some(sless_dataflow::context::PositionsKey::generate()),
            budget: sless_dataflow::budget::FlowBudget::temporary(),
        };
        let stats = Arc::<Stats>::default();
        let pipeline = Pipeline::connect(&spec, &ctx, stats.clone()).await?;
        Ok(Self {
            spec,
            ctx,
            pipeline,
            stats,
        })
    }

    /// Runs it until the returned stop is called.
    pub fn run(self) -> Running {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let _ = self.pipeline.run(stopped).await;
        });
        Running {
            stop,
            task,
            stats: self.stats,
        }
    }
}

/// Where the flows' positions are saved.
fn checkpoints() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("sless-bench-dataflow-{}", std::process::id()))
}

pub struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
}

impl Running {
    /// Waits until the pipeline says it has written `rows`, by its own
    /// counter: polling the target with `count(*)` would take server time
    /// from the flow being measured. Callers count the target after.
    pub async fn written(&self, rows: i64) {
        while (self.stats.snapshot().written as i64) < rows {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops it after the batch in hand.
    pub async fn stop(self) {
        self.stop.send_replace(true);
        let _ = self.task.await;
    }
}

/// CPU used so far by this process and by the PostgreSQL server behind
/// `db` (its postmaster and live backends), when the server runs here.
async fn cpu(db: &tokio_postgres::Client) -> anyhow::Result<(Duration, Option<Duration>)> {
    let backend: i32 = db.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
    let postmaster = u32::try_from(backend).ok().and_then(support::parent);
    Ok((support::cpu_time(std::process::id()), postmaster.map(support::cpu_time)))
}

/// CPU per row between two [`cpu`] readings, as "client X µs + server Y µs".
fn cpu_per_row(before: (Duration, Option<Duration>), after: (Duration, Option<Duration>)) -> String {
    let per_row = |d: Duration| d.as_secs_f64() * 1e6 / ROWS as f64;
    let server = match (before.1, after.1) {
        (Some(b), Some(a)) => format!("{:.1}", per_row(a.saturating_sub(b))),
        _ => "?".into(),
    };
    format!(
        "client {:.1} + server {server} µs CPU a row",
        per_row(after.0 - before.0)
    )
}

pub async fn count(db: &tokio_postgres::Client, table: &str) -> anyhow::Result<i64> {
    Ok(db
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0))
}

/// Rows/s of PostgreSQL moving `bench_src`'s columns into a like table:
/// `COPY` streamed out of one connection into another, and a server-side
/// `INSERT … SELECT`.
async fn postgres_limits(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<(f64, f64, String)> {
    use futures_util::{SinkExt, StreamExt};
    let columns = "id, \"customerName\", card, amount";
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_copy, bench_isel;
         CREATE TABLE bench_copy (id int PRIMARY KEY, customer_name text, card text, amount int);
         CREATE TABLE bench_isel (LIKE bench_copy INCLUDING ALL);",
    )
    .await?;
    let (writer, conn) = tokio_postgres::connect(dsn, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let before = cpu(db).await?;
    let started = Instant::now();
    let out = db
        .copy_out(&format!("COPY (SELECT {columns} FROM bench_src) TO STDOUT"))
        .await?;
    let sink = writer.copy_in("COPY bench_copy FROM STDIN").await?;
    futures_util::pin_mut!(out, sink);
    // The server sends a message a row: pass them on in large writes.
    let mut buffer = bytes::BytesMut::new();
    while let Some(chunk) = out.next().await {
        buffer.extend_from_slice(&chunk?);
        if buffer.len() >= 256 * 1024 {
            sink.send(buffer.split().freeze()).await?;
        }
    }
    sink.send(buffer.freeze()).await?;
    let copied = sink.finish().await?;
    let copy = copied as f64 / started.elapsed().as_secs_f64();
    let copy_cpu = cpu_per_row(before, cpu(db).await?);
    let started = Instant::now();
    let inserted = db
        .execute(&format!("INSERT INTO bench_isel SELECT {columns} FROM bench_src"), &[])
        .await?;
    let insert_select = inserted as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(copied == ROWS as u64 && inserted == ROWS as u64, "every row moved");
    db.batch_execute("DROP TABLE bench_copy, bench_isel").await?;
    Ok((copy, insert_select, copy_cpu))
}

/// `dsn` without TLS, as the baselines connect (`NoTls`): the dataflows'
/// connectors would otherwise negotiate it (`sslmode=prefer`), and compare
/// encrypted rows with plain ones.
fn unencrypted(dsn: String) -> String {
    if dsn.contains("sslmode") {
        dsn
    } else if !dsn.starts_with("postgres") {
        format!("{dsn} sslmode=disable")
    } else if dsn.contains('?') {
        format!("{dsn}&sslmode=disable")
    } else {
        format!("{dsn}?sslmode=disable")
    }
}

async fn cdc_lines(db: &tokio_postgres::Client, dsn: &str) -> anyhow::Result<()> {
    for (written, what) in [
        (
            cdc::Written::Rows,
            "the rows after each change into a table like the source's",
        ),
        (cdc::Written::Events, "each event whole into a JSONB column"),
    ] {
        let (cdc, inserts, flow_cpu, inserts_cpu) = cdc::to_pg(db, dsn, written).await?;
        println!(
            "PG CDC→PG {ROWS} rows in transactions of {BATCH}, {what}: dataflow draining them {cdc:.0} rows/s, \
             the inserts themselves {inserts:.0} rows/s = ratio {:.2}. Dataflow {flow_cpu}, inserts {inserts_cpu}",
            cdc / inserts
        );
    }
    for chunk in [5_000, 20_000] {
        let (snapshot, copy) = cdc::snapshot(db, dsn, chunk).await?;
        println!(
            "PG CDC snapshot of {} rows in chunks of {chunk} (watermarks, the stream running), applied by key \
             into a table like the source's: dataflow {snapshot:.0} rows/s, COPY … TO STDOUT of the table \
             {copy:.0} rows/s = ratio {:.2}",
            cdc::SNAPSHOT_ROWS,
            snapshot / copy
        );
    }
    for (rate, per_transaction) in [(1_000, 10), (10_000, 100)] {
        let seconds = 20;
        let l = cdc::latency(db, dsn, rate, seconds, per_transaction).await?;
        println!(
            "PG CDC→PG at a steady {rate} rows/s for {seconds} s (transactions of {per_transaction}; the inserts \
             kept {:.0} rows/s): from a row's insert to its write in the sink p50 {:.1} ms, p99 {:.1} ms \
             (goal < 50 ms at 10,000 rows/s); this process, which runs the dataflow, resident {:.0} MiB before \
             it and {:.0} MiB at its peak (goal < 150 MB)",
            l.achieved, l.p50, l.p99, l.rss_before_mib, l.rss_peak_mib
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dsn =
        unencrypted(std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into()));
    let (db, conn) = tokio_postgres::connect(&dsn, tokio_postgres::NoTls)
        .await
        .context("PostgreSQL")?;
    tokio::spawn(conn);
    // The flows' sinks store their positions (exactly once): a run must not
    // resume from an earlier run's.
    let positions = sless_dataflow::positions_table("bench");
    db.batch_execute(&format!("DROP TABLE IF EXISTS {positions}")).await?;
    if std::env::var("SLESS_BENCH_ONLY").as_deref() == Ok("cdc") {
        return cdc_lines(&db, &dsn).await;
    }
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
    match std::env::var("SLESS_BENCH_ONLY").as_deref() {
        Ok("trino") => return trino::lines(&db, &dsn, plain).await,
        Ok("nessie") => return nessie::lines(&db, &dsn, plain).await,
        _ => {}
    }
    let (copy, insert_select, copy_cpu) = postgres_limits(&db, &dsn).await?;

    // The dataflow: mask, snakeCase, then remove of a field.
    let before = cpu(&db).await?;
    let started = Instant::now();
    let running = Flow::connect(
        json!({
            "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_src", "batchSize": BATCH, "pollInterval": 1}},
            "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": "bench_flow"}},
            "transformations": [
                {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
                {"type": "snakeCase", "config": {}},
                {"type": "remove", "config": {"fields": ["note"]}}
            ],
            "channelBufferSize": BATCH
        }),
        "bench/flow",
    )
    .await?
    .run();
    running.written(ROWS).await;
    let flow = ROWS as f64 / started.elapsed().as_secs_f64();
    let flow_cpu = cpu_per_row(before, cpu(&db).await?);
    running.stop().await;
    anyhow::ensure!(count(&db, "bench_flow").await? == ROWS, "every row written once");
    let masked: Value = db
        .query_one("SELECT to_json(card)::text FROM bench_flow LIMIT 1", &[])
        .await
        .map(|r| serde_json::from_str::<Value>(&r.get::<_, String>(0)))??;
    assert_eq!(masked, json!("****************"), "the transformations ran");
    println!(
        "PG→PG {ROWS} rows, batches of {BATCH}: dataflow with 3 transformations {flow:.0} rows/s; \
         COPY out and in {copy:.0} rows/s = ratio {:.2} (goal >= 0.5); INSERT … SELECT {insert_select:.0} rows/s \
         = ratio {:.2}; plain bulk INSERT {plain:.0} rows/s = ratio {:.2}. Dataflow {flow_cpu}, COPY {copy_cpu}",
        flow / copy,
        flow / insert_select,
        flow / plain
    );
    let sqs = sqs::to_pg(&db, &dsn).await?;
    let alone = sqs::source_alone().await?;
    println!(
        "SQS→PG {} messages, up to 100 a read: dataflow {sqs:.0} rows/s, plain bulk INSERT {plain:.0} rows/s \
         = ratio {:.2}; the SQS source alone (receive and delete, no sink) {alone:.0} rows/s: the flow runs at \
         {:.2} of it",
        sqs::ROWS,
        sqs / plain,
        sqs / alone
    );
    clickhouse::lines(&db, &dsn, plain).await?;
    trino::lines(&db, &dsn, plain).await?;
    nessie::lines(&db, &dsn, plain).await?;
    cdc_lines(&db, &dsn).await?;
    db.batch_execute("DROP TABLE bench_src, bench_plain, bench_flow, bench_sqs")
        .await?;
    std::fs::remove_dir_all(checkpoints())?;
    Ok(())
}
