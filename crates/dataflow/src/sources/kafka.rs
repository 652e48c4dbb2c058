//! Kafka source: a member of a consumer group on one topic. Offsets are
//! stored in the group only through `commit`, after every sink wrote the
//! records, so a crash or a rebalance re-delivers instead of losing.
//! With `format: avro` a value is decoded with its writer's schema from the
//! registry; one that cannot be is refused whole to the error sink.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;
use std::time::Duration;

use super::{Position, Record, Source};
use crate::ConnectorError;
use crate::avro::{self, schema_registry::SchemaRegistry};
use crate::component::{Component, inline};
use crate::context::PipelineContext;
use crate::kafka_client::{Format, KafkaConfig, check_brokers, check_reachable, classify, client_config, topic};
use crate::message::Message;
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;
use sless_runtime::backoff::Backoff;
use sless_runtime::sync::Unpoisoned;

pub struct KafkaSource {
    consumer: Arc<StreamConsumer>,
    topic: String,
    /// With `format: avro`: where the writers' schemas are.
    registry: Option<SchemaRegistry>,
    /// The highest offset of each partition an exactly-once sink holds
    /// already: not handed out again.
    skip: BTreeMap<i32, i64>,
    /// The highest offset of each partition handed to an exactly-once sink
    /// with its batch, from `skip` on.
    written: std::sync::Mutex<BTreeMap<i32, i64>>,
}

/// An exactly-once sink's text of the highest offset written per partition.
fn offsets_text(offsets: &BTreeMap<i32, i64>) -> String {
    // A map of numbers serialises infallibly.
    format!("kafka:{}", serde_json::to_string(offsets).unwrap_or_default())
}

fn parse_offsets(text: &str) -> Option<BTreeMap<i32, i64>> {
    serde_json::from_str(text.strip_prefix("kafka:")?).ok()
}

/// Waits between attempts to reach the schema registry for a record in hand.
const REGISTRY_RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// The group a dataflow joins when its spec names none: one per dataflow,
/// so two dataflows (or two tenants) never split a topic's records.
pub fn default_group(flow_id: &str) -> String {
    format!("sless.{}", flow_id.replace('/', "."))
}

/// What every consumer group of `tenant`'s dataflows begins with, its
/// default ones included. Tenant ids and dataflow names hold no dot.
pub fn group_prefix(tenant: &str) -> String {
    format!("sless.{tenant}.")
}

impl KafkaSource {
    pub async fn connect(config: &KafkaConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let topic = topic(config)?;
        let group = match (&config.consumer_group, &config.consumer_group_secret_ref) {
            (None, None) => default_group(&ctx.id),
            (group, secret) => {
                let group = inline(group.as_deref(), secret, "consumerGroup")?;
                // A group joined on a shared cluster gets its share of the
                // topic: only names of this tenant's are joined.
                let prefix = group_prefix(ctx.tenant());
                if !group.starts_with(&prefix) {
                    return Err(ConnectorError::Config(format!(
                        "consumerGroup must begin with {prefix}: consumer groups are scoped to the tenant"
                    )));
                }
                group.to_owned()
            }
        };
        check_brokers(config, &ctx.egress).await?;
        let consumer: StreamConsumer = client_config(config, &ctx.egress)?
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            .set("partition.assignment.strategy", "roundrobin")
            .create()
            .map_err(|e| ConnectorError::Config(e.to_string()))?;
        let consumer = Arc::new(consumer);
        let probe = (consumer.clone(), topic.clone());
        check_reachable(move |timeout| probe.0.fetch_metadata(Some(&probe.1), timeout)).await?;
        consumer.subscribe(&[&topic]).map_err(classify)?;
        tracing::info!(%topic, %group, "kafka source joined its consumer group");
        let registry = match (config.format, &config.schema_registry) {
            (Format::Avro, Some(registry)) => Some(SchemaRegistry::connect(registry, &ctx.egress).await?),
            (Format::Avro, None) => return Err(ConnectorError::Config("format avro needs a schemaRegistry".into())),
            (Format::Json, _) => None,
        };
        let skip = match &ctx.resume {
            Some(text) => parse_offsets(text).ok_or_else(|| {
                ConnectorError::Config(format!("the sink's stored position {text:?} is not a Kafka position"))
            })?,
            None => BTreeMap::new(),
        };
        Ok(Self {
            consumer,
            topic,
            registry,
            written: std::sync::Mutex::new(skip.clone()),
            skip,
        })
    }

    /// An Avro record's value as JSON, or why it is not valid Avro for
    /// its schema (or names no schema). The registry being unreachable is
    /// waited out: this record's offset must not be passed.
    async fn decode(&self, registry: &SchemaRegistry, payload: &[u8]) -> Result<Value, String> {
        let mut retries = REGISTRY_RETRY.start();
        let (id, body) = avro::split_wire(payload).map_err(|e| e.to_string())?;
        loop {
            match registry.schema(id).await {
                Ok(schema) => return schema.decode(body).map_err(|e| e.to_string()),
                Err(ConnectorError::Data(reason) | ConnectorError::Config(reason)) => return Err(reason),
                Err(e) => {
                    tracing::warn!(error = %e, "schema registry unavailable; retrying");
                    tokio::time::sleep(retries.failed()).await;
                }
            }
        }
    }
}

/// A record's payload: JSON when it parses, else its text as a JSON string.
fn payload(bytes: Option<&[u8]>) -> Value {
    match bytes {
        None => Value::Null,
        Some(b) => serde_json::from_slice(b).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(b).into_owned())),
    }
}

