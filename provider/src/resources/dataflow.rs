//! `sless_dataflow`: a pipeline from a source through transformations to a sink.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::json;

use super::{check_name, delete_object, import_state, phases, read_view};
use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::schema::{Attr, BlockSchema, Kind};
use sless_model::dataflow::DataFlowPhase;

pub const TYPE: &str = "sless_dataflow";

fn typed_config() -> Type {
    Type::object([("type", Type::String), ("config", Type::String)])
}

pub fn schema() -> BlockSchema {
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
                "`{ type, config }`: `type` is a connector type (`postgresql`, `postgresql-cdc`, `kafka`, `sqs`, `clickhouse`; the platform's docs/connectors.md lists each one's settings); `config` is the connector's settings as a JSON string (use `jsonencode`).",
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
                "Capacity of the channels between stages (backpressure). Default 100.",
            )
            .default(Value::Number(100.0)),
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

pub fn data_schema() -> BlockSchema {
    let mut s = schema();
    s.description = "Reads an existing dataflow by name.";
    for a in &mut s.attrs {
        a.requires_replace = false;
        a.default = None;
        if a.name != "name" {
            a.kind = Kind::Computed;
        }
    }
    s
}

const CONNECTORS: [&str; 3] = ["source", "sink", "errors"];

/// Every `config` string of a configuration value, with its attribute.
fn configs(v: &Value) -> Vec<(String, &Value)> {
    let mut out: Vec<(String, &Value)> = CONNECTORS
        .iter()
        .filter(|c| !v.get(c).is_null())
        .map(|c| (format!("{c}.config"), v.get(c).get("config")))
        .collect();
    if let Value::List(items) = v.get("transformations") {
        out.extend(
            items
                .iter()
                .enumerate()
                .map(|(i, t)| (format!("transformations[{i}].config"), t.get("config"))),
        );
    }
    out
}

pub fn validate(config: &Value) -> Diagnostics {
    let mut diags = Diagnostics::default();
    check_name(config, &mut diags);
    for (path, value) in configs(config) {
        if let Some(text) = value.as_str()
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

fn parse(text: Option<&str>) -> serde_json::Value {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(serde_json::Value::Null)
}

fn connector_body(v: &Value) -> serde_json::Value {
    if v.is_null() {
        return serde_json::Value::Null;
    }
    json!({"type": v.get("type").as_str(), "config": parse(v.get("config").as_str())})
}

fn body(planned: &Value) -> serde_json::Value {
    let transformations: Vec<serde_json::Value> = match planned.get("transformations") {
        Value::List(items) => items.iter().map(connector_body).collect(),
        _ => vec![],
    };
    let mut b = json!({
        "name": planned.get("name").as_str(),
        "source": connector_body(planned.get("source")),
        "sink": connector_body(planned.get("sink")),
        "transformations": transformations,
        "checkpointPersistence": planned.get("checkpoint_persistence").as_bool(),
        "channelBufferSize": planned.get("channel_buffer_size").as_f64().map(|v| v as i64),
    });
    if !planned.get("errors").is_null() {
        b["errors"] = connector_body(planned.get("errors"));
    }
    b
}

/// The state's `config` string: the previous one while it means the same
/// JSON (so key order and whitespace never show a diff), else canonical.
fn config_string(remote: &serde_json::Value, previous: &Value) -> Value {
    if let Some(text) = previous.as_str()
        && serde_json::from_str::<serde_json::Value>(text).is_ok_and(|p| p == *remote)
    {
        return Value::str(text);
    }
    Value::str(remote.to_string())
}

fn connector_state(remote: &serde_json::Value, previous: &Value) -> Value {
    if remote.is_null() {
        return Value::Null;
    }
    Value::Object(BTreeMap::from([
        ("type".into(), Value::opt_str(remote["type"].as_str())),
        (
            "config".into(),
            config_string(&remote["config"], previous.get("config")),
        ),
    ]))
}

fn state_of(view: &serde_json::Value, previous: &Value) -> Value {
    let mut m = BTreeMap::new();
    m.insert("id".into(), Value::opt_str(view["name"].as_str()));
    m.insert("name".into(), Value::opt_str(view["name"].as_str()));
    for c in CONNECTORS {
        m.insert(c.into(), connector_state(&view[c], previous.get(c)));
    }
    let remote: &[serde_json::Value] = view["transformations"].as_array().map_or(&[], Vec::as_slice);
    let previous_list = match previous.get("transformations") {
        Value::List(items) => Some(items.as_slice()),
        _ => None,
    };
    // An absent list and an empty one mean the same: keep the user's form.
    let transformations = if remote.is_empty() && previous_list.is_none() {
        Value::Null
    } else {
        Value::List(
            remote
                .iter()
                .enumerate()
                .map(|(i, t)| connector_state(t, previous_list.and_then(|p| p.get(i)).unwrap_or(&Value::Null)))
                .collect(),
        )
    };
    m.insert("transformations".into(), transformations);
    m.insert(
        "checkpoint_persistence".into(),
        view["checkpointPersistence"].as_bool().map_or(Value::Null, Value::Bool),
    );
    m.insert(
        "channel_buffer_size".into(),
        view["channelBufferSize"].as_f64().map_or(Value::Null, Value::Number),
    );
    m.insert("phase".into(), Value::opt_str(view["phase"].as_str()));
    m.insert("message".into(), Value::opt_str(view["message"].as_str()));
    Value::Object(m).conform(&schema().ty())
}

const COLLECTION: &str = "/dataflows";

fn path(name: &str) -> String {
    format!("{COLLECTION}/{name}")
}

/// A failure that may still carry the state of what exists (recorded tainted).
type Failure = (Diagnostics, Option<Value>);

fn api_failure(e: crate::client::ApiError) -> Failure {
    (e.into(), None)
}

/// Waits until the platform has taken the spec up (left Pending), so the
/// phase in state is the one the next refresh sees. A
/// dataflow that fails to run (a source table missing, a database down) is
/// created all the same, with a warning: it keeps retrying on the platform.
async fn settled(
    client: &Client,
    name: &str,
    mut view: serde_json::Value,
    planned: &Value,
) -> Result<(Value, Diagnostics), Failure> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let phase = |view: &serde_json::Value| serde_json::from_value::<DataFlowPhase>(view["phase"].clone()).ok();
    while phase(&view) == Some(DataFlowPhase::Pending) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        view = client.call(Method::GET, &path(name), None).await.map_err(api_failure)?;
    }
    let mut diags = Diagnostics::default();
    if phase(&view) == Some(DataFlowPhase::Error) {
        let message = view["message"].as_str().unwrap_or("no message").to_owned();
        diags.push_warning(format!("Dataflow {name:?} is not running"), message);
    }
    Ok((state_of(&view, planned), diags))
}

