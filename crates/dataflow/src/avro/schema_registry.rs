//! A client of a Confluent-compatible schema registry (Confluent Schema
//! Registry, Karapace, Apicurio's ccompat API): schemas by id, cached, and
//! registering a subject's schema. It connects only where the egress
//! policy permits; the password never appears in an error.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sless_model::dataflow::SecretRef;
use sless_model::{FieldError, ValidationErrors};

use super::AvroSchema;
use crate::ConnectorError;
use crate::component::inline;
use crate::component::secret_ref;
use crate::egress::{EgressPolicy, http_endpoint, read_answer};
use sless_runtime::sync::Unpoisoned;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// Most schemas kept per connector: ids are few in practice, and a hostile
/// topic must not grow the cache without bound.
const MAX_CACHED: usize = 1000;
/// Longest schema text accepted from a registry.
const MAX_SCHEMA_BYTES: usize = 1 << 20;

/// What a Confluent schema registry error code means, in fixed words.
fn meaning(code: u64) -> &'static str {
    match code {
        40401 => " (no such subject)",
        40402 => " (no such version)",
        40403 => " (no such schema)",
        409 => " (the schema is incompatible with the subject's earlier versions)",
        42201 => " (invalid schema)",
        42202 => " (invalid version)",
        _ => "",
    }
}

/// `schemaRegistry` of a Kafka connector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryConfig {
    /// The registry's base URL, e.g. `http://registry:8081`.
    pub url: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_secret_ref: Option<SecretRef>,
}

impl RegistryConfig {
    pub fn check(&self, path: &str, errors: &mut ValidationErrors) {
        if let Err(reason) = http_endpoint(&self.url) {
            errors.push(FieldError::invalid(format!("{path}.url"), reason));
        }
        secret_ref(&self.password_secret_ref, path, "passwordSecretRef", errors);
    }
}

/// A registry and the schemas read from it.
#[derive(Clone)]
pub struct SchemaRegistry {
    http: reqwest::Client,
    base: String,
    username: Option<String>,
    password: Option<String>,
    cache: Arc<Mutex<HashMap<u32, Arc<AvroSchema>>>>,
}

impl SchemaRegistry {
    pub async fn connect(config: &RegistryConfig, egress: &EgressPolicy) -> Result<Self, ConnectorError> {
        if config.password.is_none() && config.password_secret_ref.is_some() {
            // Resolved into `password` by the operator; never by the processor.
            inline(None, &config.password_secret_ref, "schemaRegistry.password")?;
        }
        let http = egress
            .http_client(&config.url, Duration::from_secs(30))
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(format!("schemaRegistry.url {m}")),
                other => other,
            })?;
        Ok(Self {
            http,
            base: config.url.trim_end_matches('/').to_owned(),
            username: config.username.clone(),
            password: config.password.clone(),
            cache: Arc::default(),
        })
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Result<Value, ConnectorError> {
        let request = match &self.username {
            Some(user) => request.basic_auth(user, self.password.as_deref()),
            None => request,
        };
        let response = request
            .header(reqwest::header::ACCEPT, CONTENT_TYPE)
            .send()
            .await
            .map_err(|e| {
                tracing::info!(error = %e.without_url(), "schema registry request failed");
                ConnectorError::Connect("the schema registry cannot be reached or did not answer".into())
            })?;
        let answer = read_answer(response, MAX_SCHEMA_BYTES, "the schema registry").await?;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        let status = answer.status.as_u16();
        if answer.status.is_success() {
            return Ok(value);
        }
        // The registry's own message is not passed on: its error code says
        // what went wrong in fixed words.
        let described = match value["error_code"].as_u64() {
            Some(code) => format!(
                "the schema registry answered HTTP {status}, error {code}{}",
                meaning(code)
            ),
            None => format!("the schema registry answered HTTP {status}"),
        };
        Err(match status {
            401 | 403 => ConnectorError::Config(described),
            404 | 409 | 422 => ConnectorError::Data(described),
            _ => ConnectorError::Transient(described),
        })
    }

    /// The schema of `id`, from the cache or the registry.
    pub async fn schema(&self, id: u32) -> Result<Arc<AvroSchema>, ConnectorError> {
        if let Some(schema) = self.cache.lock_unpoisoned().get(&id) {
            return Ok(schema.clone());
        }
        let answer = self
            .call(self.http.get(format!("{}/schemas/ids/{id}", self.base)))
            .await?;
        let text = answer["schema"]
            .as_str()
            .ok_or_else(|| ConnectorError::Data(format!("schema registry: schema {id} has no Avro schema text")))?;
        if answer["schemaType"].as_str().is_some_and(|t| t != "AVRO") {
            return Err(ConnectorError::Data(format!("schema {id} is not an Avro schema")));
        }
        let schema = Arc::new(AvroSchema::parse(text).map_err(|e| ConnectorError::Data(format!("schema {id}: {e}")))?);
        let mut cache = self.cache.lock_unpoisoned();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(id, schema.clone());
        Ok(schema)
    }

    /// Registers `schema` under `subject` (or finds it there): its id.
    pub async fn register(&self, subject: &str, schema: &str) -> Result<u32, ConnectorError> {
        let subject: String = form_urlencoded::byte_serialize(subject.as_bytes()).collect();
        let answer = self
            .call(
                self.http
                    .post(format!("{}/subjects/{subject}/versions", self.base))
                    .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
                    .body(json!({"schema": schema}).to_string()),
            )
            .await
            .map_err(|e| match e {
                ConnectorError::Data(m) => ConnectorError::Config(m),
                other => other,
            })?;
        answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| ConnectorError::Transient("schema registry: no id in its answer".into()))
    }
}
