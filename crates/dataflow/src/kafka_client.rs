//! librdkafka settings shared by the Kafka source and sink: brokers, TLS and
//! SASL from a connector config, and the classification of client errors.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;

use serde::Deserialize;
use serde_json::Value;
use sless_model::dataflow::{Role, SecretRef};
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;
use crate::avro::AvroSchema;
use crate::avro::schema_registry::RegistryConfig;
use crate::component::inline;
use crate::component::{either, non_empty, secret_ref};
use crate::egress::EgressPolicy;
pub use crate::tls::TlsConfig;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SaslConfig {
    /// `plain`, `scram-sha-256` or `scram-sha-512`.
    #[serde(default)]
    pub mechanism: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub username_secret_ref: Option<SecretRef>,
    pub password_secret_ref: Option<SecretRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaConfig {
    #[serde(default)]
    pub brokers: Vec<String>,
    pub topic: Option<String>,
    /// Source only.
    pub consumer_group: Option<String>,
    pub tls: Option<TlsConfig>,
    pub sasl: Option<SaslConfig>,
    pub brokers_secret_ref: Option<SecretRef>,
    pub topic_secret_ref: Option<SecretRef>,
    pub consumer_group_secret_ref: Option<SecretRef>,
    /// `json` (default) or `avro` (the Confluent wire format, with a
    /// schema registry).
    #[serde(default)]
    pub format: Format,
    /// With `format: avro`: where the schemas are.
    pub schema_registry: Option<RegistryConfig>,
    /// Sink with `format: avro`: the schema messages are written with (its
    /// JSON, as text or as an object), registered under `subject`.
    pub avro_schema: Option<Value>,
    /// Sink with `format: avro`: the registry subject. Default `{topic}-value`.
    pub subject: Option<String>,
}

/// How record values are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[default]
    Json,
    Avro,
}

impl KafkaConfig {
    /// The sink's Avro schema as text.
    pub fn avro_schema_text(&self) -> Option<String> {
        match &self.avro_schema {
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => Some(other.to_string()),
            None => None,
        }
    }

    fn check_format(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        match (self.format, &self.schema_registry) {
            (Format::Avro, None) => errors.push(FieldError::invalid(
                format!("{path}.schemaRegistry"),
                "format avro needs a schemaRegistry",
            )),
            (Format::Avro, Some(registry)) => registry.check(&format!("{path}.schemaRegistry"), errors),
            (Format::Json, Some(_)) => errors.push(FieldError::invalid(
                format!("{path}.schemaRegistry"),
                "goes with format: avro",
            )),
            (Format::Json, None) => {}
        }
        let sink_avro = |field: &str, given: bool, errors: &mut ValidationErrors| {
            if given && (role == Role::Source || self.format != Format::Avro) {
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    "applies to a sink with format: avro only",
                ));
            }
        };
        sink_avro("avroSchema", self.avro_schema.is_some(), errors);
        sink_avro("subject", self.subject.is_some(), errors);
        if role == Role::Sink && self.format == Format::Avro {
            match self.avro_schema_text() {
                None => errors.push(FieldError::required(format!("{path}.avroSchema"))),
                Some(text) => {
                    if let Err(e) = AvroSchema::parse(&text) {
                        errors.push(FieldError::invalid(format!("{path}.avroSchema"), e.to_string()));
                    }
                }
            }
        }
    }
}

/// SASL mechanisms librdkafka is asked for.
const MECHANISMS: &[&str] = &["plain", "scram-sha-256", "scram-sha-512"];

