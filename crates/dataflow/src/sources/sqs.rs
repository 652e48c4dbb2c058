//! SQS source: long-polls a queue (a tenant's sless queue service or any
//! SQS endpoint), gathering up to 100 messages a read from several
//! receives. A message is deleted only through `commit`, once every
//! output of its batch is written, so a crash re-delivers it when its
//! visibility timeout ends. A JSON body is the message; any other text
//! becomes `{"body": text}`. The SQS message id is metadata `message_id`.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{Position, Record, Source};
use crate::ConnectorError;
use crate::component::Component;
use crate::context::PipelineContext;
use crate::message::Message;
use crate::sqs_client::{DEFAULT_VISIBILITY_SECONDS, DEFAULT_WAIT_SECONDS, SqsClient, SqsConfig};
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

/// SQS's most messages per ReceiveMessage and per DeleteMessageBatch.
const MAX_BATCH: usize = 10;
/// Most messages one read gathers (from several receives), so the sinks
/// write, and the source deletes, in batches larger than SQS's ten.
const READ_BATCH: usize = 100;

pub struct SqsSource {
    client: SqsClient,
    wait: u64,
    visibility: u64,
}

impl Component for SqsSource {
    const KIND: &'static str = crate::sqs_client::KIND;
    type Config = SqsConfig;

    fn check(config: &SqsConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(Role::Source, path, errors);
    }
}

#[async_trait]
impl super::Open for SqsSource {
    async fn open(config: &SqsConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Ok(Self {
            client: SqsClient::connect(config, ctx).await?,
            wait: config.wait_time_seconds.unwrap_or(DEFAULT_WAIT_SECONDS),
            visibility: config.visibility_timeout.unwrap_or(DEFAULT_VISIBILITY_SECONDS),
        })
    }
}

/// The message a received SQS message becomes.
fn record(message: &Value) -> Option<Record> {
    let receipt = message["ReceiptHandle"].as_str()?.to_owned();
    let body = message["Body"].as_str().unwrap_or_default();
    let data = serde_json::from_str::<Value>(body)
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({"body": body}));
    let mut out = Message::new(data);
    if let Some(id) = message["MessageId"].as_str() {
        out.metadata.insert("message_id".into(), id.to_owned());
    }
    Some(Record {
        message: out,
        position: Position::Receipt(receipt),
    })
}

impl SqsSource {
    /// One ReceiveMessage of up to ten messages, waiting up to `wait` s.
    async fn receive(&self, wait: u64) -> Result<Vec<Record>, ConnectorError> {
        let out = self
            .client
            .call(
                "ReceiveMessage",
                json!({
                    "MaxNumberOfMessages": MAX_BATCH,
                    "WaitTimeSeconds": wait,
                    "VisibilityTimeout": self.visibility,
                }),
            )
            .await
            .map_err(|e| match e {
                // A refused receive is not the data's fault: retry.
                ConnectorError::Data(m) => ConnectorError::Transient(m),
                other => other,
            })?;
        Ok(out["Messages"]
            .as_array()
            .map(|m| m.iter().filter_map(record).collect())
            .unwrap_or_default())
    }
}

#[async_trait]
impl Source for SqsSource {
    fn batch_size(&self) -> usize {
        READ_BATCH
    }

