//! What the SQS source and sink share: their config, its rules, and a small
//! client of the SQS JSON protocol, signed with SigV4 (sless-sqs's signer),
//! that connects only to addresses the egress policy permits. It talks to
//! any SQS endpoint: a tenant's sless queue service or AWS.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sless_model::dataflow::{ConnectorSpec, Role, SecretRef};
use sless_model::name::DnsLabel;
use sless_model::{FieldError, ValidationErrors};

use crate::ConnectorError;
use crate::component::{either, non_empty, secret_ref};
use crate::context::{PipelineContext, QueueAccess};
use crate::egress::{CONNECT_WINDOW, connecting, http_endpoint};
use sless_runtime::http::ReadError;
use sless_sqs::client::{CallError, Client, MAX_ANSWER_BYTES};
use sless_sqs::engine::requests::is_identifier;

/// The `type` of the SQS source and sink.
pub const KIND: &str = "sqs";
pub const DEFAULT_WAIT_SECONDS: u64 = 20;
pub const DEFAULT_VISIBILITY_SECONDS: u64 = 60;

/// `config` of the `sqs` source and sink.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SqsConfig {
    /// The queue's URL, as CreateQueue or GetQueueUrl returned it.
    pub queue_url: Option<String>,
    /// Instead of `queueUrl` and keys: the tenant's own queue service, by
    /// name; the platform supplies its endpoint and keys.
    pub queue_service: Option<String>,
    /// With `queueService`: the queue's name.
    pub queue_name: Option<String>,
    /// The region the endpoint signs for. Default `ru-msk-1`.
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub access_key_id_secret_ref: Option<SecretRef>,
    pub secret_access_key: Option<String>,
    pub secret_access_key_secret_ref: Option<SecretRef>,
    /// Source: long-poll wait, 0–20 s. Default 20.
    pub wait_time_seconds: Option<u64>,
    /// Source: how long a batch has to be written before its messages are
    /// delivered again, 1–43200 s. Default 60.
    pub visibility_timeout: Option<u64>,
}

impl SqsConfig {
    pub fn check(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        if self.queue_service.is_some() {
            self.check_queue_service(path, errors);
        } else {
            self.check_queue_url(path, errors);
        }
        let source_only = |value: Option<u64>, field: &str, errors: &mut ValidationErrors| {
            if value.is_some() && role == Role::Sink {
                errors.push(FieldError::invalid(
                    format!("{path}.{field}"),
                    "applies to a source only",
                ));
            }
        };
        source_only(self.wait_time_seconds, "waitTimeSeconds", errors);
        source_only(self.visibility_timeout, "visibilityTimeout", errors);
        if self.wait_time_seconds.is_some_and(|w| w > 20) {
            errors.push(FieldError::invalid(
                format!("{path}.waitTimeSeconds"),
                "must be 0 to 20",
            ));
        }
        if self.visibility_timeout.is_some_and(|v| !(1..=43_200).contains(&v)) {
            errors.push(FieldError::invalid(
                format!("{path}.visibilityTimeout"),
                "must be 1 to 43200",
            ));
        }
    }
}

impl SqsConfig {
    /// A queue of the tenant's own queue service: its name and the queue's,
    /// and nothing the platform supplies.
    fn check_queue_service(&self, path: &str, errors: &mut ValidationErrors) {
        if self
            .queue_service
            .as_deref()
            .is_none_or(|name| DnsLabel::parse(name, "queueService").is_err())
        {
            errors.push(FieldError::invalid(
                format!("{path}.queueService"),
                "must name a queue service of the tenant",
            ));
        }
        match self.queue_name.as_deref() {
            None | Some("") => errors.push(FieldError::required(format!("{path}.queueName"))),
            Some(name) if !is_identifier(name.strip_suffix(".fifo").unwrap_or(name)) => {
                errors.push(FieldError::invalid(
                    format!("{path}.queueName"),
                    "must be 1 to 80 of A-Z, a-z, 0-9, - and _ (and .fifo for a FIFO queue)",
                ))
            }
            Some(_) => {}
        }
        let supplied = [
            ("queueUrl", self.queue_url.is_some()),
            ("region", self.region.is_some()),
            ("accessKeyId", self.access_key_id.is_some()),
            ("accessKeyIdSecretRef", self.access_key_id_secret_ref.is_some()),
            ("secretAccessKey", self.secret_access_key.is_some()),
            ("secretAccessKeySecretRef", self.secret_access_key_secret_ref.is_some()),
        ];
        for (field, _) in supplied.iter().filter(|(_, given)| *given) {
            errors.push(FieldError::invalid(
                format!("{path}.{field}"),
                "the platform supplies it for a queueService; leave it out",
            ));
        }
    }