impl KafkaConfig {
    /// Field rules of a Kafka source (`role` Source) or sink config at `path`.
    pub fn check(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        if role == Role::Sink && (self.consumer_group.is_some() || self.consumer_group_secret_ref.is_some()) {
            errors.push(FieldError::invalid(
                format!("{path}.consumerGroup"),
                "only a kafka source has a consumer group",
            ));
        }
        either(
            !self.brokers.is_empty(),
            &self.brokers_secret_ref,
            path,
            "brokers",
            errors,
        );
        either(non_empty(&self.topic), &self.topic_secret_ref, path, "topic", errors);
        self.check_format(role, path, errors);
        secret_ref(&self.consumer_group_secret_ref, path, "consumerGroupSecretRef", errors);
        if let Some(sasl) = &self.sasl
            && !MECHANISMS.contains(&sasl.mechanism.as_str())
        {
            errors.push(FieldError::not_supported(
                format!("{path}.sasl.mechanism"),
                &sasl.mechanism,
                MECHANISMS,
            ));
        }
    }
}

/// How long connecting waits for the brokers to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Topic of a config (inline or resolved).
pub fn topic(config: &KafkaConfig) -> Result<String, ConnectorError> {
    inline(config.topic.as_deref(), &config.topic_secret_ref, "topic").map(str::to_owned)
}

/// Checks every bootstrap broker against the egress policy. (Brokers the
/// cluster advertises later are connected to by librdkafka itself: in
/// kubernetes mode a NetworkPolicy on the processor bounds those.)
pub async fn check_brokers(config: &KafkaConfig, egress: &EgressPolicy) -> Result<(), ConnectorError> {
    for broker in &config.brokers {
        let (host, port) = broker
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.trim_start_matches('[').trim_end_matches(']'), p.parse::<u16>().ok()?)))
            .ok_or_else(|| ConnectorError::Config(format!("broker {broker:?} is not host:port")))?;
        egress.resolve(host, port).await?;
    }
    Ok(())
}

/// Brokers, TLS and SASL of `config` as librdkafka properties; TLS files
/// only from the egress policy's TLS directory.
pub fn client_config(config: &KafkaConfig, egress: &EgressPolicy) -> Result<ClientConfig, ConnectorError> {
    if config.brokers.is_empty() {
        inline(None, &config.brokers_secret_ref, "brokers")?;
    }
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", config.brokers.join(","))
        .set("client.id", "sless-dataflow")
        .set("socket.connection.setup.timeout.ms", "10000");
    if let Some(tls) = &config.tls {
        for (file, secret, field, property) in [
            (&tls.ca_file, &tls.ca_secret_ref, "tls.caFile", "ssl.ca.location"),
            (
                &tls.cert_file,
                &tls.cert_secret_ref,
                "tls.certFile",
                "ssl.certificate.location",
            ),
            (&tls.key_file, &tls.key_secret_ref, "tls.keyFile", "ssl.key.location"),
        ] {
            if file.is_some() || secret.is_some() {
                let path = egress.tls_file(inline(file.as_deref(), secret, field)?, field)?;
                c.set(property, path.to_string_lossy());
            }
        }
        // A CA file wins over insecureSkipVerify, as upstream has it.
        if tls.insecure_skip_verify && tls.ca_file.is_none() {
            c.set("enable.ssl.certificate.verification", "false")
                .set("ssl.endpoint.identification.algorithm", "none");
        }
    }
    let protocol = match (&config.tls, &config.sasl) {
        (None, None) => "plaintext",
        (Some(_), None) => "ssl",
        (None, Some(_)) => "sasl_plaintext",
        (Some(_), Some(_)) => "sasl_ssl",
    };
    c.set("security.protocol", protocol);
    if let Some(sasl) = &config.sasl {
        let mechanism = match sasl.mechanism.as_str() {
            "plain" | "" => "PLAIN",
            "scram-sha-256" => "SCRAM-SHA-256",
            "scram-sha-512" => "SCRAM-SHA-512",
            other => return Err(ConnectorError::Config(format!("unsupported SASL mechanism {other:?}"))),
        };
        c.set("sasl.mechanism", mechanism)
            .set(
                "sasl.username",
                inline(sasl.username.as_deref(), &sasl.username_secret_ref, "sasl.username")?,
            )
            .set(
                "sasl.password",
                inline(sasl.password.as_deref(), &sasl.password_secret_ref, "sasl.password")?,
            );
    }
    Ok(c)
}

