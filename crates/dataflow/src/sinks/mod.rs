//! Sinks: where a dataflow writes to.

pub mod kafka;
pub mod postgres;

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde_json::Value;
use sless_model::ValidationErrors;
use sless_model::dataflow::ConnectorSpec;

use crate::ConnectorError;
use crate::egress::EgressPolicy;
use crate::message::Message;
use crate::registry::{self, CheckFn};

#[async_trait]
pub trait Sink: Send + Sync {
    /// What the sink writes to (a table, a topic), for error envelopes.
    fn target(&self) -> &str;

    /// Writes a batch; `Ok` means every message of it is stored durably.
    /// `ConnectorError::Data` means the data was refused and retrying the
    /// same batch cannot help.
    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError>;
}

/// A sink type: its `config`, the rules on it, and how it connects. One
/// file holds each; [`registry::SINKS`] lists them.
#[async_trait]
pub trait Component: Sink + Sized + 'static {
    /// The `type` a spec names it with.
    const KIND: &'static str;
    type Config: serde::de::DeserializeOwned + Send + Sync;

    /// Field rules beyond the config's types, each problem at its field
    /// under `path`.
    fn check(config: &Self::Config, path: &str, errors: &mut ValidationErrors);

    async fn open(config: &Self::Config, egress: &EgressPolicy) -> Result<Self, ConnectorError>;
}

/// A connector being connected.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Sink>, ConnectorError>> + Send + 'a>>;

type OpenFn = for<'a> fn(&'a Value, &'a EgressPolicy) -> Opening<'a>;

/// One registry entry: a sink [`Component`] with its type erased.
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

fn open<'a, C: Component>(config: &'a Value, egress: &'a EgressPolicy) -> Opening<'a> {
    Box::pin(async move {
        let config: C::Config = crate::config(config.clone())?;
        Ok(Box::new(C::open(&config, egress).await?) as Box<dyn Sink>)
    })
}

/// Connects the sink of a spec.
pub async fn connect(spec: &ConnectorSpec, egress: &EgressPolicy) -> Result<Box<dyn Sink>, ConnectorError> {
    let descriptor = registry::sink(&spec.kind)
        .ok_or_else(|| ConnectorError::Config(format!("the {} connector is not supported as a sink", spec.kind)))?;
    (descriptor.open)(spec.config.as_ref().unwrap_or(&Value::Null), egress).await
}
