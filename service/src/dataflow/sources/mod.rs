//! Sources: where a dataflow reads from. A source hands out records in
//! order and learns, through `commit`, which of them every sink has written.

pub mod kafka;
pub mod postgres;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::ConnectorError;
use super::message::Message;
use super::pipeline::PipelineContext;
use crate::model::dataflow::ConnectorSpec;

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

/// Connects the source of a spec.
pub async fn connect(spec: &ConnectorSpec, ctx: &PipelineContext) -> Result<Arc<dyn Source>, ConnectorError> {
    let config = spec.config.clone().unwrap_or(Value::Null);
    Ok(match spec.kind.as_str() {
        "postgresql" => Arc::new(postgres::PostgresSource::connect(&super::config(config)?, ctx).await?),
        "kafka" => Arc::new(kafka::KafkaSource::connect(&super::config(config)?, ctx).await?),
        other => {
            return Err(ConnectorError::Config(format!(
                "the {other} connector is not supported yet"
            )));
        }
    })
}
