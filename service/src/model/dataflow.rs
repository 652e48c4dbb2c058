//! DataFlow: a pipeline source → transformations → sink (seed 001), with the
//! validation rules of upstream's validating webhook.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::connector_config::{self, NOT_YET_SUPPORTED, Role, SUPPORTED};
use super::{FieldError, Phase, ValidationErrors, transform_config};

pub const DEFAULT_CHANNEL_BUFFER_SIZE: u32 = 100;
pub const MAX_CHANNEL_BUFFER_SIZE: u32 = 100_000;
pub const MAX_TRANSFORMATIONS: usize = 64;

/// A source, sink or error sink: its type and its type-specific config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorSpec {
    /// `kafka` or `postgresql` (`trino`, `clickhouse`, `nessie`: not supported yet).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The connector's settings, e.g. `{"connectionString": "...", "table": "orders"}`.
    #[serde(default)]
    #[schema(value_type = Object)]
    #[schemars(schema_with = "open_object")]
    pub config: Option<serde_json::Value>,
}

/// The schema of a config: an object with any keys, checked by validation
/// rather than by the Kubernetes schema.
fn open_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

impl ConnectorSpec {
    /// Validates an optional connector at `path`, where absence is an error.
    pub fn validate_opt(spec: Option<&Self>, role: Role, path: &str, errors: &mut ValidationErrors) {
        match spec {
            None => errors.push(FieldError::required(path)),
            Some(spec) => spec.validate(role, path, errors),
        }
    }

    fn validate(&self, role: Role, path: &str, errors: &mut ValidationErrors) {
        let type_path = format!("{path}.type");
        if self.kind.is_empty() {
            errors.push(FieldError::required(type_path));
            return;
        }
        if NOT_YET_SUPPORTED.contains(&self.kind.as_str()) {
            errors.push(FieldError::invalid(
                type_path,
                format!(
                    "connector type {:?} is not supported yet; supported types: {}",
                    self.kind,
                    SUPPORTED.join(", ")
                ),
            ));
            return;
        }
        if !SUPPORTED.contains(&self.kind.as_str()) {
            errors.push(FieldError::not_supported(type_path, &self.kind, SUPPORTED));
            return;
        }
        let config_path = format!("{path}.config");
        match &self.config {
            None | Some(serde_json::Value::Null) => errors.push(FieldError::invalid(
                config_path,
                format!("{} configuration is required", self.kind),
            )),
            Some(config) => connector_config::validate(&self.kind, role, config, &config_path, errors),
        }
    }
}

/// One step of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformationSpec {
    /// timestamp, flatten, filter, mask, router, select, remove, snakeCase or camelCase.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The transformation's settings, e.g. `{"fields": ["card"]}` for mask.
    #[serde(default)]
    #[schema(value_type = Object)]
    #[schemars(schema_with = "open_object")]
    pub config: Option<serde_json::Value>,
}

/// CPU and memory of the processor, as Kubernetes quantities (`500m`, `256Mi`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
}

/// The validated desired state of a dataflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowSpec {
    pub source: ConnectorSpec,
    pub sink: ConnectorSpec,
    pub transformations: Vec<TransformationSpec>,
    pub errors: Option<ConnectorSpec>,
    pub resources: Option<Resources>,
    pub checkpoint_persistence: bool,
    pub channel_buffer_size: u32,
}

