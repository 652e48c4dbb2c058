//! One dataflow: a reader task reads records and transforms them, and feeds
//! them through a channel bounded by `channelBufferSize` (backpressure) to
//! the processor, which writes every output of a batch (routes, main sink,
//! error sink) and only then commits the batch to its source (a saved read
//! position, Kafka offsets, SQS deletes). The stages overlap: the next
//! batch is read while one is transformed, and written while the batch
//! before it is committed, so no stage waits on another's round trip.
//! Commits still go one at a time, in order, and each only after its
//! batch is written everywhere. A crash re-reads at most the batch being
//! written and the one whose commit was under way: at-least-once, with
//! duplicates bounded by two batches.
//!
//! Exactly once where the main sink stores the source's position with each
//! batch ([`Sink::write_at`]) and the source resumes from it: the routes
//! and the error sink are written first and the main sink last, with the
//! position after the batch, and a new run's source starts after what the
//! main sink holds. The stored text begins with a digest of the source's
//! spec: a run of another source (an updated spec) does not resume from it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use sless_model::dataflow::{DataFlowCounters, DataFlowSpec};
use sless_runtime::backoff::{Backoff, Retries};

use crate::context::PipelineContext;
use crate::message::{Message, Output, REFUSED};
use crate::sinks::Sink;
use crate::sources::{Position, Record, Source};
use crate::transforms::{self, Outputs, Transform};
use crate::{ConnectorError, registry};
use sless_runtime::sync::Unpoisoned;

/// Retries of a failing read or write: 200 ms doubling to 30 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));

/// Most memory the messages between a pipeline's reader and its writer
/// may take (the channel, the batch being written), as
/// [`Message::approx_size`] counts it: `channelBufferSize` counts messages,
/// whatever their size, so without it a tenant's large messages could hold
/// gigabytes. The reader waits while it is spent; a single message larger
/// than all of it still passes, alone.
pub const MEMORY_BUDGET: usize = 256 << 20;

/// What a pipeline has done, shared with whoever reports on it.
#[derive(Default)]
pub struct Stats {
    read: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
    filtered: AtomicU64,
    last_checkpoint: std::sync::Mutex<Option<SystemTime>>,
    refusal: std::sync::Mutex<Option<Refusal>>,
    /// Why reading the source fails, while it is retried.
    read_failure: std::sync::Mutex<Option<String>>,
    /// Why writing a batch fails, while it is retried.
    write_failure: std::sync::Mutex<Option<String>>,
}

/// A message a sink refuses while there is no error sink to take it: the
/// pipeline retries it (nothing is dropped) and the dataflow shows why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The sink's target (a table, a topic).
    pub target: String,
    pub reason: String,
    /// Refusals of the message so far.
    pub count: u64,
}

impl Stats {
    pub fn snapshot(&self) -> DataFlowCounters {
        DataFlowCounters {
            read: self.read.load(Ordering::Relaxed),
            written: self.written.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            filtered: self.filtered.load(Ordering::Relaxed),
            last_checkpoint_at: self
                .last_checkpoint()
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
        }
    }

    /// When a batch was last committed to the source.
    pub fn last_checkpoint(&self) -> Option<SystemTime> {
        *self.last_checkpoint.lock_unpoisoned()
    }

