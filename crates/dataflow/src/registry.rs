//! The one list of dataflow components. A connector or transformation type
//! exists when it is listed here; the REST API and the webhook validate
//! through [`Registry`] (the model's [`Components`]), and the processor
//! connects and builds through the same descriptors, by the lookups below.
//! Components import nothing from here: the list sits above them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;
use sless_model::dataflow::{Components, ConnectorSpec, DataFlowSpec, Role, TransformationSpec};
use sless_model::{FieldError, ValidationErrors};

use crate::component;
use crate::context::{PipelineContext, QueueAccess};
use crate::sinks::Sink;
use crate::sources::Source;
use crate::sqs_client;
use crate::transforms::{
    self, BuildError, Outputs, Transform, camel_case, filter, flatten, mask, remove, router, select, snake_case,
    timestamp,
};
use crate::{ConnectorError, sinks, sources};

/// Transformations, by the `type` a spec names them with.
pub static TRANSFORMS: &[transforms::Descriptor] = &[
    transforms::Descriptor::of::<timestamp::Timestamp>(),
    transforms::Descriptor::of::<flatten::Flatten>(),
    transforms::Descriptor::of::<filter::Filter>(),
    transforms::Descriptor::of::<mask::Mask>(),
    transforms::Descriptor::of::<router::Router>(),
    transforms::Descriptor::of::<select::Select>(),
    transforms::Descriptor::of::<remove::Remove>(),
    transforms::Descriptor::of::<snake_case::SnakeCase>(),
    transforms::Descriptor::of::<camel_case::CamelCase>(),
];

/// Sources, by type.
pub static SOURCES: &[sources::Descriptor] = &[
    sources::Descriptor::of::<sources::clickhouse::ClickHouseSource>(),
    #[cfg(feature = "kafka")]
    sources::Descriptor::of::<sources::kafka::KafkaSource>(),
    sources::Descriptor::of::<sources::postgres::PostgresSource>(),
    sources::Descriptor::of::<sources::postgres_cdc::PostgresCdcSource>(),
    sources::Descriptor::of::<sources::sqs::SqsSource>(),
    #[cfg(feature = "trino")]
    sources::Descriptor::of::<sources::trino::TrinoSource>(),
    #[cfg(feature = "nessie")]
    sources::Descriptor::of::<sources::nessie::NessieSource>(),
];

/// Sinks, by type.
pub static SINKS: &[sinks::Descriptor] = &[
    sinks::Descriptor::of::<sinks::clickhouse::ClickHouseSink>(),
    #[cfg(feature = "kafka")]
    sinks::Descriptor::of::<sinks::kafka::KafkaSink>(),
    sinks::Descriptor::of::<sinks::postgres::PostgresSink>(),
    sinks::Descriptor::of::<sinks::sqs::SqsSink>(),
    #[cfg(feature = "trino")]
    sinks::Descriptor::of::<sinks::trino::TrinoSink>(),
    #[cfg(feature = "nessie")]
    sinks::Descriptor::of::<sinks::nessie::NessieSink>(),
];

/// Connector types this build leaves out (cargo features of this crate): a
/// spec naming one is told so.
pub const NOT_BUILT_IN: &[&str] = &[
    #[cfg(not(feature = "kafka"))]
    "kafka",
    #[cfg(not(feature = "trino"))]
    "trino",
    #[cfg(not(feature = "nessie"))]
    "nessie",
];

/// The component registry, as the model asks for it.
pub struct Registry;

impl Components for Registry {
    fn snapshot_tables(&self, source: &ConnectorSpec) -> Result<Vec<String>, String> {
        use crate::component::Component;
        use sources::postgres_cdc::{PostgresCdcConfig, PostgresCdcSource, SnapshotMode};
        if source.kind != PostgresCdcSource::KIND {
            return Err(format!(
                "only a {} source reads tables again; this dataflow's is {}",
                PostgresCdcSource::KIND,
                source.kind
            ));
        }
        let config: PostgresCdcConfig = serde_json::from_value(source.config.clone().unwrap_or(Value::Null))
            .map_err(|e| format!("the source's config is not valid: {e}"))?;
        if config.snapshot == SnapshotMode::InitialOnly {
            return Err("a source with snapshot: initial_only reads its tables once and streams nothing after".into());
        }
        Ok(config.tables().into_iter().map(str::to_owned).collect())
    }