    /// Any SQS queue: its URL and keys.
    fn check_queue_url(&self, path: &str, errors: &mut ValidationErrors) {
        match self.queue_url.as_deref() {
            None | Some("") => errors.push(FieldError::required(format!("{path}.queueUrl"))),
            Some(url) => {
                if let Err(reason) = http_endpoint(url) {
                    errors.push(FieldError::invalid(format!("{path}.queueUrl"), reason));
                }
            }
        }
        if self.queue_name.is_some() {
            errors.push(FieldError::invalid(
                format!("{path}.queueName"),
                "goes with queueService; queueUrl names the queue",
            ));
        }
        either(
            non_empty(&self.access_key_id),
            &self.access_key_id_secret_ref,
            path,
            "accessKeyId",
            errors,
        );
        secret_ref(&self.access_key_id_secret_ref, path, "accessKeyIdSecretRef", errors);
        either(
            non_empty(&self.secret_access_key),
            &self.secret_access_key_secret_ref,
            path,
            "secretAccessKey",
            errors,
        );
        secret_ref(
            &self.secret_access_key_secret_ref,
            path,
            "secretAccessKeySecretRef",
            errors,
        );
    }

    /// The config with a `queueService` replaced by the queue's URL and the
    /// service's keys.
    pub fn with_access(&self, access: &QueueAccess) -> Self {
        let name = self.queue_name.clone().unwrap_or_default();
        Self {
            queue_url: Some(sless_sqs::engine::queue_url(
                &access.endpoint,
                &access.account_id,
                &name,
            )),
            queue_service: None,
            queue_name: None,
            access_key_id: Some(access.access_key.clone()),
            secret_access_key: Some(access.secret_key.clone()),
            ..self.clone()
        }
    }
}

/// An SQS connector's config, with the queue service it names, if it is
/// one that names one.
fn naming_a_queue_service(connector: &ConnectorSpec) -> Option<(String, SqsConfig)> {
    if connector.kind != KIND {
        return None;
    }
    let config: SqsConfig = serde_json::from_value(connector.config.clone()?).ok()?;
    Some((config.queue_service.clone()?, config))
}

/// The queue service an SQS connector names (`queueService`), if it is one.
pub fn queue_service_of(connector: &ConnectorSpec) -> Option<String> {
    naming_a_queue_service(connector).map(|(name, _)| name)
}

/// Gives an SQS connector that names a queue service its queue's URL and
/// the service's keys from `access`; any other connector stays as it is.
pub fn fill_queue_service(connector: &mut ConnectorSpec, access: &BTreeMap<String, QueueAccess>) -> Result<(), String> {
    let Some((name, config)) = naming_a_queue_service(connector) else {
        return Ok(());
    };
    let access = access
        .get(&name)
        .ok_or_else(|| format!("queue service {name} is not resolved"))?;
    connector.config = Some(serde_json::to_value(config.with_access(access)).map_err(|e| e.to_string())?);
    Ok(())
}

/// A connected queue.
pub struct SqsClient {
    client: Client,
    queue_url: String,
}