impl DataFlowSpec {
    /// Applies upstream's webhook rules; every problem is reported.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::default();
        self.source.validate(Role::Source, "source", &mut errors);
        self.sink.validate(Role::Sink, "sink", &mut errors);
        if let Some(sink) = &self.errors {
            sink.validate(Role::Sink, "errors", &mut errors);
        }
        if self.transformations.len() > MAX_TRANSFORMATIONS {
            errors.push(FieldError::invalid(
                "transformations",
                format!("at most {MAX_TRANSFORMATIONS} transformations are allowed"),
            ));
        }
        for (i, t) in self.transformations.iter().enumerate() {
            let path = format!("transformations[{i}]");
            if t.kind.is_empty() {
                errors.push(FieldError::required(format!("{path}.type")));
                continue;
            }
            if !transform_config::TYPES.contains(&t.kind.as_str()) {
                errors.push(FieldError::not_supported(
                    format!("{path}.type"),
                    &t.kind,
                    transform_config::TYPES,
                ));
                continue;
            }
            match &t.config {
                None | Some(serde_json::Value::Null) => errors.push(FieldError::invalid(
                    format!("{path}.config"),
                    format!("{} transformation configuration is required", t.kind),
                )),
                Some(config) => {
                    let before = errors.0.len();
                    transform_config::validate(&t.kind, config, &format!("{path}.config"), &mut errors);
                    // Paths, conditions and formats are checked by building
                    // the transformation the processor will run.
                    if errors.0.len() == before
                        && let Err(e) = crate::dataflow::transforms::build(t)
                    {
                        let (field, message) = e.field();
                        let field = field.map_or(format!("{path}.config"), |f| format!("{path}.config.{f}"));
                        errors.push(FieldError::invalid(field, message));
                    }
                }
            }
        }
        if let Some(resources) = &self.resources {
            for (section, map) in [("limits", &resources.limits), ("requests", &resources.requests)] {
                for (name, quantity) in map {
                    if !is_quantity(quantity) {
                        errors.push(FieldError::invalid(
                            format!("resources.{section}.{name}"),
                            format!("{quantity:?} is not a non-negative Kubernetes quantity such as 500m or 256Mi"),
                        ));
                    }
                }
            }
        }
        if !(1..=MAX_CHANNEL_BUFFER_SIZE).contains(&self.channel_buffer_size) {
            errors.push(FieldError::invalid(
                "channelBufferSize",
                format!(
                    "must be between 1 and {MAX_CHANNEL_BUFFER_SIZE} (got {})",
                    self.channel_buffer_size
                ),
            ));
        }
        errors.into_result()
    }
}

fn is_quantity(value: &str) -> bool {
    static QUANTITY: LazyLock<regex_lite::Regex> = LazyLock::new(|| {
        regex_lite::Regex::new(r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?[0-9]+)?$")
            .expect("static regex")
    });
    QUANTITY.is_match(value)
}

/// Request body of `POST /dataflows`, and of `PUT` (whole spec) and `PATCH`
/// (only the fields present change).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataFlowRequest {
    /// DNS label, 1–63 characters. Required on create; on update it must match the path.
    pub name: Option<String>,
    pub source: Option<ConnectorSpec>,
    pub sink: Option<ConnectorSpec>,
    /// Applied in order.
    pub transformations: Option<Vec<TransformationSpec>>,
    /// Where messages go that the sink failed to write.
    pub errors: Option<ConnectorSpec>,
    pub resources: Option<Resources>,
    /// Keep the source's read position across restarts. Default true.
    pub checkpoint_persistence: Option<bool>,
    /// Capacity of the channels between stages (backpressure). Default 100.
    pub channel_buffer_size: Option<u32>,
}

impl DataFlowRequest {
    /// The full spec of a create or PUT: absent optional fields take defaults.
    pub fn into_spec(self) -> Result<DataFlowSpec, ValidationErrors> {
        let mut errors = ValidationErrors::default();
        if self.source.is_none() {
            errors.push(FieldError::required("source"));
        }
        if self.sink.is_none() {
            errors.push(FieldError::required("sink"));
        }
        let (Some(source), Some(sink)) = (self.source, self.sink) else {
            return Err(errors);
        };
        let spec = DataFlowSpec {
            source,
            sink,
            transformations: self.transformations.unwrap_or_default(),
            errors: self.errors,
            resources: self.resources,
            checkpoint_persistence: self.checkpoint_persistence.unwrap_or(true),
            channel_buffer_size: self.channel_buffer_size.unwrap_or(DEFAULT_CHANNEL_BUFFER_SIZE),
        };
        spec.validate()?;
        Ok(spec)
    }