    fn check_connector(&self, spec: &ConnectorSpec, role: Role, path: &str, errors: &mut ValidationErrors) {
        let type_path = format!("{path}.type");
        if spec.kind.is_empty() {
            errors.push(FieldError::required(type_path));
            return;
        }
        let check = match role {
            Role::Source => component::find(SOURCES, &spec.kind).map(|d| d.check),
            Role::Sink => component::find(SINKS, &spec.kind).map(|d| d.check),
        };
        let Some(check) = check else {
            let kinds = match role {
                Role::Source => component::kinds(SOURCES),
                Role::Sink => component::kinds(SINKS),
            };
            errors.push(if NOT_BUILT_IN.contains(&spec.kind.as_str()) {
                FieldError::invalid(
                    type_path,
                    format!(
                        "connector type {:?} is not built into this sless (cargo feature {:?}); built in: {}",
                        spec.kind,
                        spec.kind,
                        kinds.join(", ")
                    ),
                )
            } else {
                FieldError::not_supported(type_path, &spec.kind, &kinds)
            });
            return;
        };
        match &spec.config {
            None | Some(Value::Null) => errors.push(FieldError::invalid(
                format!("{path}.config"),
                format!("{} configuration is required", spec.kind),
            )),
            Some(config) => check(config, &format!("{path}.config"), errors),
        }
    }

    fn check_transformation(&self, spec: &TransformationSpec, path: &str, errors: &mut ValidationErrors) {
        if spec.kind.is_empty() {
            errors.push(FieldError::required(format!("{path}.type")));
            return;
        }
        let Some(descriptor) = component::find(TRANSFORMS, &spec.kind) else {
            let kinds = component::kinds(TRANSFORMS);
            errors.push(FieldError::not_supported(format!("{path}.type"), &spec.kind, &kinds));
            return;
        };
        match &spec.config {
            None | Some(Value::Null) => errors.push(FieldError::invalid(
                format!("{path}.config"),
                format!("{} transformation configuration is required", spec.kind),
            )),
            Some(config) => {
                (descriptor.check)(config, &format!("{path}.config"), errors);
                let _ = (descriptor.start.visit_sinks)(&mut config.clone(), &mut |field, sink| {
                    self.check_connector(sink, Role::Sink, &format!("{path}.config.{field}"), errors);
                    Ok(())
                });
            }
        }
    }
}

/// The names a spec's source gives that must lie within its tenant's
/// `scope` ([`PipelineContext::tenant`]): a replication slot, a publication,
/// a consumer group. Refused when the spec is made, with the prefix the
/// field needs (the source refuses them again when it connects).
pub fn check_scope(spec: &DataFlowSpec, scope: &str) -> ValidationErrors {
    let mut errors = ValidationErrors::default();
    if let (Some(descriptor), Some(config)) = (component::find(SOURCES, &spec.source.kind), &spec.source.config) {
        (descriptor.check_scope)(config, scope, "source.config", &mut errors);
    }
    errors
}

/// Connects the source of a spec.
pub async fn connect_source(spec: &ConnectorSpec, ctx: &PipelineContext) -> Result<Arc<dyn Source>, ConnectorError> {
    let descriptor = component::find(SOURCES, &spec.kind)
        .ok_or_else(|| ConnectorError::Config(format!("the {} connector is not supported as a source", spec.kind)))?;
    (descriptor.start.open)(spec.config.as_ref().unwrap_or(&Value::Null), ctx).await
}

/// Whether the source type resumes from a position an exactly-once sink stored.
pub fn source_resumable(kind: &str) -> bool {
    component::find(SOURCES, kind).is_some_and(|d| d.start.resumable)
}

/// Removes what a deleted dataflow's source and sink made on their
/// servers (a replication slot, a positions row), both at once: each may
/// take the whole egress connect window when its server is gone.
pub async fn release(
    source: &ConnectorSpec,
    sink: &ConnectorSpec,
    ctx: &PipelineContext,
) -> Result<(), ConnectorError> {
    let source_released = async {
        match component::find(SOURCES, &source.kind) {
            Some(descriptor) => (descriptor.start.release)(source.config.as_ref().unwrap_or(&Value::Null), ctx).await,
            None => Ok(()),
        }
    };
    let sink_released = async {
        match component::find(SINKS, &sink.kind) {
            Some(descriptor) => (descriptor.start.release)(sink.config.as_ref().unwrap_or(&Value::Null), ctx).await,
            None => Ok(()),
        }
    };
    let (source_released, sink_released) = tokio::join!(source_released, sink_released);
    source_released.and(sink_released)
}