impl SqsClient {
    /// Connects to the queue (only at addresses the egress policy permits)
    /// and checks the keys open it.
    pub async fn connect(config: &SqsConfig, ctx: &PipelineContext) -> Result<Self, ConnectorError> {
        let resolved;
        let config = match &config.queue_service {
            None => config,
            Some(name) => {
                let services = ctx
                    .queue_services
                    .as_ref()
                    .ok_or_else(|| ConnectorError::Config("queueService was not resolved by the platform".into()))?;
                // Not there or not ready yet: the supervisor retries.
                let access = services.access(name).await.map_err(ConnectorError::Connect)?;
                resolved = config.with_access(&access);
                &resolved
            }
        };
        let queue_url = config.queue_url.clone().unwrap_or_default();
        let http = ctx
            .egress
            .http_client(&queue_url, Duration::from_secs(DEFAULT_WAIT_SECONDS + 20))
            .await
            .map_err(|e| match e {
                ConnectorError::Config(m) => ConnectorError::Config(format!("queueUrl {m}")),
                other => other,
            })?;
        let keys = |inline: &Option<String>, field: &str| {
            inline
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| ConnectorError::Config(format!("{field} is not resolved")))
        };
        let client = Self {
            client: Client::new(
                http,
                &keys(&config.access_key_id, "accessKeyId")?,
                &keys(&config.secret_access_key, "secretAccessKey")?,
                config.region.as_deref().unwrap_or(sless_sqs::DEFAULT_REGION),
            ),
            queue_url,
        };
        // Whatever does not answer as SQS (no port, another protocol, an
        // HTTP server of another kind) is refused in the same words, so the
        // connector tells no port from another; an SQS error (wrong keys,
        // no such queue) is the spec's to fix.
        // Within the connect window, whatever the endpoint does, and a
        // failure said only once it has passed.
        let action = "GetQueueAttributes";
        // Only SQS's answer counts: its attributes, or an SQS error code.
        let probe = async {
            match client.exchange(action, json!({"AttributeNames": ["QueueArn"]})).await {
                Ok(answer) if answer.get("Attributes").is_some_and(Value::is_object) => Ok(()),
                Err(refused @ CallError::Refused { code: Some(_), .. }) => {
                    Err(ConnectorError::Config(described(action, &refused)))
                }
                Err(CallError::Unsigned) => Err(connector_error(action, CallError::Unsigned)),
                Ok(_) | Err(CallError::Unreachable(_) | CallError::Refused { code: None, .. } | CallError::Read(_)) => {
                    Err(unreachable(action))
                }
            }
        };
        connecting(CONNECT_WINDOW, probe, || unreachable(action)).await?;
        Ok(client)
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// One action on the queue. A refusal the sender caused is
    /// `ConnectorError::Data`; anything else can be retried.
    pub async fn call(&self, action: &str, input: Value) -> Result<Value, ConnectorError> {
        self.exchange(action, input)
            .await
            .map_err(|e| connector_error(action, e))
    }

    async fn exchange(&self, action: &str, mut input: Value) -> Result<Value, CallError> {
        input["QueueUrl"] = Value::String(self.queue_url.clone());
        self.client
            .call(&self.queue_url, action, &input, MAX_ANSWER_BYTES)
            .await
    }
}

/// What the tenant is told of a refusal: the status and the SQS error
/// code, never the remote server's message.
fn described(action: &str, refused: &CallError) -> String {
    format!("SQS {action} answered {refused}")
}

fn connector_error(action: &str, e: CallError) -> ConnectorError {
    match e {
        CallError::Unsigned => ConnectorError::Config(e.to_string()),
        CallError::Unreachable(source) => {
            tracing::info!(error = %source, action, "SQS request failed");
            unreachable(action)
        }
        CallError::Read(ReadError::Redirect(_)) => ConnectorError::Config(format!("SQS {e}")),
        CallError::Read(ReadError::TooLong(_) | ReadError::Refused(_)) => ConnectorError::Transient(format!("SQS {e}")),
        CallError::Read(ReadError::Transport(_)) => unreachable(action),
        CallError::Refused { status, .. } if status.is_client_error() => ConnectorError::Data(described(action, &e)),
        CallError::Refused { .. } => ConnectorError::Transient(described(action, &e)),
    }
}

/// One text for an endpoint that is not reached, or not as SQS.
fn unreachable(action: &str) -> ConnectorError {
    ConnectorError::Connect(format!(
        "SQS {action}: the endpoint cannot be reached or did not answer as SQS"
    ))
}
