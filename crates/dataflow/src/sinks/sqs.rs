//! SQS sink: SendMessageBatch, ten messages a request, each message's JSON
//! as its body. A batch is written once every entry is acknowledged; an
//! entry SQS refuses for its content is `ConnectorError::Data` (to the
//! error sink). On a FIFO queue the group is the `key` metadata (or the
//! queue's one group `sless`) and the deduplication id names the message's
//! place in what this sink wrote (its random prefix, the batch's number, the
//! message's index), so a batch retried after a failure is not delivered
//! twice within SQS's 5 minutes while messages with equal bodies all are. A
//! restarted processor, or a batch that falls back to one message at a time
//! after SQS refused one, may deliver some messages twice (at least once).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};

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
    /// This sink's part of every FIFO deduplication id: another run's
    /// batch numbers start again at 0.
    run: u64,
    /// Batches written whole: the next batch's number, kept while it is retried.
    batches: AtomicU64,
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
        Ok(Self {
            client,
            fifo,
            run: rand::random(),
            batches: AtomicU64::new(0),
        })
    }
}

impl SqsSink {
    /// The entry of the `index`th message of batch `batch`, `id` in its request.
    fn entry(&self, id: usize, batch: u64, index: usize, message: &Message) -> Result<Value, ConnectorError> {
        let body = serde_json::to_string(&message.data).map_err(|e| ConnectorError::Data(e.to_string()))?;
        let mut entry = json!({"Id": id.to_string(), "MessageBody": body});
        if self.fifo {
            let group = message.metadata.get("key").map_or("sless", String::as_str);
            entry["MessageGroupId"] = json!(group);
            entry["MessageDeduplicationId"] = json!(dedup_id(self.run, batch, index));
        }
        Ok(entry)
    }

    /// After a refusal the pipeline sends the batch's messages one at a
    /// time (and one may go to the error sink instead): those are other
    /// contents, so they get other numbers, never an id a sent message had.
    fn refused(&self) {
        self.batches.fetch_add(1, Ordering::AcqRel);
    }
}

/// At most 50 characters of `[0-9a-f-]` (SQS allows 128).
fn dedup_id(run: u64, batch: u64, index: usize) -> String {
    format!("{run:016x}-{batch:x}-{index:x}")
}

#[async_trait]
impl Sink for SqsSink {
    fn target(&self) -> &str {
        self.client.queue_url()
    }

    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError> {
        // The pipeline writes one batch at a time and retries it until it is
        // written, so the number stays the batch's through its retries.
        let number = self.batches.load(Ordering::Acquire);
        for (c, chunk) in batch.chunks(MAX_BATCH).enumerate() {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| self.entry(i, number, c * MAX_BATCH + i, m))
                .collect::<Result<Vec<_>, _>>()?;
            let out = self
                .client
                .call("SendMessageBatch", json!({"Entries": entries}))
                .await
                .inspect_err(|e| {
                    if matches!(e, ConnectorError::Data(_)) {
                        self.refused();
                    }
                })?;
            if let Some(failed) = out["Failed"].as_array().filter(|f| !f.is_empty()) {
                let reason = format!(
                    "SQS refused {} of {} messages: {}",
                    failed.len(),
                    chunk.len(),
                    failed[0]["Message"].as_str().unwrap_or("no reason")
                );
                let sender = failed.iter().all(|f| f["SenderFault"].as_bool().unwrap_or(true));
                return Err(if sender {
                    self.refused();
                    ConnectorError::Data(reason)
                } else {
                    ConnectorError::Transient(reason)
                });
            }
        }
        self.batches.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::dedup_id;

    #[test]
    fn deduplication_ids_are_distinct_per_place_and_within_sqs_limits() {
        let ids = [
            dedup_id(7, 0, 0),
            dedup_id(7, 0, 1),
            dedup_id(7, 1, 0),
            dedup_id(8, 0, 0),
        ];
        let distinct: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), ids.len(), "{ids:?}");
        let longest = dedup_id(u64::MAX, u64::MAX, usize::MAX);
        assert!(longest.len() <= 128 && longest.chars().all(|c| c.is_ascii_hexdigit() || c == '-'));
    }
}
