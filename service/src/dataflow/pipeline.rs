//! One dataflow: a reader task feeds rows through a channel bounded by
//! `channelBufferSize` (backpressure) to the processor, which transforms a
//! batch, writes every output (routes, main sink, error sink), and only then
//! saves the read position. A crash re-reads at most the batch that was
//! being written: at-least-once, with duplicates bounded by one batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use super::ConnectorError;
use super::checkpoint::CheckpointStore;
use super::message::Message;
use super::sinks::postgres::PostgresSink;
use super::sources::postgres::{PostgresSource, Row};
use super::transforms::{self, Transform, router::ROUTED_CONDITION};
use crate::model::connector_config::{PostgresSinkConfig, PostgresSourceConfig};
use crate::model::dataflow::{ConnectorSpec, DataFlowCounters, DataFlowSpec};
use crate::model::transform_config::RouterConfig;

const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What a pipeline has done, shared with whoever reports on it.
#[derive(Default)]
pub struct Stats {
    read: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
    filtered: AtomicU64,
    last_checkpoint: std::sync::Mutex<Option<SystemTime>>,
}

impl Stats {
    pub fn snapshot(&self) -> DataFlowCounters {
        DataFlowCounters {
            read: self.read.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            filtered: self.filtered.load(Ordering::Relaxed),
            last_checkpoint_at: self
                .last_checkpoint
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        }
    }

    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

pub struct Pipeline {
    source: Arc<PostgresSource>,
    transforms: Vec<Box<dyn Transform>>,
    main: PostgresSink,
    routes: Vec<(String, PostgresSink)>,
    errors: Option<PostgresSink>,
    checkpoint: Option<(Arc<dyn CheckpointStore>, String)>,
    buffer: usize,
    batch: usize,
    stats: Arc<Stats>,
}

fn config<T: serde::de::DeserializeOwned>(c: &ConnectorSpec) -> Result<T, ConnectorError> {
    serde_json::from_value(c.config.clone().unwrap_or(Value::Null)).map_err(|e| ConnectorError::Config(e.to_string()))
}

async fn sink(c: &ConnectorSpec) -> Result<PostgresSink, ConnectorError> {
    match c.kind.as_str() {
        "postgresql" => PostgresSink::connect(&config::<PostgresSinkConfig>(c)?).await,
        other => Err(ConnectorError::Config(format!(
            "the {other} connector is not in this build yet"
        ))),
    }
}

impl Pipeline {
    /// Connects every connector of `spec`. `checkpoint` is None when
    /// `checkpointPersistence` is off.
    pub async fn connect(
        spec: &DataFlowSpec,
        checkpoint: Option<(Arc<dyn CheckpointStore>, String)>,
        stats: Arc<Stats>,
    ) -> Result<Self, ConnectorError> {
        let source_config = match spec.source.kind.as_str() {
            "postgresql" => config::<PostgresSourceConfig>(&spec.source)?,
            other => {
                return Err(ConnectorError::Config(format!(
                    "the {other} connector is not in this build yet"
                )));
            }
        };
        let batch = source_config
            .batch_size
            .unwrap_or(super::sources::postgres::DEFAULT_BATCH)
            .max(1) as usize;
        let transforms = spec
            .transformations
            .iter()
            .map(|t| transforms::build(t).map_err(|e| ConnectorError::Config(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let mut routes = Vec::new();
        for t in spec.transformations.iter().filter(|t| t.kind == "router") {
            let router: RouterConfig = serde_json::from_value(t.config.clone().unwrap_or(Value::Null))
                .map_err(|e| ConnectorError::Config(e.to_string()))?;
            for route in router.routes {
                if let Some(s) = &route.sink {
                    routes.push((route.condition, sink(s).await?));
                }
            }
        }
        Ok(Self {
            source: Arc::new(PostgresSource::connect(&source_config).await?),
            transforms,
            main: sink(&spec.sink).await?,
            routes,
            errors: match &spec.errors {
                Some(e) => Some(sink(e).await?),
                None => None,
            },
            checkpoint,
            buffer: spec.channel_buffer_size.max(1) as usize,
            batch,
            stats,
        })
    }

    /// Runs until `shutdown` is set (after finishing the batch in hand) or a
    /// failure retrying cannot fix.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), ConnectorError> {
        let start = match &self.checkpoint {
            Some((store, key)) => store
                .load(key)
                .await
                .map_err(|e| ConnectorError::Query(e.to_string()))?,
            None => None,
        };
        let (tx, mut rx) = mpsc::channel::<Row>(self.buffer);
        let reader = tokio::spawn(read_loop(self.source.clone(), start, tx, shutdown.clone()));
        let outcome = loop {
            let first = tokio::select! {
                row = rx.recv() => row,
                _ = shutdown.wait_for(|s| *s) => None,
            };
            let Some(first) = first else { break Ok(()) };
            let mut rows = vec![first];
            while rows.len() < self.batch {
                match rx.try_recv() {
                    Ok(row) => rows.push(row),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.process(&rows, &mut shutdown).await {
                break Err(e);
            }
        };
        reader.abort();
        outcome
    }

    async fn process(&self, rows: &[Row], shutdown: &mut watch::Receiver<bool>) -> Result<(), ConnectorError> {
        let mut main = Vec::new();
        let mut routed: Vec<Vec<Message>> = self.routes.iter().map(|_| Vec::new()).collect();
        Stats::add(&self.stats.read, rows.len());
        for row in rows {
            let outputs = transforms::apply_all(&self.transforms, Message::new(row.data.clone()));
            if outputs.is_empty() {
                Stats::add(&self.stats.filtered, 1);
            }
            for out in outputs {
                match out
                    .metadata
                    .get(ROUTED_CONDITION)
                    .and_then(|c| self.routes.iter().position(|(rc, _)| rc == c))
                {
                    Some(i) => routed[i].push(out),
                    None => main.push(out),
                }
            }
        }
        self.write_reliably(&self.main, &main, shutdown).await?;
        for ((_, sink), messages) in self.routes.iter().zip(&routed) {
            self.write_reliably(sink, messages, shutdown).await?;
        }
        if let (Some((store, key)), Some(last)) = (&self.checkpoint, rows.last()) {
            store
                .save(key, &last.position)
                .await
                .map_err(|e| ConnectorError::Query(e.to_string()))?;
            *self.stats.last_checkpoint.lock().unwrap_or_else(|p| p.into_inner()) = Some(SystemTime::now());
        }
        Ok(())
    }

    /// Writes until it succeeds: the batch whole, else message by message
    /// with refused ones to the error sink. Without an error sink a refused
    /// message is retried with backoff: nothing is dropped silently.
    async fn write_reliably(
        &self,
        sink: &PostgresSink,
        messages: &[Message],
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectorError> {
        if messages.is_empty() {
            return Ok(());
        }
        let data: Vec<Value> = messages.iter().map(|m| m.data.clone()).collect();
        let mut backoff = Backoff::default();
        loop {
            match sink.write(&data).await {
                Ok(()) => {
                    Stats::add(&self.stats.written, data.len());
                    return Ok(());
                }
                Err(ConnectorError::Data(_)) => break,
                Err(ConnectorError::Config(e)) => return Err(ConnectorError::Config(e)),
                Err(e) => backoff.wait(&e, shutdown).await?,
            }
        }
        for message in messages {
            let mut backoff = Backoff::default();
            loop {
                match sink.write(std::slice::from_ref(&message.data)).await {
                    Ok(()) => {
                        Stats::add(&self.stats.written, 1);
                        break;
                    }
                    Err(ConnectorError::Data(reason)) if self.errors.is_some() => {
                        let envelope = json!({
                            "error": {
                                "message": reason,
                                "timestamp": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                                "original_sink": sink.table,
                                "metadata": message.metadata,
                            },
                            "original_message": message.data,
                        });
                        if let Some(errors) = &self.errors {
                            Box::pin(self.write_reliably(errors, &[Message::new(envelope)], shutdown)).await?;
                            // The envelope is not a written message of the flow.
                            self.stats.written.fetch_sub(1, Ordering::Relaxed);
                        }
                        Stats::add(&self.stats.failed, 1);
                        break;
                    }
                    Err(ConnectorError::Config(e)) => return Err(ConnectorError::Config(e)),
                    Err(e) => backoff.wait(&e, shutdown).await?,
                }
            }
        }
        Ok(())
    }
}

/// Reads batches after `position`, forever, into `tx` (which blocks when
/// the processor is behind).
async fn read_loop(
    source: Arc<PostgresSource>,
    mut position: Option<String>,
    tx: mpsc::Sender<Row>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut backoff = Backoff::default();
    loop {
        match source.read(position.as_deref()).await {
            Ok(rows) if rows.is_empty() => {
                tokio::select! {
                    () = tokio::time::sleep(source.poll_interval) => {}
                    _ = shutdown.wait_for(|s| *s) => return,
                }
            }
            Ok(rows) => {
                backoff = Backoff::default();
                for row in rows {
                    position = Some(row.position.clone());
                    if tx.send(row).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                if backoff.wait(&e, &mut shutdown).await.is_err() {
                    return;
                }
            }
        }
    }
}

struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Duration::from_millis(200))
    }
}

impl Backoff {
    /// Waits before a retry; fails at shutdown so no position is saved.
    async fn wait(
        &mut self,
        error: &ConnectorError,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectorError> {
        tracing::warn!(%error, retry_in = ?self.0, "dataflow step failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(self.0) => {}
            _ = shutdown.wait_for(|s| *s) => return Err(ConnectorError::Query("stopped".into())),
        }
        self.0 = (self.0 * 2).min(MAX_BACKOFF);
        Ok(())
    }
}