/// Runs `fetch` (a blocking metadata request for the topic) so a bad
/// address or a refused login shows at connect time, not as silent retries.
pub async fn check_reachable<F>(fetch: F) -> Result<(), ConnectorError>
where
    F: FnOnce(Duration) -> KafkaResult<Metadata> + Send + 'static,
{
    tokio::task::spawn_blocking(move || fetch(CONNECT_TIMEOUT).map(drop))
        .await
        .map_err(|e| ConnectorError::Connect(e.to_string()))?
        .map_err(|e| ConnectorError::Connect(format!("Kafka brokers did not answer: {e}")))
}

/// A client error: the data's fault (too large, malformed) or transient.
pub fn classify(e: KafkaError) -> ConnectorError {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTimestamp,
        ) => ConnectorError::Data(e.to_string()),
        Some(
            RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::Authentication,
        ) => ConnectorError::Connect(e.to_string()),
        _ => ConnectorError::Transient(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kafka(json: serde_json::Value) -> KafkaConfig {
        serde_json::from_value(json).unwrap()
    }

    fn client_config(config: &KafkaConfig) -> Result<ClientConfig, ConnectorError> {
        super::client_config(config, &EgressPolicy::default())
    }

    #[test]
    fn plaintext_by_default() {
        let c = client_config(&kafka(
            serde_json::json!({"brokers": ["a:9092", "b:9092"], "topic": "t"}),
        ))
        .unwrap();
        assert_eq!(c.get("bootstrap.servers"), Some("a:9092,b:9092"));
        assert_eq!(c.get("security.protocol"), Some("plaintext"));
    }

    #[test]
    fn tls_and_sasl_map_to_librdkafka() {
        let mut k = kafka(serde_json::json!({"brokers": ["a:9093"], "topic": "t"}));
        k.tls = Some(TlsConfig {
            insecure_skip_verify: true,
            cert_file: None,
            key_file: None,
            ca_file: None,
            cert_secret_ref: None,
            key_secret_ref: None,
            ca_secret_ref: None,
        });
        k.sasl = Some(SaslConfig {
            mechanism: "scram-sha-512".into(),
            username: Some("u".into()),
            password: Some("p".into()),
            username_secret_ref: None,
            password_secret_ref: None,
        });
        let c = client_config(&k).unwrap();
        assert_eq!(c.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(c.get("enable.ssl.certificate.verification"), Some("false"));
        // A CA file comes from the TLS directory, and wins: verification stays on.
        let dir = std::env::temp_dir().join(format!("sless-kafka-tls-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), "x").unwrap();
        let egress = EgressPolicy::restricted(vec![], vec![], Some(dir.clone()));
        if let Some(tls) = k.tls.as_mut() {
            tls.ca_file = Some("ca.pem".into());
        }
        let c = super::client_config(&k, &egress).unwrap();
        let ca = dir.canonicalize().unwrap().join("ca.pem");
        assert_eq!(c.get("ssl.ca.location"), ca.to_str());
        assert_eq!(c.get("enable.ssl.certificate.verification"), None);
        if let Some(tls) = k.tls.as_mut() {
            tls.ca_file = Some("/etc/shadow".into());
        }
        let e = super::client_config(&k, &egress).unwrap_err().to_string();
        assert!(e.contains("TLS directory"), "{e}");
        assert_eq!(c.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(c.get("sasl.username"), Some("u"));
    }

    #[test]
    fn unresolved_secret_refs_are_named() {
        let k = kafka(serde_json::json!({"brokersSecretRef": {"name": "s", "key": "b"}, "topic": "t"}));
        let e = client_config(&k).unwrap_err().to_string();
        assert!(e.contains("brokersSecretRef was not resolved"), "{e}");
        let k = kafka(serde_json::json!({"brokers": ["a:1"], "topicSecretRef": {"name": "s", "key": "t"}}));
        assert!(topic(&k).unwrap_err().to_string().contains("topicSecretRef"));
    }
}
