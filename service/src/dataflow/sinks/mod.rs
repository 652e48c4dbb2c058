//! Sinks: where a dataflow writes to.

pub mod kafka;
pub mod postgres;

use async_trait::async_trait;
use serde_json::Value;

use super::ConnectorError;
use super::egress::EgressPolicy;
use super::message::Message;
use crate::model::dataflow::ConnectorSpec;

#[async_trait]
pub trait Sink: Send + Sync {
    /// What the sink writes to (a table, a topic), for error envelopes.
    fn target(&self) -> &str;

    /// Writes a batch; `Ok` means every message of it is stored durably.
    /// `ConnectorError::Data` means the data was refused and retrying the
    /// same batch cannot help.
    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError>;
}

/// Connects the sink of a spec.
pub async fn connect(spec: &ConnectorSpec, egress: &EgressPolicy) -> Result<Box<dyn Sink>, ConnectorError> {
    let config = spec.config.clone().unwrap_or(Value::Null);
    Ok(match spec.kind.as_str() {
        "postgresql" => Box::new(postgres::PostgresSink::connect(&super::config(config)?, egress).await?),
        "kafka" => Box::new(kafka::KafkaSink::connect(&super::config(config)?, egress).await?),
        other => {
            return Err(ConnectorError::Config(format!(
                "the {other} connector is not supported yet"
            )));
        }
    })
}
