//! `sless_dataflow`: a pipeline from a source through transformations to a sink.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::{check_name, check_whole, delete_object, phases, read_view};
use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::resource::{Applied, Named, Resource};
use crate::schema::{Attr, BlockSchema, Kind};
use sless_model::ValidationErrors;
use sless_model::dataflow::{
    ConnectorSpec, DEFAULT_CHANNEL_BUFFER_SIZE, DataFlowPhase, DataFlowRequest, DataFlowView, MAX_CHANNEL_BUFFER_SIZE,
    Resources, TransformationSpec,
};

const COLLECTION: &str = "/dataflows";

fn path(name: &str) -> String {
    format!("{COLLECTION}/{name}")
}

pub struct DataFlow;

/// A source, sink or transformation in state: its type and its config as
/// the JSON string the user wrote.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TypedConfig {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub config: Option<String>,
}

/// The state of a `sless_dataflow`, one field per attribute.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DataFlowState {
    pub id: Option<String>,
    pub name: Option<String>,
    pub source: Option<TypedConfig>,
    pub sink: Option<TypedConfig>,
    pub transformations: Option<Vec<TypedConfig>>,
    pub errors: Option<TypedConfig>,
    pub checkpoint_persistence: Option<bool>,
    pub channel_buffer_size: Option<f64>,
    pub processor_requests: Option<BTreeMap<String, String>>,
    pub processor_limits: Option<BTreeMap<String, String>>,
    pub phase: Option<DataFlowPhase>,
    pub message: Option<String>,
}

impl Named for DataFlowState {
    fn name(&self) -> Option<&str> {
        self.name.as_deref().or(self.id.as_deref())
    }
}

/// The config as JSON; validation has made it an object.
fn parsed(text: Option<&str>) -> Option<serde_json::Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

/// The state's `config` string: the previous one while it means the same
/// JSON (so key order and whitespace never show a diff), else canonical.
fn config_string(remote: Option<&serde_json::Value>, previous: Option<&str>) -> Option<String> {
    let remote = remote.unwrap_or(&serde_json::Value::Null);
    if let Some(text) = previous
        && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|p| p == *remote)
    {
        return Some(text.to_owned());
    }
    Some(remote.to_string())
}

impl TypedConfig {
    fn connector(&self) -> ConnectorSpec {
        ConnectorSpec {
            kind: self.kind.clone().unwrap_or_default(),
            config: parsed(self.config.as_deref()),
        }
    }

    fn transformation(&self) -> TransformationSpec {
        TransformationSpec {
            kind: self.kind.clone().unwrap_or_default(),
            config: parsed(self.config.as_deref()),
        }
    }

    fn of(kind: String, config: Option<&serde_json::Value>, previous: Option<&TypedConfig>) -> Self {
        Self {
            kind: Some(kind),
            config: config_string(config, previous.and_then(|p| p.config.as_deref())),
        }
    }
}

impl DataFlowState {
    /// The state of `view`, keeping the user's spelling of equal configs.
    /// Every field of the view is named here: one the model adds or
    /// renames fails to compile until this says where it goes.
    fn of(view: DataFlowView, previous: &DataFlowState) -> Self {
        let DataFlowView {
            name,
            tenant_id: _,
            source,
            sink,
            transformations,
            errors,
            resources,
            checkpoint_persistence,
            channel_buffer_size,
            // Made through `POST .../snapshots`, not by the configuration;
            // the API keeps them across the provider's updates.
            snapshots: _,
            phase,
            message,
            created_at: _,
            counters: _,
        } = view;
        let connector = |spec: ConnectorSpec, previous: Option<&TypedConfig>| {
            TypedConfig::of(spec.kind, spec.config.as_ref(), previous)
        };
        // An absent map and an empty one mean the same: keep the user's form.
        let kept = |remote: Option<BTreeMap<String, String>>, previous: &Option<BTreeMap<String, String>>| {
            remote
                .filter(|m| !m.is_empty())
                .or_else(|| previous.clone().filter(BTreeMap::is_empty))
        };
        let (requests, limits) = resources.map_or((None, None), |r| (Some(r.requests), Some(r.limits)));
        let previous_list = previous.transformations.as_deref();
        // An absent list and an empty one mean the same: keep the user's form.
        let transformations = if transformations.is_empty() && previous_list.is_none() {
            None
        } else {
            Some(
                transformations
                    .into_iter()
                    .enumerate()
                    .map(|(i, t)| TypedConfig::of(t.kind, t.config.as_ref(), previous_list.and_then(|p| p.get(i))))
                    .collect(),
            )
        };
        Self {
            id: Some(name.clone()),
            name: Some(name),
            source: Some(connector(source, previous.source.as_ref())),
            sink: Some(connector(sink, previous.sink.as_ref())),
            transformations,
            errors: errors.map(|e| connector(e, previous.errors.as_ref())),
            checkpoint_persistence: Some(checkpoint_persistence),
            channel_buffer_size: Some(f64::from(channel_buffer_size)),
            processor_requests: kept(requests, &previous.processor_requests),
            processor_limits: kept(limits, &previous.processor_limits),
            phase: Some(phase),
            message,
        }
    }

