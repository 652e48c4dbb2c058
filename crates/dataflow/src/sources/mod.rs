//! Sources: where a dataflow reads from. A source hands out records in
//! order and learns, through `commit`, which of them every sink has written.

pub mod clickhouse;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nessie")]
pub mod nessie;
mod polling;
pub mod postgres;
pub mod postgres_cdc;
pub mod sqs;
#[cfg(feature = "trino")]
pub mod trino;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::ConnectorError;
use crate::component::{self, Component};
use crate::context::PipelineContext;
use crate::message::Message;

/// Where a record sits in its source, so the source can resume after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// A polling source's row position, as its checkpoint text.
    Column(String),
    /// A Kafka record.
    Offset { partition: i32, offset: i64 },
    /// An SQS message, by the receipt that deletes it.
    Receipt(String),
    /// A change captured from PostgreSQL: `confirms` is the slot position
    /// that writing it (and everything before it) lets the source confirm;
    /// `commit` (its transaction's commit LSN) and `index` (its place in
    /// the transaction) order every change.
    Change { confirms: u64, commit: u64, index: u32 },
    /// A row of a PostgreSQL CDC snapshot; `last` completes the snapshot.
    SnapshotRow { last: bool },
}

/// One record read from a source.
#[derive(Debug, Clone)]
pub struct Record {
    pub message: Message,
    pub position: Position,
}

/// Records processed, written and committed together, unless the source says otherwise.
pub const DEFAULT_BATCH: usize = 1000;

#[async_trait]
pub trait Source: Send + Sync {
    /// The most records the pipeline processes, writes and commits at once:
    /// a crash replays at most two such batches (one being written, one
    /// being committed).
    fn batch_size(&self) -> usize {
        DEFAULT_BATCH
    }

    /// The next records after those already returned, waiting for them as
    /// long as it takes. Cancelling the call loses nothing.
    async fn read(&self) -> Result<Vec<Record>, ConnectorError>;

    /// Records that the records at `done` (in read order, possibly after
    /// earlier batches) are written everywhere: the source may resume
    /// after them.
    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError>;

    /// For an exactly-once sink, which stores it in the same transaction as
    /// a batch: the text of where the source resumes once the records at
    /// `done` (the batch's, in read order, after every earlier batch's) are
    /// written. A source opened with it in [`PipelineContext::resume`] hands
    /// out nothing at or before it. `None`: nothing to store for these
    /// records; a source that cannot resume so keeps the default.
    fn resume_text(&self, _done: &[Position]) -> Option<String> {
        None
    }
}

/// A source type: a [`Component`] that connects. One file holds each;
/// [`crate::registry::SOURCES`] lists them.
#[async_trait]
pub trait Open: Component + Source {
    /// Whether it resumes from the texts of [`Source::resume_text`], so
    /// that an exactly-once sink can be used.
    const RESUMABLE: bool = false;

    async fn open(config: &Self::Config, ctx: &PipelineContext) -> Result<Self, ConnectorError>;

    /// Removes what the source made on its server for this dataflow (a
    /// replication slot), once the dataflow is deleted and stopped.
    async fn release(_config: &Self::Config, _ctx: &PipelineContext) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// A source being connected.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn Source>, ConnectorError>> + Send + 'a>>;

pub type OpenFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Opening<'a>;

/// A source's server-side state being removed.
type Releasing<'a> = Pin<Box<dyn Future<Output = Result<(), ConnectorError>> + Send + 'a>>;

type ReleaseFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Releasing<'a>;

/// How a source starts and how its server-side state is removed.
pub struct Lifecycle {
    pub(crate) open: OpenFn,
    pub(crate) release: ReleaseFn,
    pub(crate) resumable: bool,
}

/// A registry entry of a source.
pub type Descriptor = component::Descriptor<Lifecycle>;

impl Descriptor {
    pub const fn of<C: Open>() -> Self {
        Self {
            kind: C::KIND,
            check: component::check_fn::<C>,
            check_scope: component::check_scope_fn::<C>,
            start: Lifecycle {
                open: open::<C>,
                release: release::<C>,
                resumable: C::RESUMABLE,
            },
        }
    }
}

fn release<'a, C: Open>(config: &'a Value, ctx: &'a PipelineContext) -> Releasing<'a> {
    Box::pin(async move {
        let config = component::connector_config::<C>(config)?;
        C::release(&config, ctx).await
    })
}

fn open<'a, C: Open>(config: &'a Value, ctx: &'a PipelineContext) -> Opening<'a> {
    Box::pin(async move {
        let config = component::connector_config::<C>(config)?;
        Ok(Arc::new(C::open(&config, ctx).await?) as Arc<dyn Source>)
    })
}