    /// A PATCH: the fields present replace those of `current`.
    pub fn patch(self, current: &DataFlowSpec) -> Result<DataFlowSpec, ValidationErrors> {
        let current = current.clone();
        let spec = DataFlowSpec {
            source: self.source.unwrap_or(current.source),
            sink: self.sink.unwrap_or(current.sink),
            transformations: self.transformations.unwrap_or(current.transformations),
            errors: self.errors.or(current.errors),
            resources: self.resources.or(current.resources),
            checkpoint_persistence: self.checkpoint_persistence.unwrap_or(current.checkpoint_persistence),
            channel_buffer_size: self.channel_buffer_size.unwrap_or(current.channel_buffer_size),
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Observed state of a dataflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFlowStatus {
    pub phase: Phase,
    pub message: Option<String>,
}

/// What the API returns for a dataflow: the spec plus its status.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowView {
    pub name: String,
    pub tenant_id: String,
    pub source: ConnectorSpec,
    pub sink: ConnectorSpec,
    pub transformations: Vec<TransformationSpec>,
    pub errors: Option<ConnectorSpec>,
    pub resources: Option<Resources>,
    pub checkpoint_persistence: bool,
    pub channel_buffer_size: u32,
    pub phase: Phase,
    pub message: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// What the running processor has done since it started; null when no
    /// processor runs.
    pub counters: Option<DataFlowCounters>,
}

/// Counters of a running processor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowCounters {
    /// Rows read from the source.
    pub read: u64,
    /// Messages written to the main sink or a route's sink.
    pub written: u64,
    /// Messages the sink refused, sent to the error sink.
    pub failed: u64,
    /// Rows a filter dropped (done, not lost).
    pub filtered: u64,
    /// When the read position was last saved, RFC 3339.
    pub last_checkpoint_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(value: serde_json::Value) -> DataFlowRequest {
        serde_json::from_value(value).unwrap()
    }

    fn pg(table: &str) -> serde_json::Value {
        json!({"type": "postgresql", "config": {"connectionString": "postgres://localhost/db", "table": table}})
    }

    fn fields_of(err: ValidationErrors) -> Vec<String> {
        err.0.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn accepts_a_full_spec_with_defaults() {
        let spec = request(json!({
            "source": pg("orders"),
            "sink": {"type": "kafka", "config": {"brokers": ["localhost:9092"], "topic": "orders"}},
            "transformations": [
                {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
                {"type": "router", "config": {"routes": [{"condition": "$.kind == 'x'", "sink": pg("x")}]}},
                {"type": "snakeCase", "config": {}}
            ],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}
        }))
        .into_spec()
        .unwrap();
        assert!(spec.checkpoint_persistence);
        assert_eq!(spec.channel_buffer_size, 100);
    }

    #[test]
    fn missing_source_and_sink() {
        assert_eq!(
            fields_of(request(json!({})).into_spec().unwrap_err()),
            ["source", "sink"]
        );
    }

    #[test]
    fn unknown_missing_and_unsupported_types() {
        let err = request(json!({
            "source": {"type": "mysql", "config": {}},
            "sink": {"config": {}},
            "errors": {"type": "trino", "config": {}}
        }))
        .into_spec()
        .unwrap_err();
        assert_eq!(fields_of(err.clone()), ["source.type", "sink.type", "errors.type"]);
        assert!(err.0[2].message.contains("not supported yet"), "{}", err.0[2].message);
    }

    #[test]
    fn required_connector_fields() {
        let err = request(json!({
            "source": {"type": "postgresql", "config": {"table": "t"}},
            "sink": {"type": "kafka", "config": {"topicSecretRef": {"name": "s"}}}
        }))
        .into_spec()
        .unwrap_err();
        assert_eq!(
            fields_of(err),
            [
                "source.config.connectionString",
                "sink.config.brokers",
                "sink.config.topicSecretRef.key"
            ]
        );
    }

    #[test]
    fn secret_refs_satisfy_required_fields() {
        request(json!({
            "source": {"type": "postgresql", "config": {
                "connectionStringSecretRef": {"name": "db", "key": "url"}, "table": "t"}},
            "sink": pg("u")
        }))
        .into_spec()
        .unwrap();
    }

    #[test]
    fn connector_config_is_required_and_typo_is_named() {
        let err = request(
            json!({"source": {"type": "postgresql"}, "sink": {"type": "postgresql", "config": {
            "connectionString": "x", "table": "t", "tabel": "t"}}}),
        )
        .into_spec()
        .unwrap_err();
        assert_eq!(fields_of(err.clone()), ["source.config", "sink.config"]);
        assert!(err.0[1].message.contains("tabel"));
    }

    #[test]
    fn transformation_rules() {
        let err = request(json!({
            "source": pg("a"), "sink": pg("b"),
            "transformations": [
                {"type": "explode", "config": {}},
                {"type": "mask"},
                {"type": "filter", "config": {"condition": ""}},
                {"type": "select", "config": {"fields": []}},
                {"config": {}},
                {"type": "router", "config": {"routes": [{"condition": "x"}]}}
            ]
        }))
        .into_spec()
        .unwrap_err();
        assert_eq!(
            fields_of(err),
            [
                "transformations[0].type",
                "transformations[1].config",
                "transformations[2].config.condition",
                "transformations[3].config.fields",
                "transformations[4].type",
                "transformations[5].config.routes[0].sink"
            ]
        );
    }

    #[test]
    fn paths_conditions_and_formats_are_checked() {
        let err = request(json!({
            "source": pg("a"), "sink": pg("b"),
            "transformations": [
                {"type": "filter", "config": {"condition": "amount >"}},
                {"type": "mask", "config": {"fields": ["card..number"]}},
                {"type": "timestamp", "config": {"format": "whenever"}},
                {"type": "router", "config": {"routes": [{"condition": "kind == 'a' &&", "sink": pg("x")}]}},
                {"type": "select", "config": {"fields": ["$.user.email", "items[0].sku"]}}
            ]
        }))
        .into_spec()
        .unwrap_err();
        assert_eq!(
            fields_of(err.clone()),
            [
                "transformations[0].config.condition",
                "transformations[1].config.fields[0]",
                "transformations[2].config.format",
                "transformations[3].config.routes[0].condition"
            ]
        );
        assert!(err.0[1].message.contains("card..number"), "{}", err.0[1].message);
    }

    #[test]
    fn quantities_and_buffer_size() {
        let err = request(json!({
            "source": pg("a"), "sink": pg("b"),
            "resources": {"limits": {"cpu": "-1"}, "requests": {"memory": "lots"}},
            "channelBufferSize": 0
        }))
        .into_spec()
        .unwrap_err();
        assert_eq!(
            fields_of(err),
            ["resources.limits.cpu", "resources.requests.memory", "channelBufferSize"]
        );
        for ok in ["1", "0.5", "500m", "256Mi", "1e3", "2G"] {
            assert!(is_quantity(ok), "{ok}");
        }
    }

    #[test]
    fn patch_keeps_absent_fields() {
        let current = request(json!({"source": pg("a"), "sink": pg("b"), "channelBufferSize": 7}))
            .into_spec()
            .unwrap();
        let patched = request(json!({"sink": pg("c")})).patch(&current).unwrap();
        assert_eq!(patched.source, current.source);
        assert_eq!(patched.channel_buffer_size, 7);
        assert_eq!(patched.sink.config.unwrap()["table"], "c");
    }
}