    /// The whole spec, for a create or a PUT.
    fn request(&self) -> DataFlowRequest {
        DataFlowRequest {
            name: self.name.clone(),
            source: self.source.as_ref().map(TypedConfig::connector),
            sink: self.sink.as_ref().map(TypedConfig::connector),
            transformations: Some(
                self.transformations
                    .iter()
                    .flatten()
                    .map(TypedConfig::transformation)
                    .collect(),
            ),
            errors: self.errors.as_ref().map(TypedConfig::connector),
            resources: self.resources(),
            checkpoint_persistence: self.checkpoint_persistence,
            channel_buffer_size: self.channel_buffer_size.map(|v| v as u32),
        }
    }

    /// The processor's requests and limits, if either is set.
    fn resources(&self) -> Option<Resources> {
        if self.processor_requests.is_none() && self.processor_limits.is_none() {
            return None;
        }
        Some(Resources {
            requests: self.processor_requests.clone().unwrap_or_default(),
            limits: self.processor_limits.clone().unwrap_or_default(),
        })
    }

    /// Every `config` string, with its attribute path.
    fn configs(&self) -> Vec<(String, Option<&str>)> {
        let mut out: Vec<(String, Option<&str>)> =
            [("source", &self.source), ("sink", &self.sink), ("errors", &self.errors)]
                .into_iter()
                .filter_map(|(at, c)| Some((format!("{at}.config"), c.as_ref()?.config.as_deref())))
                .collect();
        out.extend(
            self.transformations
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, t)| (format!("transformations[{i}].config"), t.config.as_deref())),
        );
        out
    }
}

/// Waits until the platform has taken the spec up (left Pending), so the
/// phase in state is the one the next refresh sees. A dataflow that fails
/// to run (a source table missing, a database down) is created all the
/// same, with a warning: it keeps retrying on the platform.
async fn settled(client: &Client, mut view: DataFlowView, planned: &DataFlowState) -> Applied<DataFlowState> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while view.phase == DataFlowPhase::Pending && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        view = client.get(&path(&view.name)).await?;
    }
    let mut diags = Diagnostics::default();
    if view.phase == DataFlowPhase::Error {
        let message = view.message.clone().unwrap_or_else(|| "no message".into());
        diags.push_warning(format!("Dataflow {:?} is not running", view.name), message);
    }
    Ok((DataFlowState::of(view, planned), diags))
}

fn typed_config() -> Type {
    Type::object([("type", Type::String), ("config", Type::String)])
}

#[tonic::async_trait]
impl Resource for DataFlow {
    type State = DataFlowState;
    const TYPE: &'static str = "sless_dataflow";

