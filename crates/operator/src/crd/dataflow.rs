//! DataFlow (`dataflow.dataflow.io/v1`): a pipeline source → transformations
//! → sinks, as seed 001 defines it. The connector and transformation shapes
//! are the REST API's, so one set of validation rules serves both.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use sless_dataflow::{component, registry};

use sless_model::ValidationErrors;
use sless_model::dataflow::{
    ConnectorSpec, DataFlowPhase, DataFlowRequest, DataFlowSpec, Resources, SnapshotRequest, TransformationSpec,
};

#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "dataflow.dataflow.io",
    version = "v1",
    kind = "DataFlow",
    namespaced,
    status = "DataFlowStatus",
    shortname = "df",
    derive = "Default",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.source.type"}"#,
    printcolumn = r#"{"name":"Sink","type":"string","jsonPath":".spec.sink.type"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowCrdSpec {
    #[schemars(schema_with = "source_schema")]
    pub source: ConnectorSpec,
    #[schemars(schema_with = "sink_schema")]
    pub sink: ConnectorSpec,
    /// Applied in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "transformations_schema")]
    pub transformations: Vec<TransformationSpec>,
    /// Where messages the sink refused go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "errors_schema")]
    pub errors: Option<ConnectorSpec>,
    /// CPU and memory of the processor pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
    /// Keep polling sources' read position in a ConfigMap. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_persistence: Option<bool>,
    /// Records buffered between the source and the processor. Default 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_buffer_size: Option<u32>,
    /// Processor image, instead of the operator's PROCESSOR_IMAGE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processor_image: Option<String>,
    /// Requests to read tables of a `postgresql-cdc` source again, oldest
    /// first, ids increasing (the REST API's `POST .../snapshots` adds one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRequest>,
}

/// `schema` with its `type` property limited to `kinds`: the Kubernetes
/// schema names the types the component registry has, so `kubectl explain`
/// lists them and the API server refuses others before the webhook runs.
fn with_kinds(mut schema: Schema, kinds: &[&str]) -> Schema {
    if let Some(serde_json::Value::Object(kind)) = schema.pointer_mut("/properties/type") {
        kind.insert("enum".into(), serde_json::json!(kinds));
        // The API server requires a default to pass the schema, and "" is
        // no kind; a missing type is the webhook's to report.
        kind.remove("default");
    }
    schema
}

fn source_schema(generator: &mut SchemaGenerator) -> Schema {
    with_kinds(
        ConnectorSpec::json_schema(generator),
        &component::kinds(registry::SOURCES),
    )
}

fn sink_schema(generator: &mut SchemaGenerator) -> Schema {
    with_kinds(
        ConnectorSpec::json_schema(generator),
        &component::kinds(registry::SINKS),
    )
}

fn errors_schema(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = sink_schema(generator);
    schema.insert("nullable".into(), true.into());
    schema
}

fn transformations_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = with_kinds(
        TransformationSpec::json_schema(generator),
        &component::kinds(registry::TRANSFORMS),
    );
    schemars::json_schema!({"type": "array", "items": item})
}

/// Where the processor pod may run.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Scheduling {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

impl DataFlowCrdSpec {
    /// The pipeline spec, checked with the REST API's (and upstream's
    /// webhook's) rules.
    pub fn to_spec(&self) -> Result<DataFlowSpec, ValidationErrors> {
        let mut spec = DataFlowRequest {
            name: None,
            source: Some(self.source.clone()),
            sink: Some(self.sink.clone()),
            transformations: Some(self.transformations.clone()),
            errors: self.errors.clone(),
            resources: self.resources.clone(),
            checkpoint_persistence: self.checkpoint_persistence,
            channel_buffer_size: self.channel_buffer_size,
        }
        .into_spec(&sless_dataflow::registry::Registry)?;
        spec.snapshots = self.snapshots.clone();
        spec.validate(&sless_dataflow::registry::Registry)?;
        Ok(spec)
    }
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DataFlowPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Generation of the spec the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<Time>,
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    use super::*;

    #[test]
    fn connector_configs_are_open_objects_in_the_schema() {
        let crd = serde_json::to_value(DataFlow::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let config = &spec["properties"]["source"]["properties"]["config"];
        assert_eq!(config["x-kubernetes-preserve-unknown-fields"], true, "{config}");
        assert_eq!(spec["required"], json!(["sink", "source"]));
        assert_eq!(crd["spec"]["group"], "dataflow.dataflow.io");
    }

    #[test]
    fn the_schema_names_the_types_the_registry_has() {
        let crd = serde_json::to_value(DataFlow::crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let kinds = |list: Vec<&str>| json!(list);
        let sinks = kinds(component::kinds(registry::SINKS));
        assert_eq!(
            spec["source"]["properties"]["type"]["enum"],
            kinds(component::kinds(registry::SOURCES))
        );
        assert_eq!(spec["sink"]["properties"]["type"]["enum"], sinks);
        assert_eq!(spec["errors"]["properties"]["type"]["enum"], sinks);
        assert_eq!(spec["errors"]["nullable"], true);
        let step = &spec["transformations"]["items"]["properties"]["type"];
        assert_eq!(step["enum"], kinds(component::kinds(registry::TRANSFORMS)));
        assert!(step.get("default").is_none(), "a default outside the enum: {step}");
        assert!(sinks.as_array().unwrap().contains(&json!("postgresql")));
    }

    /// Snapshot requests written on the object reach the processor through
    /// the spec file the operator writes; one naming a table the source
    /// does not capture is refused (the webhook's rules).
    #[test]
    fn snapshot_requests_go_to_the_processor_and_are_checked() {
        let object = |tables: Value| -> DataFlowCrdSpec {
            serde_json::from_value(json!({
                "source": {"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "tables": ["a", "b"]}},
                "sink": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "t"}},
                "snapshots": [{"id": 7, "tables": tables}]
            }))
            .unwrap()
        };
        let spec = object(json!(["b"])).to_spec().unwrap();
        let dir = std::env::temp_dir().join(format!("sless-crd-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("spec.json");
        std::fs::write(&file, crate::dataflow::builders::spec_json(&spec)).unwrap();
        let loaded = sless_dataflow::processor::load_spec(&file).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
        assert_eq!(loaded.snapshots, spec.snapshots);
        assert_eq!(loaded.snapshots[0].tables, ["b"]);
        let refused = object(json!(["c"])).to_spec().unwrap_err();
        assert_eq!(refused.0[0].field, "snapshots[0].tables[0]");
    }

    #[test]
    fn a_resource_is_checked_with_the_rest_api_rules() {
        let good: DataFlowCrdSpec = serde_json::from_value(json!({
            "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "in"}},
            "sink": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "t"}},
            "transformations": [{"type": "mask", "config": {"fields": ["card"]}}]
        }))
        .unwrap();
        let spec = good.to_spec().unwrap();
        assert!(spec.checkpoint_persistence);
        assert_eq!(spec.channel_buffer_size, 100);
        let bad: DataFlowCrdSpec = serde_json::from_value(json!({
            "source": {"type": "mysql", "config": {}},
            "sink": {"type": "postgresql", "config": {"table": "t"}}
        }))
        .unwrap();
        let errors = bad.to_spec().unwrap_err().to_string();
        assert!(errors.contains("source.type"), "{errors}");
        assert!(errors.contains("mysql"), "{errors}");
        assert!(errors.contains("sink.config.connectionString"), "{errors}");
    }
}
