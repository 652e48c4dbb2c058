//! The reading task of a `postgresql-cdc` source: the snapshot, then the
//! replication stream decoded into changes handed out a batch at a time,
//! and the standby status updates that confirm what is written.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::Value;
use tokio::sync::{Notify, mpsc};

use super::chunks::Chunking;
use super::pgoutput::{Decoder, Domains, settle_json_nulls};
use super::position::Order;
use super::slot::Plan;
use super::snapshot::{SnapshotMark, snapshot};
use super::streams::{Limits, Step, Streams};
use crate::ConnectorError;
use crate::message::Message;
use crate::sources::{Position, Record};
use crate::sql::replication::{self, ChangeStream, KEEPALIVE_ASK, StatusWriter, Streamed};
use sless_runtime::sync::Unpoisoned;

/// What the reading task and the pipeline's calls share.
pub(super) struct Shared {
    /// Every change before this LSN is written downstream.
    pub(super) done: AtomicU64,
    /// Where the slot may move with nothing in flight: the WAL a keepalive
    /// said was sent when every change handed out was written.
    pub(super) idle: AtomicU64,
    /// Why the reading task ended.
    pub(super) error: Mutex<Option<ConnectorError>>,
    /// The server asked for a status update.
    pub(super) reply: Notify,
    /// `done` moved.
    pub(super) wrote: Notify,
    /// The source is dropped: confirm what is written, and end.
    pub(super) closing: Notify,
}

/// What the reading task does.
pub(super) struct Job {
    pub(super) repl: replication::Connection,
    pub(super) plan: Plan,
    pub(super) tables: Vec<String>,
    pub(super) slot: String,
    pub(super) publication: String,
    /// The slot's confirmed position, or its consistent point when made now.
    pub(super) start: u64,
    pub(super) batch: usize,
    pub(super) mark: Arc<SnapshotMark>,
    /// What an exactly-once sink holds already.
    pub(super) skip: Option<Order>,
    /// The dataflow's own spill directory, and what it may keep there.
    pub(super) spill_dir: std::path::PathBuf,
    pub(super) spill: crate::budget::Allowance,
    /// A snapshot read in chunks while the stream runs, and the connection
    /// its statements go on.
    pub(super) chunks: Option<(Arc<Chunking>, replication::Connection)>,
    pub(super) domains: Domains,
}

/// Reads the snapshot and the stream into `out` until it fails; the error
/// is kept for [`Source::read`], which sees the channel close after the
/// records sent before it.
pub(super) async fn run(job: Option<Job>, mut out: Outbox, shared: Arc<Shared>) {
    let ended = match job {
        Some(job) => read_all(job, &mut out, &shared).await,
        None => Ok(()),
    };
    match ended {
        Err(e) => {
            *shared.error.lock_unpoisoned() = Some(e);
        }
        // Read everything there is to read: hand out nothing more.
        Ok(()) => {
            let _out = out;
            std::future::pending::<()>().await;
        }
    }
}

/// Records on their way to [`Source::read`], a batch's worth at a time:
/// one channel message (and one wake-up of the reader) a batch, not a record.
pub(super) struct Outbox {
    pub(super) out: mpsc::Sender<Vec<Record>>,
    pub(super) pending: Vec<Record>,
    /// A batch.
    pub(super) limit: usize,
}

impl Outbox {
    pub(super) async fn push(&mut self, mut message: Value, position: Position) -> Result<(), ConnectorError> {
        settle_json_nulls(&mut message);
        self.pending.push(Record {
            message: Message::new(message),
            position,
        });
        if self.pending.len() >= self.limit {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends what is pending (waiting while the reader is behind).
    pub(super) async fn flush(&mut self) -> Result<(), ConnectorError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.pending, Vec::with_capacity(self.limit));
        self.out.send(chunk).await.map_err(|_| ConnectorError::Stopped)
    }
}

/// What [`Source::read`] takes records from.
pub(super) struct Inbox {
    pub(super) records: mpsc::Receiver<Vec<Record>>,
    /// Records of a chunk beyond the last batch handed out.
    pub(super) leftover: std::collections::VecDeque<Record>,
}

