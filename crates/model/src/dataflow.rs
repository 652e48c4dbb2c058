//! DataFlow: a pipeline source → transformations → sink (seed 001), with the
//! validation rules of upstream's validating webhook. The model knows the
//! shape of a dataflow; what each connector and transformation accepts is
//! known by its component, which [`Components`] asks for.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{FieldError, ValidationErrors};

pub const DEFAULT_CHANNEL_BUFFER_SIZE: u32 = 100;
pub const MAX_CHANNEL_BUFFER_SIZE: u32 = 100_000;
pub const MAX_TRANSFORMATIONS: usize = 64;
/// Most snapshot requests a dataflow keeps: the oldest two are folded into
/// one past it (a table may then be read once more, never less).
pub const MAX_SNAPSHOT_REQUESTS: usize = 16;

/// A source, sink or error sink: its type and its type-specific config.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectorSpec {
    /// The connector's type, one the component registry of `sless-dataflow` lists.
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

/// Which end of a dataflow a connector sits on; the configs differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Source,
    Sink,
}

/// Reference to one key of a Kubernetes Secret, which the operator resolves
/// before the processor starts; any connector field `x` may be given as
/// `xSecretRef` instead.
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

/// What each connector and transformation type accepts. The model does not
/// know the types: the component registry of `sless-dataflow` answers, so
/// the REST API, the webhook and the processor apply the same rules.
pub trait Components {
    /// Checks the connector `spec` at `path` (e.g. `sink`): its type and
    /// its config, each problem at its field.
    fn check_connector(&self, spec: &ConnectorSpec, role: Role, path: &str, errors: &mut ValidationErrors);

    /// Checks the transformation `spec` at `path` (e.g. `transformations[2]`).
    fn check_transformation(&self, spec: &TransformationSpec, path: &str, errors: &mut ValidationErrors);

    /// The tables `source` can be asked to read again (a snapshot
    /// request), as its config names them; `Err`: why it cannot.
    fn snapshot_tables(&self, source: &ConnectorSpec) -> Result<Vec<String>, String>;
}

/// Body of `POST /dataflows/{name}/snapshots`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotTables {
    /// Tables the source captures, as its config names them; each read
    /// again in chunks while the stream goes on.
    #[serde(default)]
    pub tables: Vec<String>,
}

/// A tenant's request that a change capture source read tables again
/// (`POST /dataflows/{name}/snapshots`), while it streams on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Greater than every earlier request's (milliseconds since the epoch
    /// when made): the source reads each request once, the newest last.
    pub id: u64,
    /// Tables as the source's config names them.
    pub tables: Vec<String>,
}

/// One step of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformationSpec {
    /// The transformation's type, one the component registry of `sless-dataflow` lists.
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
    /// Tables the tenant asked the source to read again, oldest first. Not
    /// part of a create or update body: `POST /snapshots` adds them, and an
    /// update keeps those the new spec still captures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRequest>,
}

impl DataFlowSpec {
    /// Adds a request to read `tables` again (checked by
    /// [`Self::check_snapshot`]) with an id greater than any before (`now_ms`
    /// unless the last is as late); past [`MAX_SNAPSHOT_REQUESTS`] the
    /// oldest two become one. Returns the new request's id.
    pub fn request_snapshot(&mut self, tables: Vec<String>, now_ms: u64) -> u64 {
        let id = self.snapshots.last().map_or(now_ms, |last| now_ms.max(last.id + 1));
        self.snapshots.push(SnapshotRequest { id, tables });
        if self.snapshots.len() > MAX_SNAPSHOT_REQUESTS {
            let oldest = self.snapshots.remove(0);
            let next = &mut self.snapshots[0].tables;
            for table in oldest.tables.into_iter().rev() {
                if !next.contains(&table) {
                    next.insert(0, table);
                }
            }
        }
        id
    }

