//! librdkafka settings shared by the Kafka source and sink: brokers, TLS and
//! SASL from a connector config, and the classification of client errors.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::metadata::Metadata;

use super::ConnectorError;
use crate::model::connector_config::{KafkaConfig, SecretRef};

/// How long connecting waits for the brokers to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A value given inline, or else the reason it is missing: a `…SecretRef`
/// is resolved by the kubernetes operator, never by the processor.
pub fn inline<'a>(value: Option<&'a str>, secret: &Option<SecretRef>, field: &str) -> Result<&'a str, ConnectorError> {
    match (value.filter(|v| !v.is_empty()), secret) {
        (Some(v), _) => Ok(v),
        (None, Some(_)) => Err(ConnectorError::Config(format!(
            "{field}SecretRef was not resolved: give {field} inline here, secrets are resolved only in kubernetes mode"
        ))),
        (None, None) => Err(ConnectorError::Config(format!("{field} is required"))),
    }
}

/// Topic of a config (inline or resolved).
pub fn topic(config: &KafkaConfig) -> Result<String, ConnectorError> {
    inline(config.topic.as_deref(), &config.topic_secret_ref, "topic").map(str::to_owned)
}

/// Brokers, TLS and SASL of `config` as librdkafka properties.
pub fn client_config(config: &KafkaConfig) -> Result<ClientConfig, ConnectorError> {
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
                c.set(property, inline(file.as_deref(), secret, field)?);
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
        _ => ConnectorError::Query(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::connector_config::{SaslConfig, TlsConfig};

    fn kafka(json: serde_json::Value) -> KafkaConfig {
        serde_json::from_value(json).unwrap()
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
            ca_file: Some("/ca.pem".into()),
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
        assert_eq!(c.get("ssl.ca.location"), Some("/ca.pem"));
        // The CA file wins: verification stays on.
        assert_eq!(c.get("enable.ssl.certificate.verification"), None);
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
