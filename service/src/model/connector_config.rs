//! Typed `config` objects of the connectors, with upstream's field names.
//! A value may be given inline or through a `…SecretRef` to a Kubernetes
//! Secret that the operator resolves before the processor starts.

use serde::{Deserialize, Serialize};

use super::{FieldError, ValidationErrors};

/// Reference to one key of a Kubernetes Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRef {
    #[serde(default)]
    pub name: String,
    /// Defaults to the DataFlow's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default)]
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    #[serde(default)]
    pub insecure_skip_verify: bool,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub ca_file: Option<String>,
    pub cert_secret_ref: Option<SecretRef>,
    pub key_secret_ref: Option<SecretRef>,
    pub ca_secret_ref: Option<SecretRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresSourceConfig {
    pub connection_string: Option<String>,
    pub table: Option<String>,
    /// Custom SQL instead of reading `table`.
    pub query: Option<String>,
    /// Seconds between polls. Default 5.
    pub poll_interval: Option<u32>,
    /// Rows read per poll. Default 1000.
    pub batch_size: Option<u32>,
    /// Column whose increasing values mark the read position (an id or a
    /// change time). Default `id`.
    pub incremental_column: Option<String>,
    /// A unique column that orders rows sharing an `incrementalColumn`
    /// value (a change time), so none is skipped at a batch boundary.
    /// Default `id`.
    pub id_column: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostgresSinkConfig {
    pub connection_string: Option<String>,
    pub table: Option<String>,
    pub batch_size: Option<u32>,
    pub auto_create_table: Option<bool>,
    /// INSERT … ON CONFLICT … DO UPDATE instead of skipping duplicates.
    pub upsert_mode: Option<bool>,
    /// Column(s) for conflict detection in upsert mode; default the primary key.
    pub conflict_key: Option<String>,
    pub connection_string_secret_ref: Option<SecretRef>,
    pub table_secret_ref: Option<SecretRef>,
}

/// Which end of a dataflow a connector sits on; the configs differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Source,
    Sink,
}

/// Connector types that work today.
pub const SUPPORTED: &[&str] = &["kafka", "postgresql"];
/// Connector types of the upstream design that sless does not run yet.
pub const NOT_YET_SUPPORTED: &[&str] = &["clickhouse", "nessie", "trino"];

/// Validates `config` (at `path`) for a connector of type `kind`, which must
/// be one of [`SUPPORTED`].
pub fn validate(kind: &str, role: Role, config: &serde_json::Value, path: &str, errors: &mut ValidationErrors) {
    match (kind, role) {
        ("kafka", _) => {
            if let Some(k) = parse::<KafkaConfig>(config, path, errors) {
                if role == Role::Sink && (k.consumer_group.is_some() || k.consumer_group_secret_ref.is_some()) {
                    errors.push(FieldError::invalid(
                        format!("{path}.consumerGroup"),
                        "only a kafka source has a consumer group",
                    ));
                }
                either(!k.brokers.is_empty(), &k.brokers_secret_ref, path, "brokers", errors);
                either(
                    k.topic.as_deref().is_some_and(|t| !t.is_empty()),
                    &k.topic_secret_ref,
                    path,
                    "topic",
                    errors,
                );
                secret_ref(&k.consumer_group_secret_ref, path, "consumerGroupSecretRef", errors);
                if let Some(sasl) = &k.sasl {
                    const MECHANISMS: &[&str] = &["plain", "scram-sha-256", "scram-sha-512"];
                    if !MECHANISMS.contains(&sasl.mechanism.as_str()) {
                        errors.push(FieldError::not_supported(
                            format!("{path}.sasl.mechanism"),
                            &sasl.mechanism,
                            MECHANISMS,
                        ));
                    }
                }
            }
        }
        ("postgresql", Role::Source) => {
            if let Some(p) = parse::<PostgresSourceConfig>(config, path, errors) {
                either(
                    non_empty(&p.connection_string),
                    &p.connection_string_secret_ref,
                    path,
                    "connectionString",
                    errors,
                );
                either(non_empty(&p.table), &p.table_secret_ref, path, "table", errors);
                if p.poll_interval == Some(0) {
                    errors.push(FieldError::invalid(
                        format!("{path}.pollInterval"),
                        "must be at least 1 second",
                    ));
                }
            }
        }
        ("postgresql", Role::Sink) => {
            if let Some(p) = parse::<PostgresSinkConfig>(config, path, errors) {
                either(
                    non_empty(&p.connection_string),
                    &p.connection_string_secret_ref,
                    path,
                    "connectionString",
                    errors,
                );
                either(non_empty(&p.table), &p.table_secret_ref, path, "table", errors);
                if p.batch_size == Some(0) {
                    errors.push(FieldError::invalid(format!("{path}.batchSize"), "must be at least 1"));
                }
            }
        }
        _ => errors.push(FieldError::not_supported(path, kind, SUPPORTED)),
    }
}

fn non_empty(value: &Option<String>) -> bool {
    value.as_deref().is_some_and(|v| !v.is_empty())
}

/// Deserialises a connector config, reporting serde's message at `path`.
pub fn parse<T: serde::de::DeserializeOwned>(
    config: &serde_json::Value,
    path: &str,
    errors: &mut ValidationErrors,
) -> Option<T> {
    match T::deserialize(config) {
        Ok(value) => Some(value),
        Err(e) => {
            errors.push(FieldError::invalid(path, e.to_string()));
            None
        }
    }
}

/// Requires `field` inline or through `{field}SecretRef`, and checks the ref.
fn either(inline: bool, reference: &Option<SecretRef>, path: &str, field: &str, errors: &mut ValidationErrors) {
    let ref_field = format!("{field}SecretRef");
    if !inline && reference.is_none() {
        errors.push(FieldError::invalid(
            format!("{path}.{field}"),
            format!("{field} or {ref_field} is required"),
        ));
    }
    secret_ref(reference, path, &ref_field, errors);
}

fn secret_ref(reference: &Option<SecretRef>, path: &str, field: &str, errors: &mut ValidationErrors) {
    if let Some(r) = reference {
        if r.name.is_empty() {
            errors.push(FieldError::required(format!("{path}.{field}.name")));
        }
        if r.key.is_empty() {
            errors.push(FieldError::required(format!("{path}.{field}.key")));
        }
    }
}
