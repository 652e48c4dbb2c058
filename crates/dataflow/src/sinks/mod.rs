//! Sinks: where a dataflow writes to.

pub mod clickhouse;
pub mod kafka;
pub mod postgres;
pub mod sqs;

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;

use crate::ConnectorError;
use crate::component::{self, Component};
use crate::context::PipelineContext;
use crate::message::Message;

#[async_trait]
pub trait Sink: Send + Sync {
    /// What the sink writes to (a table, a topic), for error envelopes.
    fn target(&self) -> &str;

    /// Writes a batch; `Ok` means every message of it is stored durably.
    /// `ConnectorError::Data` means the data was refused and retrying the
    /// same batch cannot help.
    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError>;
}

/// A sink type: a [`Component`] that connects. One file holds each;
/// [`crate::registry::SINKS`] lists them.
#[async_trait]
pub trait Open: Component + Sink {
    async fn open(config: &Self::Config, ctx: &PipelineContext) -> Result<Self, ConnectorError>;
}

/// A sink being connected.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Sink>, ConnectorError>> + Send + 'a>>;

pub type OpenFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Opening<'a>;

/// A registry entry of a sink.
pub type Descriptor = component::Descriptor<OpenFn>;

impl Descriptor {
    pub const fn of<C: Open>() -> Self {
        Self {
            kind: C::KIND,
            check: component::check_fn::<C>,
            start: open::<C>,
        }
    }
}

fn open<'a, C: Open>(config: &'a Value, ctx: &'a PipelineContext) -> Opening<'a> {
    Box::pin(async move {
        let config = C::Config::deserialize(config).map_err(|e| ConnectorError::Config(e.to_string()))?;
        Ok(Box::new(C::open(&config, ctx).await?) as Box<dyn Sink>)
    })
}