/// Connects the sink of a spec.
pub async fn connect_sink(spec: &ConnectorSpec, ctx: &PipelineContext) -> Result<Box<dyn Sink>, ConnectorError> {
    let descriptor = component::find(SINKS, &spec.kind)
        .ok_or_else(|| ConnectorError::Config(format!("the {} connector is not supported as a sink", spec.kind)))?;
    (descriptor.start.open)(spec.config.as_ref().unwrap_or(&Value::Null), ctx).await
}

/// Builds a transformation from its spec, adding its extra outputs to `outputs`.
pub fn build_transform(spec: &TransformationSpec, outputs: &mut Outputs) -> Result<Box<dyn Transform>, BuildError> {
    let descriptor = component::find(TRANSFORMS, &spec.kind).ok_or_else(|| BuildError::Unknown(spec.kind.clone()))?;
    let empty = Value::Object(Default::default());
    (descriptor.start.build)(spec.config.as_ref().unwrap_or(&empty), outputs)
}

/// Hands every connector of `spec` to `visit`, to read or change: its
/// source, its sink, its error sink and the sinks its transformations name.
pub fn visit_connectors(
    spec: &mut DataFlowSpec,
    visit: &mut dyn FnMut(&mut ConnectorSpec) -> Result<(), String>,
) -> Result<(), String> {
    visit(&mut spec.source)?;
    visit(&mut spec.sink)?;
    if let Some(errors) = spec.errors.as_mut() {
        visit(errors)?;
    }
    for transformation in &mut spec.transformations {
        if let (Some(descriptor), Some(config)) = (
            component::find(TRANSFORMS, &transformation.kind),
            transformation.config.as_mut(),
        ) {
            (descriptor.start.visit_sinks)(config, &mut |_, sink| visit(sink))?;
        }
    }
    Ok(())
}

/// The queue services `spec`'s SQS connectors name, as the SQS component
/// reads its config.
pub fn named_queue_services(spec: &DataFlowSpec) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let _ = visit_connectors(&mut spec.clone(), &mut |connector| {
        names.extend(sqs_client::queue_service_of(connector));
        Ok(())
    });
    names
}

/// Gives each SQS connector of `spec` that names a queue service its
/// queue's URL and the service's keys, from `access`.
pub fn fill_queue_services(spec: &mut DataFlowSpec, access: &BTreeMap<String, QueueAccess>) -> Result<(), String> {
    visit_connectors(spec, &mut |connector| sqs_client::fill_queue_service(connector, access))
}