    /// Whether this spec's source may be asked to read `tables` again: each
    /// one it captures, at least one, none twice; problems at
    /// `{path}[i]`.
    pub fn check_snapshot(
        &self,
        components: &dyn Components,
        tables: &[String],
        path: &str,
        errors: &mut ValidationErrors,
    ) {
        let captured = match components.snapshot_tables(&self.source) {
            Ok(captured) if self.checkpoint_persistence => captured,
            Ok(_) => {
                errors.push(FieldError::invalid(
                    path,
                    "reading tables again needs checkpointPersistence: the source keeps which requests it has read",
                ));
                return;
            }
            Err(reason) => {
                errors.push(FieldError::invalid(path, reason));
                return;
            }
        };
        // A body may name any number of anything: bounded before each
        // name is looked at, and each echoed clipped.
        if tables.is_empty() || tables.len() > captured.len() {
            let why = match tables.len() {
                0 => "name at least one table".to_owned(),
                n => format!("names {n} tables; the source captures {}", captured.len()),
            };
            errors.push(FieldError::invalid(path, why));
            return;
        }
        let mut listed = false;
        for (i, table) in tables.iter().enumerate() {
            let shown: String = table.chars().take(80).collect();
            if !captured.contains(table) {
                // The captured tables once, not with every unknown name.
                let them = match std::mem::replace(&mut listed, true) {
                    false => format!(" (it captures {})", captured.join(", ")),
                    true => String::new(),
                };
                errors.push(FieldError::invalid(
                    format!("{path}[{i}]"),
                    format!("{shown:?} is not a table the source captures{them}"),
                ));
            } else if tables[..i].contains(table) {
                errors.push(FieldError::invalid(
                    format!("{path}[{i}]"),
                    format!("{shown:?} is named twice"),
                ));
            }
        }
    }

    /// Takes the snapshot requests of `earlier` (the spec this one
    /// replaces) that are still to be read: the tables this spec still
    /// captures, none when its source cannot read tables again.
    pub fn keep_snapshots(&mut self, earlier: &DataFlowSpec, components: &dyn Components) {
        let captured = match components.snapshot_tables(&self.source) {
            Ok(captured) if self.checkpoint_persistence => captured,
            _ => return,
        };
        self.snapshots = earlier
            .snapshots
            .iter()
            .map(|r| SnapshotRequest {
                id: r.id,
                tables: r.tables.iter().filter(|t| captured.contains(t)).cloned().collect(),
            })
            .filter(|r| !r.tables.is_empty())
            .collect();
    }

    /// Applies upstream's webhook rules; every problem is reported.
    pub fn validate(&self, components: &dyn Components) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::default();
        self.check_snapshots(components, &mut errors);
        components.check_connector(&self.source, Role::Source, "source", &mut errors);
        components.check_connector(&self.sink, Role::Sink, "sink", &mut errors);
        if let Some(sink) = &self.errors {
            components.check_connector(sink, Role::Sink, "errors", &mut errors);
        }
        if self.transformations.len() > MAX_TRANSFORMATIONS {
            errors.push(FieldError::invalid(
                "transformations",
                format!("at most {MAX_TRANSFORMATIONS} transformations are allowed"),
            ));
        }
        for (i, t) in self.transformations.iter().enumerate() {
            components.check_transformation(t, &format!("transformations[{i}]"), &mut errors);
        }
        if let Some(resources) = &self.resources {
            resources.check(&mut errors);
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

    /// The kept snapshot requests (a DataFlow object's may be written by
    /// hand): at most [`MAX_SNAPSHOT_REQUESTS`], ids increasing, each
    /// request one [`Self::check_snapshot`] takes.
    fn check_snapshots(&self, components: &dyn Components, errors: &mut ValidationErrors) {
        if self.snapshots.len() > MAX_SNAPSHOT_REQUESTS {
            errors.push(FieldError::invalid(
                "snapshots",
                format!("at most {MAX_SNAPSHOT_REQUESTS} requests"),
            ));
            return;
        }
        for (i, request) in self.snapshots.iter().enumerate() {
            if i > 0 && request.id <= self.snapshots[i - 1].id {
                errors.push(FieldError::invalid(
                    format!("snapshots[{i}].id"),
                    "must be greater than the request's before it",
                ));
            }
            self.check_snapshot(components, &request.tables, &format!("snapshots[{i}].tables"), errors);
        }
    }
}

/// The resources a processor may ask for: a tenant names CPU and memory,
/// never another kind a node offers (GPUs, hugepages).
pub const PROCESSOR_RESOURCES: [&str; 2] = ["cpu", "memory"];

impl Resources {
    /// Each name one of [`PROCESSOR_RESOURCES`], each value a quantity;
    /// problems at `resources.{limits|requests}.{name}`.
    pub fn check(&self, errors: &mut ValidationErrors) {
        for (section, map) in [("limits", &self.limits), ("requests", &self.requests)] {
            for (name, quantity) in map {
                let field = format!("resources.{section}.{name}");
                if !PROCESSOR_RESOURCES.contains(&name.as_str()) {
                    errors.push(FieldError::not_supported(field, name, &PROCESSOR_RESOURCES));
                } else if !is_quantity(quantity) {
                    errors.push(FieldError::invalid(
                        field,
                        format!("{quantity:?} is not a non-negative Kubernetes quantity such as 500m or 256Mi"),
                    ));
                }
            }
        }
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataFlowRequest {
    /// DNS label, 1–63 characters. Required on create; on update it must match the path.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", max_length = 63)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<ConnectorSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink: Option<ConnectorSpec>,
    /// Applied in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transformations: Option<Vec<TransformationSpec>>,
    /// Where messages go that the sink failed to write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<ConnectorSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Keep the source's read position across restarts. Default true.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_persistence: Option<bool>,
    /// Capacity of the channels between stages (backpressure), 1–100000. Default 100.
    #[serde(
        default,
        deserialize_with = "crate::whole_number",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(minimum = 1, maximum = 100000)]
    pub channel_buffer_size: Option<u32>,
}

impl DataFlowRequest {
    /// The full spec of a create or PUT: absent optional fields take defaults.
    pub fn into_spec(self, components: &dyn Components) -> Result<DataFlowSpec, ValidationErrors> {
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
            snapshots: Vec::new(),
        };
        spec.validate(components)?;
        Ok(spec)
    }

