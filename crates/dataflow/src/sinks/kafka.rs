//! Kafka sink: an idempotent producer (acks from all in-sync replicas).
//! A batch is written once the broker acknowledged every message of it; the
//! message key is the `key` metadata a Kafka source set, as upstream does.
//! With `format: avro` each message is encoded with the configured schema,
//! registered at start, in the Confluent wire format; a message that does
//! not fit the schema is refused (to the error sink).

use std::time::Duration;

use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::Sink;
use crate::ConnectorError;
use crate::avro::schema_registry::SchemaRegistry;
use crate::avro::{self, AvroSchema};
use crate::component::Component;
use crate::context::PipelineContext;
use crate::egress::EgressPolicy;
use crate::kafka_client::{Format, KafkaConfig, check_brokers, check_reachable, classify, client_config, topic};
use crate::message::Message;
use sless_model::ValidationErrors;
use sless_model::dataflow::Role;

pub struct KafkaSink {
    producer: FutureProducer,
    topic: String,
    /// With `format: avro`: the schema and its registry id.
    avro: Option<(AvroSchema, u32)>,
}

impl KafkaSink {
    pub async fn connect(config: &KafkaConfig, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        let topic = topic(config)?;
        check_brokers(config, egress).await?;
        let producer: FutureProducer = client_config(config, egress)?
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.timeout.ms", "30000")
            .create()
            .map_err(|e| ConnectorError::Config(e.to_string()))?;
        let probe = (producer.clone(), topic.clone());
        check_reachable(move |timeout| probe.0.client().fetch_metadata(Some(&probe.1), timeout)).await?;
        let avro = match (config.format, &config.schema_registry, config.avro_schema_text()) {
            (Format::Avro, Some(registry), Some(text)) => {
                let schema =
                    AvroSchema::parse(&text).map_err(|e| ConnectorError::Config(format!("avroSchema: {e}")))?;
                let subject = config.subject.clone().unwrap_or_else(|| format!("{topic}-value"));
                let id = SchemaRegistry::connect(registry, egress)
                    .await?
                    .register(&subject, &text)
                    .await?;
                tracing::info!(%topic, %subject, id, "kafka sink writes Avro");
                Some((schema, id))
            }
            (Format::Avro, _, _) => {
                return Err(ConnectorError::Config(
                    "format avro needs schemaRegistry and avroSchema".into(),
                ));
            }
            (Format::Json, _, _) => None,
        };
        Ok(Self { producer, topic, avro })
    }
}

impl Component for KafkaSink {
    const KIND: &'static str = "kafka";
    type Config = KafkaConfig;

    fn check(config: &KafkaConfig, path: &str, errors: &mut ValidationErrors) {
        config.check(Role::Sink, path, errors);
    }
}

#[async_trait]
impl super::Open for KafkaSink {
    async fn open(config: &KafkaConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        Self::connect(config, &ctx.egress).await
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn target(&self) -> &str {
        &self.topic
    }

    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError> {
        let mut deliveries = Vec::with_capacity(batch.len());
        for m in batch {
            let payload = match &self.avro {
                Some((schema, id)) => avro::frame(
                    *id,
                    &schema
                        .encode(&m.data)
                        .map_err(|e| ConnectorError::Data(e.to_string()))?,
                ),
                None => serde_json::to_vec(&m.data).map_err(|e| ConnectorError::Data(e.to_string()))?,
            };
            let mut record = FutureRecord::to(&self.topic).payload(&payload);
            if let Some(key) = m.metadata.get("key") {
                record = record.key(key.as_str());
            }
            // Queue everything first, so the batch travels in few requests.
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        deliveries.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(classify(e)),
                }
            }
        }
        let mut first_error = None;
        for delivery in deliveries {
            let outcome = match delivery.await {
                Ok(Ok(_)) => continue,
                Ok(Err((e, _))) => classify(e),
                Err(_) => ConnectorError::Transient("the producer was closed".into()),
            };
            first_error.get_or_insert(outcome);
        }
        first_error.map_or(Ok(()), Err)
    }
}
