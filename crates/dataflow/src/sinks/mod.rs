//! Sinks: where a dataflow writes to.

pub mod clickhouse;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nessie")]
pub mod nessie;
pub mod postgres;
pub mod sqs;
#[cfg(feature = "trino")]
pub mod trino;

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
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

    /// `exactlyOnce` as the spec sets it: `None` when unset (on where the
    /// source can resume from a stored position), `Some(false)` off. A sink
    /// that cannot store a position with its writes keeps the default.
    fn exactly_once(&self) -> Option<bool> {
        Some(false)
    }

    /// The source position an exactly-once sink stored with the last batch
    /// it wrote, if any.
    async fn stored_position(&self) -> Result<Option<String>, ConnectorError> {
        Ok(None)
    }

    /// Writes a batch and, in the same transaction, `position` (exactly-once
    /// sinks; the others ignore it): the batch and its position are both
    /// stored or neither is. An empty batch stores the position alone.
    async fn write_at(&self, batch: &[Message], _position: Option<&str>) -> Result<(), ConnectorError> {
        self.write(batch).await
    }
}

/// A sink type: a [`Component`] that connects. One file holds each;
/// [`crate::registry::SINKS`] lists them.
#[async_trait]
pub trait Open: Component + Sink {
    async fn open(config: &Self::Config, ctx: &PipelineContext) -> Result<Self, ConnectorError>;

    /// Removes what the sink keeps on its server for this dataflow (an
    /// exactly-once sink's stored position), once the dataflow is deleted
    /// and stopped.
    async fn release(_config: &Self::Config, _ctx: &PipelineContext) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// A sink being connected.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Sink>, ConnectorError>> + Send + 'a>>;

pub type OpenFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Opening<'a>;

/// A sink's server-side state being removed.
type Releasing<'a> = Pin<Box<dyn Future<Output = Result<(), ConnectorError>> + Send + 'a>>;

type ReleaseFn = for<'a> fn(&'a Value, &'a PipelineContext) -> Releasing<'a>;

/// How a sink starts and how its server-side state is removed.
pub struct Lifecycle {
    pub(crate) open: OpenFn,
    pub(crate) release: ReleaseFn,
}

/// A registry entry of a sink.
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
        Ok(Box::new(C::open(&config, ctx).await?) as Box<dyn Sink>)
    })
}