    /// A PATCH: the fields present replace those of `current`.
    pub fn patch(self, current: &DataFlowSpec, components: &dyn Components) -> Result<DataFlowSpec, ValidationErrors> {
        let current = current.clone();
        let spec = DataFlowSpec {
            source: self.source.unwrap_or(current.source),
            sink: self.sink.unwrap_or(current.sink),
            transformations: self.transformations.unwrap_or(current.transformations),
            errors: self.errors.or(current.errors),
            resources: self.resources.or(current.resources),
            checkpoint_persistence: self.checkpoint_persistence.unwrap_or(current.checkpoint_persistence),
            channel_buffer_size: self.channel_buffer_size.unwrap_or(current.channel_buffer_size),
            snapshots: Vec::new(),
        };
        spec.validate(components)?;
        Ok(spec)
    }
}

/// Lifecycle phase of a dataflow (seed 001's), the same in the API, the
/// DataFlow status and the Terraform provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, schemars::JsonSchema)]
pub enum DataFlowPhase {
    /// Accepted; its processor is starting.
    Pending,
    /// Its processor runs.
    Running,
    /// Its processor cannot run or keeps failing; see `message`.
    Error,
    /// Its processor was stopped and its objects removed: the dataflow is
    /// being deleted (seed 001).
    Stopped,
}

impl DataFlowPhase {
    pub const ALL: [Self; 4] = [Self::Pending, Self::Running, Self::Error, Self::Stopped];
}

/// Observed state of a dataflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFlowStatus {
    pub phase: DataFlowPhase,
    pub message: Option<String>,
}

/// What the API returns for a dataflow (and the provider reads): the spec
/// plus its status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
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
    /// Requests to read tables again (`POST .../snapshots`), oldest first;
    /// the source reads each once.
    #[serde(default)]
    pub snapshots: Vec<SnapshotRequest>,
    pub phase: DataFlowPhase,
    pub message: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// What the running processor has done since it started; null when no
    /// processor runs.
    pub counters: Option<DataFlowCounters>,
}

/// Counters of a running processor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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

/// Most events kept or returned for one dataflow.
pub const MAX_EVENTS: usize = 20;

/// Something that happened to a dataflow: a phase it entered, or another
/// reason to be in it. `sless dev` records its processors' reports;
/// `sless serve` reads the Kubernetes Events the operator publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataFlowEvent {
    /// When it last happened, RFC 3339.
    pub at: String,
    /// `Warning` or `Normal`, as Kubernetes Events say it.
    pub kind: EventKind,
    /// A short word: the phase entered, or the operator's reason.
    pub reason: String,
    pub message: String,
    /// How many times in a row it happened.
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum EventKind {
    Normal,
    Warning,
}

/// A dataflow's recent events, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DataFlowEventList {
    pub items: Vec<DataFlowEvent>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubernetes_quantities() {
        for ok in ["1", "0.5", "500m", "256Mi", "1e3", "2G"] {
            assert!(super::is_quantity(ok), "{ok}");
        }
        for bad in ["-1", "lots", "", "1.5.2"] {
            assert!(!super::is_quantity(bad), "{bad}");
        }
    }

    /// A tenant asks for CPU and memory only: another kind of node
    /// resource (a GPU) is refused at its field, as a bad quantity is.
    #[test]
    fn a_processor_asks_for_cpu_and_memory_in_quantities() {
        let resources = super::Resources {
            limits: [
                ("memory".to_owned(), "256Mi".to_owned()),
                ("nvidia.com/gpu".to_owned(), "8".to_owned()),
            ]
            .into(),
            requests: [("cpu".to_owned(), "lots".to_owned())].into(),
        };
        let mut errors = super::ValidationErrors::default();
        resources.check(&mut errors);
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["resources.limits.nvidia.com/gpu", "resources.requests.cpu"]);
        assert!(
            errors.0[0].message.contains("supported values: cpu, memory"),
            "{}",
            errors.0[0]
        );
    }
}
