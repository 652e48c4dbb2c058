//! Kafka sink: an idempotent producer (acks from all in-sync replicas).
//! A batch is written once the broker acknowledged every message of it; the
//! message key is the `key` metadata a Kafka source set, as upstream does.

use std::time::Duration;

use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

use super::Sink;
use crate::dataflow::ConnectorError;
use crate::dataflow::egress::EgressPolicy;
use crate::dataflow::kafka_client::{check_brokers, check_reachable, classify, client_config, topic};
use crate::dataflow::message::Message;
use crate::model::connector_config::KafkaConfig;

pub struct KafkaSink {
    producer: FutureProducer,
    topic: String,
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
        Ok(Self { producer, topic })
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
            let payload = serde_json::to_vec(&m.data).map_err(|e| ConnectorError::Data(e.to_string()))?;
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
                Err(_) => ConnectorError::Query("the producer was closed".into()),
            };
            first_error.get_or_insert(outcome);
        }
        first_error.map_or(Ok(()), Err)
    }
}