    /// Long-polls until messages come, then takes what else is waiting
    /// (without waiting, in concurrent receives) up to [`READ_BATCH`].
    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        loop {
            let mut records = self.receive(self.wait).await?;
            if records.is_empty() {
                if self.wait == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                continue;
            }
            // A full receive says more may be waiting: the rest at once,
            // each receive a round trip of its own. What was taken is
            // returned even if a further receive fails: it is deleted only
            // once written, either way.
            let more = if records.len() < MAX_BATCH {
                0
            } else {
                (READ_BATCH - records.len()) / MAX_BATCH
            };
            for taken in futures_util::future::join_all((0..more).map(|_| self.receive(0))).await {
                records.extend(taken.unwrap_or_default());
            }
            return Ok(records);
        }
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        let receipts: Vec<&str> = done
            .iter()
            .filter_map(|position| match position {
                Position::Receipt(receipt) => Some(receipt.as_str()),
                _ => None,
            })
            .collect();
        // Every chunk at once; a chunk that fails leaves its messages to
        // come back when their visibility timeout ends.
        let deletes = receipts.chunks(MAX_BATCH).map(|chunk| async move {
            let entries: Vec<Value> = chunk
                .iter()
                .enumerate()
                .map(|(i, receipt)| json!({"Id": i.to_string(), "ReceiptHandle": receipt}))
                .collect();
            let out = self
                .client
                .call("DeleteMessageBatch", json!({"Entries": entries}))
                .await
                .map_err(|e| ConnectorError::Transient(e.to_string()))?;
            match out["Failed"].as_array().filter(|f| !f.is_empty()) {
                Some(failed) => Err(ConnectorError::Transient(format!(
                    "SQS DeleteMessageBatch refused {} of {} messages: {}",
                    failed.len(),
                    chunk.len(),
                    failed[0]["Message"].as_str().unwrap_or("no reason")
                ))),
                None => Ok(()),
            }
        });
        futures_util::future::join_all(deletes).await.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::Open;

    /// A sless queue engine on loopback with one queue holding `messages`;
    /// the source's config for it.
    async fn queue_of(messages: usize) -> (sless_testkit::sqs::LoopbackEngine, SqsConfig) {
        let loopback = sless_testkit::sqs::LoopbackEngine::start().await;
        let url = loopback.queue("q").await;
        for n in 0..messages {
            let body = json!({ "n": n }).to_string();
            loopback
                .engine
                .handle("SendMessage", &json!({"QueueUrl": url, "MessageBody": body}))
                .await
                .unwrap();
        }
        let config = serde_json::from_value(json!({
            "queueUrl": url, "accessKeyId": "k", "secretAccessKey": "s", "waitTimeSeconds": 1
        }))
        .unwrap();
        (loopback, config)
    }

    #[tokio::test]
    async fn a_read_takes_up_to_a_hundred_waiting_messages_and_a_commit_deletes_them_all() {
        let (loopback, config) = queue_of(125).await;
        let engine = &loopback.engine;
        let ctx = PipelineContext {
            id: "t/flow".into(),
            checkpoint: None,
            egress: Default::default(),
            queue_services: None,
            resume: None,
            snapshots: Vec::new(),
            positions_key: None,
            budget: crate::budget::FlowBudget::temporary(),
        };
        let source = SqsSource::open(&config, &ctx).await.unwrap();
        let (first, second) = (source.read().await.unwrap(), source.read().await.unwrap());
        assert_eq!((first.len(), second.len()), (READ_BATCH, 25));
        let numbers: std::collections::BTreeSet<u64> = first
            .iter()
            .chain(&second)
            .map(|r| r.message.data["n"].as_u64().unwrap())
            .collect();
        assert_eq!(numbers.len(), 125, "each message once");
        let done: Vec<Position> = first.into_iter().chain(second).map(|r| r.position).collect();
        source.commit(&done).await.unwrap();
        let attributes = engine
            .handle(
                "GetQueueAttributes",
                &json!({"QueueUrl": config.queue_url, "AttributeNames": ["All"]}),
            )
            .await
            .unwrap();
        let left = |name: &str| attributes["Attributes"][name].as_str().map(str::to_owned);
        assert_eq!(
            (
                left("ApproximateNumberOfMessages"),
                left("ApproximateNumberOfMessagesNotVisible")
            ),
            (Some("0".into()), Some("0".into())),
            "{attributes}"
        );
    }

    #[test]
    fn json_bodies_are_messages_and_text_is_wrapped() {
        let r = record(&json!({"ReceiptHandle": "r1", "MessageId": "m1", "Body": "{\"id\": 7}"})).unwrap();
        assert_eq!(r.message.data, json!({"id": 7}));
        assert_eq!(r.message.metadata["message_id"], "m1");
        assert_eq!(r.position, Position::Receipt("r1".into()));
        let text = record(&json!({"ReceiptHandle": "r2", "Body": "plain [1]"})).unwrap();
        assert_eq!(text.message.data, json!({"body": "plain [1]"}));
        assert!(record(&json!({"Body": "no receipt"})).is_none());
    }
}