/// How many sinks `spec` writes to: its sink, its error sink and every
/// sink its transformations name (what a tenant's quota of sinks counts).
pub fn sink_count(spec: &DataFlowSpec) -> usize {
    let mut sinks = 0;
    let _ = visit_connectors(&mut spec.clone(), &mut |_| {
        sinks += 1;
        Ok(())
    });
    // Every connector visited but the source.
    sinks - 1
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use sless_model::dataflow::DataFlowRequest;

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
        .into_spec(&Registry)
        .unwrap();
        assert!(spec.checkpoint_persistence);
        assert_eq!(spec.channel_buffer_size, 100);
    }

    /// A build without the `kafka`, `trino` and `nessie` features refuses
    /// those types by name (scripts/test.sh runs this in such a build).
    #[cfg(not(any(feature = "kafka", feature = "trino", feature = "nessie")))]
    #[test]
    fn types_left_out_of_the_build_are_refused_as_not_built_in() {
        let err = request(json!({
            "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "t"}},
            "sink": {"type": "trino", "config": {"serverURL": "https://t", "catalog": "c", "schema": "s", "table": "t"}},
            "errors": {"type": "nessie", "config": {"nessieUrl": "https://n", "namespace": "n", "table": "t"}}
        }))
        .into_spec(&Registry)
        .unwrap_err();
        assert_eq!(fields_of(err.clone()), ["source.type", "sink.type", "errors.type"]);
        for e in &err.0 {
            assert!(
                e.message.contains("is not built into this sless (cargo feature"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn missing_source_and_sink() {
        assert_eq!(
            fields_of(request(json!({})).into_spec(&Registry).unwrap_err()),
            ["source", "sink"]
        );
    }

    #[test]
    fn unknown_and_missing_types() {
        let err = request(json!({
            "source": {"type": "mysql", "config": {}},
            "sink": {"config": {}}
        }))
        .into_spec(&Registry)
        .unwrap_err();
        assert_eq!(fields_of(err.clone()), ["source.type", "sink.type"]);
        assert!(err.0[0].message.contains("mysql"), "{}", err.0[0].message);
    }

    #[test]
    fn required_connector_fields() {
        let err = request(json!({
            "source": {"type": "postgresql", "config": {"table": "t"}},
            "sink": {"type": "kafka", "config": {"topicSecretRef": {"name": "s"}}}
        }))
        .into_spec(&Registry)
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
        .into_spec(&Registry)
        .unwrap();
    }

    #[test]
    fn connector_config_is_required_and_typo_is_named() {
        let err = request(
            json!({"source": {"type": "postgresql"}, "sink": {"type": "postgresql", "config": {
            "connectionString": "x", "table": "t", "tabel": "t"}}}),
        )
        .into_spec(&Registry)
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
        .into_spec(&Registry)
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

    /// The SQS component names the queue services wherever a connector
    /// stands (sink, error sink, a router's routes), and they are filled
    /// there with their queue's URL and keys; nothing else changes.
    #[test]
    fn queue_services_are_found_and_filled_in_every_connector() {
        let by_name = |service: &str| json!({"type": "sqs", "config": {"queueService": service, "queueName": "q"}});
        let mut spec = request(json!({
            "source": pg("a"), "sink": by_name("main"), "errors": by_name("dead"),
            "transformations": [{"type": "router", "config": {"routes": [
                {"condition": "x", "sink": by_name("routed")}, {"condition": "y", "sink": pg("b")}
            ]}}]
        }))
        .into_spec(&Registry)
        .unwrap();
        assert_eq!(
            named_queue_services(&spec).into_iter().collect::<Vec<_>>(),
            ["dead", "main", "routed"]
        );
        let access = |service: &str| QueueAccess {
            endpoint: format!("http://gw/sqs/{service}"),
            account_id: "000000000042".into(),
            access_key: format!("AK-{service}"),
            secret_key: "SK".into(),
        };
        let mut all: BTreeMap<String, QueueAccess> =
            ["main", "dead"].iter().map(|s| (s.to_string(), access(s))).collect();
        assert!(
            fill_queue_services(&mut spec.clone(), &all)
                .unwrap_err()
                .contains("routed")
        );
        all.insert("routed".into(), access("routed"));
        fill_queue_services(&mut spec, &all).unwrap();
        assert!(named_queue_services(&spec).is_empty());
        let routed = &spec.transformations[0].config.as_ref().unwrap()["routes"][0]["sink"]["config"];
        assert_eq!(routed["queueUrl"], "http://gw/sqs/routed/000000000042/q");
        assert_eq!(routed["accessKeyId"], "AK-routed");
        assert_eq!(
            spec.sink.config.as_ref().unwrap()["queueUrl"],
            "http://gw/sqs/main/000000000042/q"
        );
        assert_eq!(
            spec.transformations[0].config.as_ref().unwrap()["routes"][1]["sink"],
            pg("b")
        );
    }

    /// A router's sinks are checked as the pipeline's own, at their fields.
    #[test]
    fn a_routers_sinks_are_checked_where_they_stand() {
        let err = request(json!({
            "source": pg("a"), "sink": pg("b"),
            "transformations": [{"type": "router", "config": {"routes": [
                {"condition": "x", "sink": pg("c")},
                {"condition": "y", "sink": {"type": "nope", "config": {}}},
                {"condition": "z", "sink": {"type": "postgresql", "config": {"table": "t"}}}
            ]}}]
        }))
        .into_spec(&Registry)
        .unwrap_err();
        assert_eq!(
            fields_of(err),
            [
                "transformations[0].config.routes[1].sink.type",
                "transformations[0].config.routes[2].sink.config.connectionString"
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
                {"type": "timestamp", "config": {"format": "datetime"}},
                {"type": "router", "config": {"routes": [{"condition": "kind == 'a' &&", "sink": pg("x")}]}},
                {"type": "select", "config": {"fields": ["$.user.email", "items[0].sku"]}}
            ]
        }))
        .into_spec(&Registry)
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
        .into_spec(&Registry)
        .unwrap_err();
        assert_eq!(
            fields_of(err),
            ["resources.limits.cpu", "resources.requests.memory", "channelBufferSize"]
        );
    }

    #[test]
    fn patch_keeps_absent_fields() {
        let current = request(json!({"source": pg("a"), "sink": pg("b"), "channelBufferSize": 7}))
            .into_spec(&Registry)
            .unwrap();
        let patched = request(json!({"sink": pg("c")})).patch(&current, &Registry).unwrap();
        assert_eq!(patched.source, current.source);
        assert_eq!(patched.channel_buffer_size, 7);
        assert_eq!(patched.sink.config.unwrap()["table"], "c");
    }

    /// Hostile configs of the newer connectors: every problem at its field,
    /// nothing echoed without bound.
    #[test]
    fn hostile_configs_of_cdc_clickhouse_avro_and_sqs_are_named_at_their_fields() {
        let many: Vec<String> = (0..101).map(|i| format!("t{i}")).collect();
        let injected = "t; DROP TABLE users; --".repeat(100);
        let mut deep = "\"null\"".to_owned();
        for _ in 0..100 {
            deep = format!("{{\"type\":\"array\",\"items\":{deep}}}");
        }
        let cases = [
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "tables": many}}),
                "source.config.tables",
            ),
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "tables": ["ok", injected]}}),
                "source.config.tables[1]",
            ),
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "table": "t", "slotName": "Other-Tenant's"}}),
                "source.config.slotName",
            ),
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x"}}),
                "source.config.tables",
            ),
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "table": "t",
                    "snapshotChunkSize": 100_001}}),
                "source.config.snapshotChunkSize",
            ),
            (
                json!({"type": "postgresql-cdc", "config": {"connectionString": "postgres://db/x", "table": "t",
                    "snapshotChunkSize": 0}}),
                "source.config.snapshotChunkSize",
            ),
            (
                json!({"type": "clickhouse", "config": {"connectionString": "clickhouse://ch:9000", "table": "t"}}),
                "source.config.connectionString",
            ),
            (
                json!({"type": "clickhouse", "config": {"connectionString": "http://ch:8123", "table": "t", "batchSize": 0}}),
                "source.config.batchSize",
            ),
            (
                json!({"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "t", "format": "avro"}}),
                "source.config.schemaRegistry",
            ),
            (
                json!({"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "t", "format": "avro",
                    "schemaRegistry": {"url": "file:///etc/passwd"}}}),
                "source.config.schemaRegistry.url",
            ),
            (
                json!({"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "t", "avroSchema": "\"string\""}}),
                "source.config.avroSchema",
            ),
            (
                json!({"type": "sqs", "config": {"queueService": "../a", "queueName": "q"}}),
                "source.config.queueService",
            ),
            (
                json!({"type": "sqs", "config": {"queueService": "main", "queueName": "q".repeat(81)}}),
                "source.config.queueName",
            ),
        ];
        for (source, field) in cases {
            let err = request(json!({"source": source, "sink": pg("b")}))
                .into_spec(&Registry)
                .unwrap_err();
            let first = &err.0[0];
            assert_eq!(first.field, field, "{source}");
            assert!(first.message.len() < 500, "{}", first.message);
        }
        // A sink's Avro schema is parsed with its depth bounded.
        let sink = json!({"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "t", "format": "avro",
            "schemaRegistry": {"url": "http://registry:8081"}, "avroSchema": deep}});
        let err = request(json!({"source": pg("a"), "sink": sink}))
            .into_spec(&Registry)
            .unwrap_err();
        assert_eq!(fields_of(err), ["sink.config.avroSchema"]);
    }

    fn cdc(config: serde_json::Value) -> DataFlowSpec {
        request(json!({"source": {"type": "postgresql-cdc", "config": config}, "sink": pg("out")}))
            .into_spec(&Registry)
            .unwrap()
    }

    fn asked(spec: &DataFlowSpec, tables: &[&str]) -> Vec<(String, String)> {
        let tables: Vec<String> = tables.iter().map(|t| (*t).to_owned()).collect();
        let mut errors = ValidationErrors::default();
        spec.check_snapshot(&Registry, &tables, "tables", &mut errors);
        errors.0.into_iter().map(|e| (e.field, e.message)).collect()
    }

    /// A snapshot request names tables the CDC source captures; any other
    /// source, `initial_only`, or no checkpoint to keep what was read is
    /// refused with the reason.
    #[test]
    fn a_snapshot_request_names_captured_tables_of_a_cdc_source() {
        let db = "postgres://db/x";
        let spec = cdc(json!({"connectionString": db, "table": "a", "tables": ["public.b"]}));
        assert!(asked(&spec, &["public.b", "a"]).is_empty());
        let refused = asked(&spec, &["c", "a"]);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0].0, "tables[0]");
        assert!(refused[0].1.contains("it captures a, public.b"), "{}", refused[0].1);
        let refused = asked(&spec, &["a", "a"]);
        assert_eq!(
            (refused[0].0.as_str(), refused[0].1.contains("twice")),
            ("tables[1]", true)
        );
        assert_eq!(asked(&spec, &[])[0].0, "tables");
        // A hostile body: more names than the source captures is refused
        // whole, before any is looked at; a long unknown name is clipped.
        let many = vec!["a"; 100_000];
        let refused = asked(&spec, &many);
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].1.contains("names 100000 tables; the source captures 2"),
            "{refused:?}"
        );
        let long = "x".repeat(10_000);
        let refused = asked(&spec, &[&long, "zz"]);
        assert!(refused[0].1.len() < 200 && refused[1].1.len() < 100, "{refused:?}");
        assert!(!refused[1].1.contains("it captures"), "the list once: {refused:?}");
        let others = [
            (
                request(json!({"source": pg("t"), "sink": pg("u")}))
                    .into_spec(&Registry)
                    .unwrap(),
                "only a postgresql-cdc",
            ),
            (
                cdc(json!({"connectionString": db, "table": "a", "snapshot": "initial_only"})),
                "reads its tables once",
            ),
            (
                DataFlowSpec {
                    checkpoint_persistence: false,
                    ..spec.clone()
                },
                "needs checkpointPersistence",
            ),
        ];
        for (other, why) in others {
            let refused = asked(&other, &["a"]);
            assert_eq!(refused.len(), 1);
            assert!(refused[0].0 == "tables" && refused[0].1.contains(why), "{refused:?}");
        }
    }

    /// Ids only grow, whatever the clock says; past the most kept, the
    /// oldest two become one and no table is lost; an update keeps what its
    /// spec still captures; a hand-written list is checked like a request.
    #[test]
    fn snapshot_requests_grow_fold_and_follow_the_spec() {
        let db = "postgres://db/x";
        let mut spec = cdc(json!({"connectionString": db, "tables": ["a", "b", "c"]}));
        assert_eq!(spec.request_snapshot(vec!["a".into()], 1_000), 1_000);
        assert_eq!(spec.request_snapshot(vec!["b".into()], 900), 1_001);
        for i in 0..sless_model::dataflow::MAX_SNAPSHOT_REQUESTS - 1 {
            spec.request_snapshot(vec!["c".into()], 2_000 + i as u64);
        }
        assert_eq!(spec.snapshots.len(), sless_model::dataflow::MAX_SNAPSHOT_REQUESTS);
        assert_eq!(spec.snapshots[0].id, 1_001);
        assert_eq!(spec.snapshots[0].tables, ["a", "b"]);
        spec.validate(&Registry).unwrap();

        let mut narrower = cdc(json!({"connectionString": db, "tables": ["b"]}));
        narrower.keep_snapshots(&spec, &Registry);
        assert_eq!(narrower.snapshots.len(), 1);
        assert_eq!(
            (narrower.snapshots[0].id, &narrower.snapshots[0].tables[..]),
            (1_001, &["b".to_owned()][..])
        );
        let mut other = request(json!({"source": pg("t"), "sink": pg("u")}))
            .into_spec(&Registry)
            .unwrap();
        other.keep_snapshots(&spec, &Registry);
        assert!(other.snapshots.is_empty());

        let mut by_hand = spec.clone();
        by_hand.snapshots.swap(0, 1);
        by_hand.snapshots[2].tables = vec!["zzz".into()];
        assert_eq!(
            fields_of(by_hand.validate(&Registry).unwrap_err()),
            ["snapshots[1].id", "snapshots[2].tables[0]"]
        );
    }
}
