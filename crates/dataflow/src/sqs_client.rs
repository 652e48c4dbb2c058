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
use crate::egress::{http_endpoint, read_answer};
use sless_sqs::engine::requests::is_identifier;

/// The `type` of the SQS source and sink.
pub const KIND: &str = "sqs";
pub const DEFAULT_WAIT_SECONDS: u64 = 20;
pub const DEFAULT_VISIBILITY_SECONDS: u64 = 60;
/// Longest answer read: ten messages of 1 MiB each, their JSON escapes
/// (at most doubling them) and attributes.
const MAX_ANSWER_BYTES: usize = 24 << 20;

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

/// The queue service an SQS connector names (`queueService`), if it is one.
pub fn queue_service_of(connector: &ConnectorSpec) -> Option<String> {
    if connector.kind != KIND {
        return None;
    }
    let config: SqsConfig = serde_json::from_value(connector.config.clone()?).ok()?;
    config.queue_service
}

/// Gives an SQS connector that names a queue service its queue's URL and
/// the service's keys from `access`; any other connector stays as it is.
pub fn fill_queue_service(connector: &mut ConnectorSpec, access: &BTreeMap<String, QueueAccess>) -> Result<(), String> {
    let Some(name) = queue_service_of(connector) else {
        return Ok(());
    };
    let access = access
        .get(&name)
        .ok_or_else(|| format!("queue service {name} is not resolved"))?;
    let config: SqsConfig =
        serde_json::from_value(connector.config.clone().unwrap_or_default()).map_err(|e| e.to_string())?;
    connector.config = Some(serde_json::to_value(config.with_access(access)).map_err(|e| e.to_string())?);
    Ok(())
}

/// A connected queue.
pub struct SqsClient {
    http: reqwest::Client,
    queue_url: String,
    access_key: String,
    secret_key: String,
    region: String,
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
            http,
            queue_url,
            access_key: keys(&config.access_key_id, "accessKeyId")?,
            secret_key: keys(&config.secret_access_key, "secretAccessKey")?,
            region: config
                .region
                .clone()
                .unwrap_or_else(|| sless_sqs::DEFAULT_REGION.to_owned()),
        };
        // Whatever does not answer as SQS (no port, another protocol, an
        // HTTP server of another kind) is refused in the same words, so the
        // connector tells no port from another; an SQS error (wrong keys,
        // no such queue) is the spec's to fix.
        match client
            .exchange("GetQueueAttributes", json!({"AttributeNames": ["QueueArn"]}))
            .await
        {
            Ok(_) => Ok(client),
            Err(Failure::Answered {
                described,
                code: Some(_),
                ..
            }) => Err(ConnectorError::Config(described)),
            Err(Failure::Other(e)) => Err(e),
            Err(_) => Err(unreachable("GetQueueAttributes")),
        }
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }

    /// One action on the queue. A refusal the sender caused is
    /// `ConnectorError::Data`; anything else can be retried.
    pub async fn call(&self, action: &str, input: Value) -> Result<Value, ConnectorError> {
        self.exchange(action, input).await.map_err(|failure| match failure {
            Failure::Other(e) => e,
            Failure::Unreachable => unreachable(action),
            Failure::Answered { status, described, .. } if status.is_client_error() => ConnectorError::Data(described),
            Failure::Answered { described, .. } => ConnectorError::Transient(described),
        })
    }

    async fn exchange(&self, action: &str, mut input: Value) -> Result<Value, Failure> {
        input["QueueUrl"] = Value::String(self.queue_url.clone());
        let body = serde_json::to_vec(&input).map_err(|e| Failure::Other(ConnectorError::Data(e.to_string())))?;
        let headers = sless_sqs::sigv4::signed_json_headers(
            &self.queue_url,
            action,
            &body,
            &self.access_key,
            &self.secret_key,
            &self.region,
        )
        .ok_or_else(|| Failure::Other(ConnectorError::Config("the keys cannot sign a request".into())))?;
        let response = self
            .http
            .post(&self.queue_url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                tracing::info!(error = %e.without_url(), action, "SQS request failed");
                Failure::Unreachable
            })?;
        let answer = read_answer(response, MAX_ANSWER_BYTES, "SQS")
            .await
            .map_err(|e| match e {
                ConnectorError::Connect(_) => Failure::Unreachable,
                other => Failure::Other(other),
            })?;
        let value: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
        if answer.status.is_success() {
            return Ok(value);
        }
        // Only the error's code, and only when it has the shape of one: the
        // message is the remote server's text, which is never passed on.
        let code = value["__type"]
            .as_str()
            .and_then(|t| t.rsplit('#').next())
            .filter(|c| (1..=64).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.'));
        let status = answer.status;
        Err(Failure::Answered {
            status,
            described: format!(
                "SQS {action} answered HTTP {} {}",
                status.as_u16(),
                code.unwrap_or("(no SQS error code)")
            ),
            code: code.map(str::to_owned),
        })
    }
}

/// How one exchange failed.
enum Failure {
    /// Nothing answered, or not over HTTP.
    Unreachable,
    /// An HTTP answer that is an error, with its SQS code if it has one.
    Answered {
        status: reqwest::StatusCode,
        code: Option<String>,
        described: String,
    },
    /// Any other failure, as it says (a redirect, an answer too long).
    Other(ConnectorError),
}

/// One text for an endpoint that is not reached, or not as SQS.
fn unreachable(action: &str) -> ConnectorError {
    ConnectorError::Connect(format!(
        "SQS {action}: the endpoint cannot be reached or did not answer as SQS"
    ))
}