async fn read_all(mut job: Job, out: &mut Outbox, shared: &Shared) -> Result<(), ConnectorError> {
    let chunks = job.chunks.take();
    if chunks.is_none() && matches!(job.plan, Plan::SnapshotThenStream | Plan::SnapshotOnly) {
        let any = snapshot(&mut job, out).await?;
        job.repl.query("COMMIT").await?;
        if !any {
            // No row whose writing completes it: it is complete.
            job.mark.written().await?;
        }
        if job.plan == Plan::SnapshotOnly {
            return Ok(());
        }
    }
    // Protocol 2 streams a transaction larger than the server's
    // logical_decoding_work_mem while it runs (PostgreSQL 14 on), instead of
    // the server spilling it to disk and sending it at its commit.
    let protocol = if job.repl.server_major >= 14 {
        "proto_version '2', streaming 'on'"
    } else {
        "proto_version '1'"
    };
    // The chunks' watermarks are logical messages (PostgreSQL 14 on).
    let messages = if chunks.is_some() { ", messages 'true'" } else { "" };
    let options = format!("{protocol}{messages}, publication_names '{}'", job.publication);
    let streams = Streams::new(job.spill_dir.clone(), Limits::default(), job.spill.clone());
    let (stream, status) = job.repl.start_replication(&job.slot, job.start, &options).await?;
    let confirming = confirm(status, job.start, shared);
    tokio::pin!(confirming);
    let chunking = chunks.as_ref().map(|(chunking, _)| chunking.clone());
    let changes = Changes::new(job.domains.clone(), job.start, job.skip, chunking);
    tokio::select! {
        read = stream_changes(stream, changes, streams, out, shared) => match read {
            // The source is dropped: confirm what it wrote first.
            Err(ConnectorError::Stopped) => confirming.await,
            other => other,
        },
        confirmed = &mut confirming => confirmed,
        driven = drive(chunks) => driven,
    }
}

/// Reads the snapshot's chunks, if any; ends only on an error.
async fn drive(chunks: Option<(Arc<Chunking>, replication::Connection)>) -> Result<(), ConnectorError> {
    if let Some((chunking, mut sql)) = chunks {
        chunking.drive(&mut sql).await?;
    }
    std::future::pending().await
}

/// The changes being handed out. A change confirms its transaction only
/// when it is the last one: the others carry the end of the transaction
/// before, so a crash in the middle of a transaction delivers it again from
/// its start. Changes at or before `skip` (what an exactly-once sink holds
/// already) are not handed out.
struct Changes {
    decoder: Decoder,
    decoded: Vec<Value>,
    /// The newest change and its order, held until the next one or its
    /// commit shows whether it is its transaction's last.
    held: Option<(Value, Order)>,
    /// The end of the last transaction read, and of the last one handed out.
    read_upto: u64,
    handed_upto: u64,
    next: Order,
    skip: Option<Order>,
    chunks: Option<Arc<Chunking>>,
}

impl Changes {
    /// The changes of a stream from `start`, after `skip`, with the
    /// snapshot's `chunks` laid over it.
    fn new(domains: Domains, start: u64, skip: Option<Order>, chunks: Option<Arc<Chunking>>) -> Self {
        let decoder = Decoder::new(domains);
        Self {
            decoder: match &chunks {
                Some(chunking) => decoder.watching(chunking.prefix.clone()),
                None => decoder,
            },
            decoded: Vec::new(),
            held: None,
            read_upto: start,
            handed_upto: start,
            next: Order::default(),
            skip,
            chunks,
        }
    }

    /// Decodes one pgoutput message and hands out what it completes.
    async fn feed(&mut self, lsn: u64, data: &[u8], out: &mut Outbox) -> Result<(), ConnectorError> {
        let end = self
            .decoder
            .feed(lsn, data, &mut self.decoded)
            .map_err(|e| ConnectorError::Closed(e.to_string()))?;
        if let Some(commit) = self.decoder.commit_lsn()
            && commit != self.next.commit
        {
            self.next = Order { commit, index: 0 };
        }
        if let Some(chunks) = &self.chunks {
            self.chunk(chunks.clone(), lsn).await?;
        }
        let skip = self.skip;
        for change in self.decoded.drain(..) {
            if let Some((previous, order)) = self.held.replace((change, self.next))
                && skip.is_none_or(|skip| order > skip)
            {
                out.push(previous, order.position(self.read_upto)).await?;
            }
            self.next.index += 1;
        }
        if let Some(end) = end {
            if let Some((last, order)) = self.held.take()
                && skip.is_none_or(|skip| order > skip)
            {
                out.push(last, order.position(end)).await?;
                self.handed_upto = end;
            }
            self.read_upto = end;
        }
        Ok(())
    }
}