    fn schema(&self) -> BlockSchema {
        BlockSchema {
            description: "A dataflow: source → ordered transformations → sink, with an optional error sink.",
            attrs: vec![
                Attr::new("id", Type::String, Kind::Computed, "The dataflow's name."),
                Attr::new(
                    "name",
                    Type::String,
                    Kind::Required,
                    format!(
                        "Name (a DNS label, 1-{} characters). Changing it replaces the dataflow.",
                        sless_model::name::MAX_LEN
                    ),
                )
                .replace(),
                Attr::new(
                    "source",
                    typed_config(),
                    Kind::Required,
                    "`{ type, config }`: `type` is a connector type (`postgresql`, `postgresql-cdc`, `kafka`, `sqs`, `clickhouse`, `trino`; the platform's docs/connectors.md lists each one's settings); `config` is the connector's settings as a JSON string (use `jsonencode`).",
                ),
                Attr::new(
                    "sink",
                    typed_config(),
                    Kind::Required,
                    "`{ type, config }` of the main sink, as for `source`.",
                ),
                Attr::new(
                    "transformations",
                    Type::List(Box::new(typed_config())),
                    Kind::Optional,
                    "Ordered list of `{ type, config }`: timestamp, flatten, filter, mask, router, select, remove, snakeCase, camelCase; `config` as a JSON string.",
                ),
                Attr::new(
                    "errors",
                    typed_config(),
                    Kind::Optional,
                    "`{ type, config }` of the error sink for messages the main sink failed to write.",
                ),
                Attr::new(
                    "checkpoint_persistence",
                    Type::Bool,
                    Kind::OptionalDefault,
                    "Keep the source's read position across restarts. Default true.",
                )
                .default(Value::Bool(true)),
                Attr::new(
                    "channel_buffer_size",
                    Type::Number,
                    Kind::OptionalDefault,
                    format!(
                        "Capacity of the channels between stages (backpressure), 1-{MAX_CHANNEL_BUFFER_SIZE}. Default {DEFAULT_CHANNEL_BUFFER_SIZE}."
                    ),
                )
                .default(Value::Number(f64::from(DEFAULT_CHANNEL_BUFFER_SIZE))),
                Attr::new(
                    "processor_requests",
                    Type::Map(Box::new(Type::String)),
                    Kind::Optional,
                    "CPU and memory the processor is guaranteed, as Kubernetes quantities: `{ cpu = \"100m\", memory = \"128Mi\" }`. Only `cpu` and `memory`. In Kubernetes mode; `sless dev` runs processors in its own process.",
                ),
                Attr::new(
                    "processor_limits",
                    Type::Map(Box::new(Type::String)),
                    Kind::Optional,
                    "CPU and memory the processor may use at most, as for `processor_requests`.",
                ),
                Attr::new(
                    "phase",
                    Type::String,
                    Kind::ComputedVolatile,
                    format!("Lifecycle phase: {}.", phases(&DataFlowPhase::ALL)),
                ),
                Attr::new(
                    "message",
                    Type::String,
                    Kind::ComputedVolatile,
                    "Explanation of the phase.",
                ),
            ],
            timeouts: false,
        }
    }