    /// The message being refused now, if any.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal.lock_unpoisoned().clone()
    }

    fn refused(&self, target: &str, reason: &str) {
        let mut refusal = self.refusal.lock_unpoisoned();
        let count = refusal.as_ref().map_or(0, |r| r.count) + 1;
        *refusal = Some(Refusal {
            target: target.to_owned(),
            reason: reason.to_owned(),
            count,
        });
    }

    fn accepted(&self) {
        *self.refusal.lock_unpoisoned() = None;
    }

    /// Why reading the source fails while the read is retried; `None`
    /// once a read succeeds.
    pub fn read_failure(&self) -> Option<String> {
        self.read_failure.lock_unpoisoned().clone()
    }

    fn reading(&self, failure: Option<String>) {
        *self.read_failure.lock_unpoisoned() = failure;
    }

    /// Why writing fails while the write is retried; `None` once one succeeds.
    pub fn write_failure(&self) -> Option<String> {
        self.write_failure.lock_unpoisoned().clone()
    }

    fn writing(&self, failure: Option<String>) {
        *self.write_failure.lock_unpoisoned() = failure;
    }

    fn write_failed(&self, target: &str, error: &ConnectorError) {
        self.writing(Some(format!("writing to {target} fails: {error}")));
    }

    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    #[cfg(test)]
    pub(crate) fn count_for_test(&self, read: usize, written: usize, failed: usize, filtered: usize) {
        Self::add(&self.read, read);
        Self::add(&self.written, written);
        Self::add(&self.failed, failed);
        Self::add(&self.filtered, filtered);
    }
}

pub struct Pipeline {
    source: Arc<dyn Source>,
    /// The digest a stored position of this source begins with; `Some`
    /// when the main sink stores positions (exactly once).
    exactly_once: Option<String>,
    transforms: Arc<[Box<dyn Transform>]>,
    main: Box<dyn Sink>,
    /// The sinks of the transformations' extra outputs, by index.
    routes: Vec<Box<dyn Sink>>,
    errors: Option<Box<dyn Sink>>,
    buffer: usize,
    batch: usize,
    stats: Arc<Stats>,
}

impl Pipeline {
    /// Connects every connector of `spec`.
    pub async fn connect(
        spec: &DataFlowSpec,
        ctx: &PipelineContext,
        stats: Arc<Stats>,
    ) -> Result<Self, ConnectorError> {
        let mut outputs = Outputs::default();
        let transforms = spec
            .transformations
            .iter()
            .map(|t| registry::build_transform(t, &mut outputs).map_err(|e| ConnectorError::Config(e.to_string())))
            .collect::<Result<Arc<[_]>, _>>()?;
        let mut routes = Vec::with_capacity(outputs.sinks().len());
        for sink in outputs.sinks() {
            routes.push(registry::connect_sink(sink, ctx).await?);
        }
        let main = registry::connect_sink(&spec.sink, ctx).await?;
        let errors = match &spec.errors {
            Some(e) => Some(registry::connect_sink(e, ctx).await?),
            None => None,
        };
        // The source last: a Kafka source joins its group only once the
        // sinks can take what it is given.
        let resumable = registry::source_resumable(&spec.source.kind);
        let exactly_once = match (main.exactly_once(), resumable) {
            (Some(false), _) | (None, false) => None,
            (Some(true), false) => {
                return Err(ConnectorError::Config(format!(
                    "exactlyOnce needs a source that resumes from a stored position \
                     (postgresql, postgresql-cdc, kafka, clickhouse), not {}",
                    spec.source.kind
                )));
            }
            (_, true) => Some(source_digest(spec)),
        };
        let mut source_ctx = ctx.clone();
        source_ctx.snapshots = spec.snapshots.clone();
        if let Some(digest) = &exactly_once {
            source_ctx.resume = main
                .stored_position()
                .await?
                .and_then(|stored| stored.strip_prefix(digest.as_str()).map(str::to_owned));
        }
        let source = registry::connect_source(&spec.source, &source_ctx).await?;
        Ok(Self {
            exactly_once,
            batch: source.batch_size().max(1),
            source,
            transforms,
            main,
            routes,
            errors,
            buffer: spec.channel_buffer_size.max(1) as usize,
            stats,
        })
    }