impl Changes {
    /// Lays the decoded changes over the snapshot's chunk; at its high
    /// watermark, adds its rows to the decoded changes, in that
    /// transaction's place.
    async fn chunk(&mut self, chunks: Arc<Chunking>, lsn: u64) -> Result<(), ConnectorError> {
        for change in &self.decoded {
            chunks.observe(change);
        }
        let Some(content) = self.decoder.take_message() else {
            return Ok(());
        };
        let Some(mut handout) = chunks.watermark(&content, lsn) else {
            return Ok(());
        };
        let first = Order {
            commit: self.next.commit,
            index: self.next.index + self.decoded.len() as u32,
        };
        self.decoded.append(&mut handout.events);
        if let Some(done) = chunks.handed(first, handout) {
            chunks.skipped(done).await;
        }
        Ok(())
    }
}

/// Hands the stream's changes out as they are decoded; a transaction the
/// server streams while in progress (protocol 2) when it commits.
async fn stream_changes(
    mut stream: ChangeStream,
    mut changes: Changes,
    mut streams: Streams,
    out: &mut Outbox,
    shared: &Shared,
) -> Result<(), ConnectorError> {
    loop {
        // Nothing more arrived yet: hand out what is decoded.
        if !stream.buffered() {
            out.flush().await?;
        }
        match stream.next().await? {
            Streamed::Data { start: lsn, data } => match streams.take(lsn, &data).await? {
                Step::Decode => changes.feed(lsn, &data, out).await?,
                Step::Kept => {}
                Step::Commit { xid, begin, commit } => {
                    changes.feed(lsn, &begin, out).await?;
                    let mut replay = streams.replay(xid);
                    while let Some(messages) = replay.next().await? {
                        for (at, message) in messages {
                            changes.feed(at, &message, out).await?;
                        }
                    }
                    changes.feed(lsn, &commit, out).await?;
                }
            },
            Streamed::Keepalive { wal_end, reply } => {
                // Nothing open and everything handed out written: the
                // WAL sent so far holds nothing more of ours (a transaction
                // still streaming commits later, and comes again).
                if !changes.decoder.in_transaction() && shared.done.load(Ordering::Acquire) >= changes.handed_upto {
                    shared.idle.fetch_max(wal_end, Ordering::AcqRel);
                }
                if reply {
                    shared.reply.notify_one();
                }
            }
        }
    }
}

/// Confirms written changes to the server as they are written, at once
/// when it asks, and asks for a keepalive every [`KEEPALIVE_ASK`] (which
/// keeps an idle slot moving and shows the server is there). Ends once the
/// source is dropped, with what is written confirmed.
async fn confirm(mut status: StatusWriter, start: u64, shared: &Shared) -> Result<(), ConnectorError> {
    let mut sent = start;
    let mut asked: Option<Instant> = None;
    let mut tick = tokio::time::interval(KEEPALIVE_ASK / 4);
    loop {
        let (asked_for, closing) = tokio::select! {
            _ = tick.tick() => (false, false),
            () = shared.wrote.notified() => (false, false),
            () = shared.reply.notified() => (true, false),
            () = shared.closing.notified() => (false, true),
        };
        let upto = shared
            .done
            .load(Ordering::Acquire)
            .max(shared.idle.load(Ordering::Acquire))
            .max(start);
        let ask = asked.is_none_or(|at| at.elapsed() >= KEEPALIVE_ASK);
        if upto != sent || ask || asked_for {
            status.status(upto, ask).await?;
            sent = upto;
            if ask {
                asked = Some(Instant::now());
            }
        }
        if closing {
            return Ok(());
        }
    }
}
