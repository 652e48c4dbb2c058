//! SQS sink: SendMessageBatch, ten messages a request, each message's JSON
//! as its body. A batch is written once every entry is acknowledged; an
//! entry SQS refuses for its content is `ConnectorError::Data` (to the
//! error sink). On a FIFO queue the group is the `key` metadata (or the
//! queue's one group `sless`) and the deduplication id the body's SHA-256,
//! so a retried batch is not delivered twice within SQS's 5 minutes.

use async_trait::async_trait;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::Sink;
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sqs_client::{SqsClient, SqsConfig};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

const MAX_BATCH: usize = 10;

pub struct SqsSink {
    client: SqsClient,
    fifo: bool,
}

impl Component for SqsSink {
    const KIND: &'static str = crate::sqs_client::KIND;
    type Config = SqsConfig;

    fn check(config: &SqsConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(Role::Sink, path, errors);
    }
}

#[async_trait]
impl super::Open for SqsSink {
    async fn open(config: &SqsConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let client = SqsClient::connect(config, ctx).await?;
        let fifo = client.queue_url().trim_end_matches('/').ends_with(".fifo");
        Ok(Self { client, fifo })
    }
}

impl SqsSink {
    fn entry(&self, i: usize, message: &Message) -> Result<Value, ConnectorError> {
        let body = serde_json::to_string(&message.data).map_err(|e| ConnectorError::Data(e.to_string()))?;
        let mut entry = json!({"Id": i.to_string(), "MessageBody": body});
        if self.fifo {
            let group = message.metadata.get("key").map_or("sless", String::as_str);
            entry["MessageGroupId"] = json!(group);
            entry["MessageDeduplicationId"] = json!(sless_runtime::hex::encode(&Sha256::digest(body.as_bytes())));
        }
        Ok(entry)
    }
}

#[async_trait]
impl Sink for SqsSink {
    fn target(&self) -> &str {
        self.client.queue_url()
    }

    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError> {
        for chunk in batch.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| self.entry(i, m))
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .call("SendMessageBatch", json!({"Entries": entries}))
                .await?;
            if let Some(failed) = out["Failed"].as_array().filter(|f| !f.is_empty()) {
                let reason = format!(
                    "SQS refused {} of {} messages: {}",
                    failed.len(),
                    chunk.len(),
                    failed[0]["Message"].as_str().unwrap_or("no reason")
                );
                let sender = failed.iter().all(|f| f["SenderFault"].as_bool().unwrap_or(true));
                return Err(if sender {
                    ConnectorError::Data(reason)
                } else {
                    ConnectorError::Transient(reason)
                });
            }
        }
        Ok(())
    }
}