pub async fn create(client: &Client, planned: &Value) -> Result<(Value, Diagnostics), Failure> {
    let name = planned.get("name").as_str().unwrap_or_default();
    let view = client
        .call(Method::POST, COLLECTION, Some(&body(planned)))
        .await
        .map_err(api_failure)?;
    settled(client, name, view, planned).await
}

pub async fn update(client: &Client, planned: &Value) -> Result<(Value, Diagnostics), Failure> {
    let name = planned.get("name").as_str().unwrap_or_default();
    let view = client
        .call(Method::PUT, &path(name), Some(&body(planned)))
        .await
        .map_err(api_failure)?;
    settled(client, name, view, planned).await
}

pub async fn read(client: &Client, prior: &Value) -> Result<Option<Value>, Diagnostics> {
    Ok(read_view(client, COLLECTION, prior)
        .await?
        .map(|view| state_of(&view, prior)))
}

pub async fn delete(client: &Client, prior: &Value) -> Result<(), Diagnostics> {
    delete_object(client, COLLECTION, prior).await.map(drop)
}

/// `terraform import sless_dataflow.x NAME`.
pub fn import(id: &str) -> Value {
    import_state(id, &schema().ty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_json_keeps_the_users_string() {
        let remote = json!({"table": "t", "connectionString": "c"});
        let previous = Value::str(r#"{ "connectionString": "c",   "table": "t" }"#);
        assert_eq!(config_string(&remote, &previous), previous);
        assert_eq!(
            config_string(&remote, &Value::Null),
            Value::str(r#"{"connectionString":"c","table":"t"}"#)
        );
        let changed = json!({"table": "u", "connectionString": "c"});
        assert_ne!(config_string(&changed, &previous), previous);
    }

    #[test]
    fn invalid_config_json_is_a_diagnostic() {
        let config = Value::Object(BTreeMap::from([
            ("name".into(), Value::str("ok")),
            (
                "source".into(),
                Value::Object(BTreeMap::from([
                    ("type".into(), Value::str("kafka")),
                    ("config".into(), Value::str("{nope")),
                ])),
            ),
        ]));
        let diags = validate(&config);
        assert_eq!(diags.0.len(), 1);
        assert!(diags.0[0].summary.contains("source.config"));
    }
}