    /// Runs until `shutdown` is set or a failure retrying cannot fix. At
    /// shutdown the records already taken from the channel are written and
    /// committed first; those still in the channel are read again next time.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> Result<(), ConnectorError> {
        // An earlier run's failures are not this one's.
        self.stats.reading(None);
        self.stats.writing(None);
        let (tx, mut rx) = mpsc::channel::<Transformed>(self.buffer);
        let mut reader = tokio::spawn(read_loop(
            self.source.clone(),
            self.transforms.clone(),
            tx,
            self.stats.clone(),
            shutdown.clone(),
        ));
        let mut committing: Option<tokio::task::JoinHandle<()>> = None;
        let outcome = loop {
            let first = tokio::select! {
                biased;
                _ = shutdown.wait_for(|s| *s) => break Ok(()),
                record = rx.recv() => record,
            };
            let Some(first) = first else {
                // The reader ended: on a failure only connecting again can
                // fix, or at shutdown.
                break match (&mut reader).await {
                    Ok(read) => read,
                    Err(panicked) => Err(ConnectorError::Transient(format!("the reader stopped: {panicked}"))),
                };
            };
            let mut records = vec![first];
            while records.len() < self.batch {
                match rx.try_recv() {
                    Ok(record) => records.push(record),
                    Err(_) => break,
                }
            }
            let positions = match self.process(records, &mut shutdown).await {
                Ok(positions) => positions,
                // Stopped while retrying: a stop, not a failure; the batch
                // is read again next time.
                Err(ConnectorError::Stopped) => break Ok(()),
                Err(e) => break Err(e),
            };
            // Commits go in order, one at a time: this batch's waits for the
            // one before, which ran while this batch was written.
            if let Some(before) = committing.take() {
                let _ = before.await;
            }
            committing = Some(tokio::spawn(commit(self.source.clone(), self.stats.clone(), positions)));
        };
        reader.abort();
        // Whatever ended the run, the batch written last is committed.
        if let Some(last) = committing {
            let _ = last.await;
        }
        outcome
    }

    /// Writes every output of `records`; the positions to commit once
    /// they are written.
    async fn process(
        &self,
        records: Vec<Transformed>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Vec<Position>, ConnectorError> {
        let mut main = Vec::with_capacity(records.len());
        let mut routed: Vec<Vec<Message>> = self.routes.iter().map(|_| Vec::new()).collect();
        Stats::add(&self.stats.read, records.len());
        let mut refused = Vec::new();
        let mut positions = Vec::with_capacity(records.len());
        // The batch's memory is given back once it is written.
        let mut held = Vec::with_capacity(records.len());
        for Transformed {
            position,
            outcome,
            held: share,
        } in records
        {
            positions.push(position);
            held.push(share);
            let outputs = match outcome {
                Outcome::Refused(message) => {
                    refused.push(message);
                    continue;
                }
                Outcome::Outputs(outputs) => outputs,
            };
            if outputs.is_empty() {
                Stats::add(&self.stats.filtered, 1);
            }
            for out in outputs {
                match out.output {
                    Output::Route(i) if i < routed.len() => routed[i].push(out),
                    _ => main.push(out),
                }
            }
        }
        // The main sink last: an exactly-once one stores the position after
        // the batch, from where a new run resumes (past the other outputs).
        for (sink, messages) in self.routes.iter().zip(&routed) {
            self.write_reliably(sink.as_ref(), messages, None, shutdown).await?;
        }
        for message in &refused {
            self.refuse(message, shutdown).await?;
        }
        let position = self.exactly_once.as_ref().and_then(|digest| {
            self.source
                .resume_text(&positions)
                .map(|text| format!("{digest}{text}"))
        });
        self.write_reliably(self.main.as_ref(), &main, position.as_deref(), shutdown)
            .await?;
        Ok(positions)
    }

    /// Writes until it succeeds: the batch whole, else message by message
    /// with refused ones to the error sink. Without an error sink a refused
    /// message is retried with backoff: nothing is dropped silently. An
    /// exactly-once sink's `position` is written with the batch, or alone
    /// after the last message where they went one at a time.
    async fn write_reliably(
        &self,
        sink: &dyn Sink,
        messages: &[Message],
        position: Option<&str>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectorError> {
        if messages.is_empty() && position.is_none() {
            return Ok(());
        }
        let mut retries = RETRY.start();
        loop {
            match sink.write_at(messages, position).await {
                Ok(()) => {
                    Stats::add(&self.stats.written, messages.len());
                    self.stats.writing(None);
                    return Ok(());
                }
                Err(ConnectorError::Data(_)) => break,
                Err(e) if e.ends_run() => return Err(e),
                Err(e) => {
                    self.stats.write_failed(sink.target(), &e);
                    wait(&mut retries, &e, shutdown).await?
                }
            }
        }
        for message in messages {
            let mut retries = RETRY.start();
            loop {
                match sink.write(std::slice::from_ref(message)).await {
                    Ok(()) => {
                        Stats::add(&self.stats.written, 1);
                        self.stats.accepted();
                        self.stats.writing(None);
                        break;
                    }
                    Err(ConnectorError::Data(reason)) if self.errors.is_some() => {
                        self.to_error_sink(message, &reason, sink.target(), shutdown).await?;
                        break;
                    }
                    Err(e) if e.ends_run() => return Err(e),
                    Err(e) => {
                        match &e {
                            ConnectorError::Data(reason) => self.stats.refused(sink.target(), reason),
                            other => self.stats.write_failed(sink.target(), other),
                        }
                        wait(&mut retries, &e, shutdown).await?;
                    }
                }
            }
        }
        // One at a time, the rows stored no position: store it alone. A
        // crash before writes the rows again (at least once, for a batch
        // holding a refused row).
        if let Some(position) = position {
            let mut retries = RETRY.start();
            loop {
                match sink.write_at(&[], Some(position)).await {
                    Ok(()) => {
                        self.stats.writing(None);
                        break;
                    }
                    Err(e) if e.ends_run() => return Err(e),
                    Err(e) => {
                        self.stats.write_failed(sink.target(), &e);
                        wait(&mut retries, &e, shutdown).await?
                    }
                }
            }
        }
        Ok(())
    }
}

impl Pipeline {
    /// Writes `message` in an error envelope to the error sink, counted as
    /// failed.
    async fn to_error_sink(
        &self,
        message: &Message,
        reason: &str,
        origin: &str,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ConnectorError> {
        let Some(errors) = &self.errors else {
            return Ok(());
        };
        let envelope = json!({
            "error": {
                "message": reason,
                "timestamp": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
                "original_sink": origin,
                "metadata": message.metadata,
            },
            "original_message": message.data,
        });
        Box::pin(self.write_reliably(errors.as_ref(), &[Message::new(envelope)], None, shutdown)).await?;
        // The envelope is not a written message of the flow.
        self.stats.written.fetch_sub(1, Ordering::Relaxed);
        Stats::add(&self.stats.failed, 1);
        Ok(())
    }

    /// A message its source refused: to the error sink, or, without one,
    /// held (the flow stalls and says why) until it is stopped, since
    /// dropping it would lose it silently.
    async fn refuse(&self, message: &Message, shutdown: &mut watch::Receiver<bool>) -> Result<(), ConnectorError> {
        let reason = message
            .metadata
            .get(REFUSED)
            .map_or("refused by the source", String::as_str);
        if self.errors.is_some() {
            return self.to_error_sink(message, reason, "source", shutdown).await;
        }
        let error = ConnectorError::Data(reason.to_owned());
        let mut retries = RETRY.start();
        loop {
            self.stats.refused("the source", reason);
            wait(&mut retries, &error, shutdown).await?;
        }
    }
}

/// What a stored position of `spec`'s source begins with: 16 hex digits of
/// the SHA-256 of its type and configuration, and a space.
fn source_digest(spec: &DataFlowSpec) -> String {
    use sha2::Digest;
    let config = spec.source.config.as_ref().map(Value::to_string).unwrap_or_default();
    let digest = sha2::Sha256::digest(format!("{}\n{config}", spec.source.kind).as_bytes());
    format!("{} ", sless_runtime::hex::encode(&digest[..8]))
}

/// A record read and transformed, on its way to be written.
struct Transformed {
    position: Position,
    outcome: Outcome,
    /// Its share of [`MEMORY_BUDGET`], given back once it is written.
    held: tokio::sync::OwnedSemaphorePermit,
}

enum Outcome {
    /// What the transformations made of the message: none when filtered.
    Outputs(Vec<Message>),
    /// A message its source refused, kept whole for the error sink.
    Refused(Message),
}

impl Transformed {
    /// Transforms `record` once `budget` has room for what it became.
    async fn new(record: Record, transforms: &[Box<dyn Transform>], budget: &Arc<tokio::sync::Semaphore>) -> Self {
        let Record { message, position } = record;
        let (outcome, size) = if message.output == Output::Refused {
            let size = message.approx_size();
            (Outcome::Refused(message), size)
        } else {
            let outputs = transforms::apply_all(transforms, message);
            let size = outputs.iter().map(Message::approx_size).sum();
            (Outcome::Outputs(outputs), size)
        };
        let share = u32::try_from(size.min(MEMORY_BUDGET)).unwrap_or(u32::MAX);
        let held = budget
            .clone()
            .acquire_many_owned(share)
            .await
            .expect("the pipeline's budget is never closed");
        Self {
            position,
            outcome,
            held,
        }
    }
}

/// Reads and transforms into `tx`, which blocks when the processor is
/// behind, until shutdown or a failure only connecting again can fix (which
/// it returns). The next read starts as soon as a batch is in hand, so its
/// round trip to the source (a query running on the server) overlaps with
/// transforming and handing on this batch: at most one batch more is read
/// ahead, and a read cancelled at shutdown loses nothing.
async fn read_loop(
    source: Arc<dyn Source>,
    transforms: Arc<[Box<dyn Transform>]>,
    tx: mpsc::Sender<Transformed>,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectorError> {
    let budget = Arc::new(tokio::sync::Semaphore::new(MEMORY_BUDGET));
    let mut retries = RETRY.start();
    let mut reading = std::pin::pin!(source.read());
    // A read that finished while the batch before it was handed on.
    let mut finished = None;
    loop {
        let read = match finished.take() {
            Some(read) => read,
            None => tokio::select! {
                read = &mut reading => read,
                _ = shutdown.wait_for(|s| *s) => return Ok(()),
            },
        };
        match read {
            Ok(records) => {
                retries.succeeded();
                stats.reading(None);
                reading.set(source.read());
                let hand_on = async {
                    for record in records {
                        tx.send(Transformed::new(record, &transforms, &budget).await).await?;
                    }
                    Ok::<_, mpsc::error::SendError<Transformed>>(())
                };
                let mut hand_on = std::pin::pin!(hand_on);
                loop {
                    tokio::select! {
                        // The read first, so its request is on its way before the batch is transformed.
                        biased;
                        read = &mut reading, if finished.is_none() => finished = Some(read),
                        sent = &mut hand_on => match sent {
                            Ok(()) => break,
                            // The processor is gone.
                            Err(_) => return Ok(()),
                        },
                    }
                }
            }
            Err(e) if e.ends_run() => return Err(e),
            Err(e) => {
                stats.reading(Some(e.to_string()));
                if wait(&mut retries, &e, &mut shutdown).await.is_err() {
                    return Ok(());
                }
                reading.set(source.read());
            }
        }
    }
}

/// Commits a batch whose every output is written (a filtered record counts
/// as done): the source may move past it. A failed commit loses nothing,
/// the batch is only read again.
async fn commit(source: Arc<dyn Source>, stats: Arc<Stats>, positions: Vec<Position>) {
    match source.commit(&positions).await {
        Ok(()) => *stats.last_checkpoint.lock_unpoisoned() = Some(SystemTime::now()),
        Err(error) => tracing::warn!(%error, "cannot commit the batch to the source; it will be read again"),
    }
}

/// Waits before retrying after `error`; fails at shutdown so nothing is committed.
async fn wait(
    retries: &mut Retries,
    error: &ConnectorError,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ConnectorError> {
    tracing::warn!(%error, "dataflow step failed; retrying");
    if retries.wait(shutdown).await {
        Ok(())
    } else {
        Err(ConnectorError::Stopped)
    }
}

#[cfg(test)]
mod tests;