fn record(m: &BorrowedMessage<'_>) -> Record {
    let mut metadata = BTreeMap::from([
        ("topic".to_owned(), m.topic().to_owned()),
        ("partition".to_owned(), m.partition().to_string()),
        ("offset".to_owned(), m.offset().to_string()),
    ]);
    if let Some(key) = m.key() {
        metadata.insert("key".into(), String::from_utf8_lossy(key).into_owned());
    }
    if let Some(ms) = m.timestamp().to_millis().and_then(|ms| u64::try_from(ms).ok()) {
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
        metadata.insert("timestamp".into(), humantime::format_rfc3339_millis(at).to_string());
    }
    Record {
        message: Message {
            data: payload(m.payload()),
            metadata,
            output: Default::default(),
        },
        position: Position::Offset {
            partition: m.partition(),
            offset: m.offset(),
        },
    }
}

/// The offsets to commit after `done`: the next one of each partition.
fn next_offsets(done: &[Position]) -> BTreeMap<i32, i64> {
    let mut next = BTreeMap::new();
    for position in done {
        if let Position::Offset { partition, offset } = *position {
            let e = next.entry(partition).or_insert(offset + 1);
            *e = (*e).max(offset + 1);
        }
    }
    next
}

impl Component for KafkaSource {
    const KIND: &'static str = "kafka";
    type Config = KafkaConfig;

    fn check(config: &KafkaConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(Role::Source, path, errors);
    }

    fn check_scope(config: &KafkaConfig, scope: &str, path: &str, errors: &mut ValidationErrors) {
        let prefix = group_prefix(scope);
        if let Some(group) = config.consumer_group.as_deref().filter(|g| !g.starts_with(&prefix)) {
            errors.push(sless_model::FieldError::invalid(
                format!("{path}.consumerGroup"),
                format!("{group:?} must begin with {prefix}: consumer groups are scoped to the tenant"),
            ));
        }
    }
}

#[async_trait]
impl super::Open for KafkaSource {
    const RESUMABLE: bool = true;

    async fn open(config: &KafkaConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Self::connect(config, ctx).await
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        let m = loop {
            let m = self.consumer.recv().await.map_err(classify)?;
            // Written already with a batch an exactly-once sink holds.
            if self.skip.get(&m.partition()).is_none_or(|last| m.offset() > *last) {
                break m;
            }
        };
        let mut record = record(&m);
        if let (Some(registry), Some(payload)) = (&self.registry, m.payload().map(<[u8]>::to_vec)) {
            drop(m);
            match self.decode(registry, &payload).await {
                Ok(data) => record.message.data = data,
                // To the error sink as it came, with the reason.
                Err(reason) => {
                    let metadata = std::mem::take(&mut record.message.metadata);
                    record.message =
                        Message::refused(Value::String(String::from_utf8_lossy(&payload).into_owned()), reason);
                    record.message.metadata.extend(metadata);
                }
            }
        }
        Ok(vec![record])
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        let mut list = TopicPartitionList::new();
        for (partition, offset) in next_offsets(done) {
            list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))
                .map_err(classify)?;
        }
        if list.count() == 0 {
            return Ok(());
        }
        let consumer = self.consumer.clone();
        tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
            .await
            .map_err(|e| ConnectorError::Transient(e.to_string()))?
            .map_err(classify)
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        let mut written = self.written.lock_unpoisoned();
        for (partition, next) in next_offsets(done) {
            let last = written.entry(partition).or_insert(next - 1);
            *last = (*last).max(next - 1);
        }
        Some(offsets_text(&written))
    }
}

impl Drop for KafkaSource {
    /// Leaving the group blocks while librdkafka says goodbye to the
    /// coordinator: do it off the async threads.
    fn drop(&mut self) {
        let consumer = self.consumer.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn_blocking(move || drop(consumer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, offset: i64) -> Position {
        Position::Offset { partition, offset }
    }

    #[test]
    fn commits_the_offset_after_the_highest_done_per_partition() {
        let done = [at(0, 4), at(1, 9), at(0, 5), at(1, 7)];
        assert_eq!(next_offsets(&done), BTreeMap::from([(0, 6), (1, 10)]));
    }

    #[test]
    fn stored_offsets_round_trip_and_refuse_other_positions() {
        let offsets = BTreeMap::from([(0, 41), (2, 7)]);
        assert_eq!(parse_offsets(&offsets_text(&offsets)), Some(offsets));
        for bad in ["", "kafka:", "kafka:[1]", "cdc:0/1:2", r#"kafka:{"x":1}"#] {
            assert_eq!(parse_offsets(bad), None, "{bad}");
        }
    }

    #[test]
    fn payloads_are_json_or_text() {
        assert_eq!(payload(Some(br#"{"a":1}"#)), serde_json::json!({"a": 1}));
        assert_eq!(payload(Some(b"plain words")), Value::String("plain words".into()));
        assert_eq!(payload(None), Value::Null);
    }

    #[test]
    fn default_groups_are_per_dataflow() {
        assert_eq!(default_group("acme/orders"), "sless.acme.orders");
        assert!(default_group("acme/orders").starts_with(&group_prefix("acme")));
        assert!(!default_group("acme-b/orders").starts_with(&group_prefix("acme")));
        assert_ne!(default_group("a/orders"), default_group("b/orders"));
    }
}
