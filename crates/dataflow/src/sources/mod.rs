//! Sources: where a dataflow reads from. A source hands out records in
//! order and learns, through `commit`, which of them every sink has written.

pub mod kafka;
pub mod postgres;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use sless_model::ValidationErrors;
use sless_model::dataflow::ConnectorSpec;

use crate::ConnectorError;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::registry::{self, CheckFn};

/// Where a record sits in its source, so the source can resume after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// A polling source's row position, as its checkpoint text.
    Column(String),
    /// A Kafka record.
    Offset { partition: i32, offset: i64 },
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
    /// a crash replays at most this many.
    fn batch_size(&self) -> usize {
        DEFAULT_BATCH
    }

    /// The next records after those already returned, waiting for them as
    /// long as it takes. Cancelling the call loses nothing.
    async fn read(&self) -> Result<Vec<Record>, ConnectorError>;

    /// Records that `done` (in read order, possibly after earlier batches)
    /// is written everywhere: the source may resume after it.
    async fn commit(&self, done: &[Record]) -> Result<(), ConnectorError>;
}

/// A source type: its `config`, the rules on it, and how it connects. One
/// file holds each; [`registry::SOURCES`] lists them.
#[async_trait]
pub trait Component: Source + Sized + 'static {
    /// The `type` a spec names it with.
    const KIND: &'static str;
    type Config: serde::de::DeserializeOwned + Send + Sync;

    /// Field rules beyond the config's types, each problem at its field
    /// under `path`.
    fn check(config: &Self::Config, path: &str, errors: &mut ValidationErrors);

    async fn open(config: &Self::Config, ctx: &PipelineContext) -> Result<Self, ConnectorError>;
}

/// A connector being connected.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Arc<dyn Source>, ConnectorError>> + Send + 'a>>;

type OpenFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Opening<'a>;

/// One registry entry: a source [`Component`] with its type erased.
pub struct Descriptor {
    pub kind: &'static str,
    pub check: CheckFn,
    open: OpenFn,
}

impl Descriptor {
    pub const fn of<C: Component>() -> Self {
        Self {
            kind: C::KIND,
            check: check::<C>,
            open: open::<C>,
        }
    }
}

fn check<C: Component>(config: &Value, path: &str, errors: &mut ValidationErrors) {
    if let Some(c) = registry::parse::<C::Config>(config, path, errors) {
        C::check(&c, path, errors);
    }
}

fn open<'a, C: Component>(config: &'a Value, ctx: &'a PipelineContext) -> Opening<'a> {
    Box::pin(async move {
        let config: C::Config = crate::config(config.clone())?;
        Ok(Arc::new(C::open(&config, ctx).await?) as Arc<dyn Source>)
    })
}

/// Connects the source of a spec.
pub async fn connect(spec: &ConnectorSpec, ctx: &PipelineContext) -> Result<Arc<dyn Source>, ConnectorError> {
    let descriptor = registry::source(&spec.kind)
        .ok_or_else(|| ConnectorError::Config(format!("the {} connector is not supported as a source", spec.kind)))?;
    (descriptor.open)(spec.config.as_ref().unwrap_or(&Value::Null), ctx).await
}