    fn data_description(&self) -> &'static str {
        "Reads an existing dataflow by name."
    }

    fn validate(&self, config: &DataFlowState) -> Diagnostics {
        let mut diags = Diagnostics::default();
        check_name(config.name.as_deref(), &mut diags);
        check_whole(
            config.channel_buffer_size,
            "channel_buffer_size",
            1..=i64::from(MAX_CHANNEL_BUFFER_SIZE),
            &mut diags,
        );
        if let Some(resources) = config.resources() {
            let mut errors = ValidationErrors::default();
            resources.check(&mut errors);
            for e in errors.0 {
                // `resources.requests.cpu` is the attribute `processor_requests`.
                let attr = if e.field.starts_with("resources.requests") {
                    "processor_requests"
                } else {
                    "processor_limits"
                };
                diags.push_error(format!("Invalid {attr}"), e.to_string(), Some(attr));
            }
        }
        for (path, text) in config.configs() {
            if let Some(text) = text
                && let Err(e) = serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
            {
                let root = path.split(['.', '[']).next().unwrap_or_default().to_owned();
                diags.push_error(
                    format!("Invalid {path}"),
                    format!("must be a JSON object (use jsonencode): {e}"),
                    Some(&root),
                );
            }
        }
        diags
    }

    async fn create(&self, client: &Client, planned: DataFlowState) -> Applied<DataFlowState> {
        let view = client.send(Method::POST, COLLECTION, &planned.request()).await?;
        settled(client, view, &planned).await
    }

    async fn read(&self, client: &Client, prior: &DataFlowState) -> Result<Option<DataFlowState>, Diagnostics> {
        Ok(read_view(client, COLLECTION, prior.name())
            .await?
            .map(|view| DataFlowState::of(view, prior)))
    }

    async fn update(&self, client: &Client, planned: DataFlowState) -> Applied<DataFlowState> {
        let name = planned.name().unwrap_or_default();
        let view = client.send(Method::PUT, &path(name), &planned.request()).await?;
        settled(client, view, &planned).await
    }

    async fn delete(&self, client: &Client, prior: DataFlowState) -> Result<(), Diagnostics> {
        delete_object(client, COLLECTION, prior.name().unwrap_or_default())
            .await
            .map(drop)
    }

    /// `terraform import sless_dataflow.x NAME`: the rest comes from Read.
    fn import(&self, id: &str) -> DataFlowState {
        DataFlowState {
            id: Some(id.to_owned()),
            name: Some(id.to_owned()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn equal_json_keeps_the_users_string() {
        let remote = json!({"table": "t", "connectionString": "c"});
        let previous = r#"{ "connectionString": "c",   "table": "t" }"#;
        assert_eq!(config_string(Some(&remote), Some(previous)).as_deref(), Some(previous));
        assert_eq!(
            config_string(Some(&remote), None).as_deref(),
            Some(r#"{"connectionString":"c","table":"t"}"#)
        );
        let changed = json!({"table": "u", "connectionString": "c"});
        assert_ne!(config_string(Some(&changed), Some(previous)).as_deref(), Some(previous));
    }

    fn typed(kind: &str, config: &str) -> Option<TypedConfig> {
        Some(TypedConfig {
            kind: Some(kind.into()),
            config: Some(config.into()),
        })
    }

    #[test]
    fn invalid_config_json_and_buffer_sizes_are_diagnostics() {
        let config = DataFlowState {
            name: Some("ok".into()),
            source: typed("kafka", "{nope"),
            ..Default::default()
        };
        let diags = DataFlow.validate(&config);
        assert_eq!(diags.0.len(), 1);
        assert!(diags.0[0].summary.contains("source.config"));
        for (size, ok) in [
            (0.0, false),
            (1.5, false),
            (100_001.0, false),
            (1.0, true),
            (100_000.0, true),
        ] {
            let config = DataFlowState {
                channel_buffer_size: Some(size),
                ..Default::default()
            };
            assert_eq!(DataFlow.validate(&config).0.is_empty(), ok, "{size}");
        }
        let config = DataFlowState {
            processor_limits: Some([("nvidia.com/gpu".to_owned(), "1".to_owned())].into()),
            processor_requests: Some([("cpu".to_owned(), "100m".to_owned())].into()),
            ..Default::default()
        };
        let diags = DataFlow.validate(&config);
        assert_eq!(diags.0.len(), 1);
        assert_eq!(diags.0[0].summary, "Invalid processor_limits");
    }

    /// A dataflow's view as the API writes it. A struct literal: a field
    /// the model renames fails to compile here, not at apply.
    fn view() -> DataFlowView {
        DataFlowView {
            name: "orders".into(),
            tenant_id: "acme".into(),
            source: ConnectorSpec {
                kind: "postgresql".into(),
                config: Some(json!({"table": "t", "connectionString": "c"})),
            },
            sink: ConnectorSpec {
                kind: "kafka".into(),
                config: Some(json!({"topic": "orders"})),
            },
            transformations: vec![TransformationSpec {
                kind: "mask".into(),
                config: Some(json!({"fields": ["card"]})),
            }],
            errors: None,
            resources: Some(Resources {
                limits: [("memory".to_owned(), "256Mi".to_owned())].into(),
                requests: BTreeMap::new(),
            }),
            checkpoint_persistence: true,
            channel_buffer_size: 100,
            snapshots: Vec::new(),
            phase: DataFlowPhase::Running,
            message: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            counters: None,
        }
    }

    /// The view the API serializes reads back, through JSON, into the state
    /// of every attribute, keeping the user's spelling of an equal config;
    /// and the state's request is the spec the view came from.
    #[test]
    fn the_apis_view_becomes_the_state_of_every_attribute() {
        let json = serde_json::to_string(&view()).unwrap();
        let read: DataFlowView = serde_json::from_str(&json).unwrap();
        let previous = DataFlowState {
            source: typed("postgresql", r#"{ "connectionString": "c", "table": "t" }"#),
            ..Default::default()
        };
        let state = DataFlowState::of(read, &previous);
        let value = Value::from_typed(&state, &DataFlow.schema().ty()).unwrap();
        assert_eq!(value.get("id"), &Value::str("orders"));
        assert_eq!(
            value.get("source").get("config"),
            &Value::str(r#"{ "connectionString": "c", "table": "t" }"#)
        );
        assert_eq!(value.get("sink").get("type"), &Value::str("kafka"));
        assert_eq!(
            value.get("transformations"),
            &Value::List(vec![Value::Object(
                [
                    ("type".to_owned(), Value::str("mask")),
                    ("config".to_owned(), Value::str(r#"{"fields":["card"]}"#)),
                ]
                .into()
            )])
        );
        assert_eq!(value.get("errors"), &Value::Null);
        assert_eq!(value.get("channel_buffer_size"), &Value::Number(100.0));
        assert_eq!(
            value.get("processor_limits"),
            &Value::Object([("memory".to_owned(), Value::str("256Mi"))].into())
        );
        assert_eq!(
            value.get("processor_requests"),
            &Value::Null,
            "an empty map the user never wrote"
        );
        assert_eq!(value.get("phase"), &Value::str("Running"));
        assert!(value.to_typed::<DataFlowState>().unwrap() == state);

        let request = serde_json::to_value(state.request()).unwrap();
        let expected = view();
        assert_eq!(request["source"], serde_json::to_value(&expected.source).unwrap());
        assert_eq!(
            request["transformations"],
            serde_json::to_value(&expected.transformations).unwrap()
        );
        assert_eq!(request["channelBufferSize"], 100);
        assert_eq!(request["resources"], json!({"limits": {"memory": "256Mi"}}));
        assert!(request.get("errors").is_none(), "an absent error sink is not sent");
    }
}
