//! `sless_queue_service`: a tenant's managed SQS-compatible endpoint.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use super::{check_name, delete_object, import_state, phases, read_view, timeout};
use sless_model::name;
use sless_model::queue_service::{DEFAULT_MEMORY_MB, DEFAULT_STORAGE_MB, MEMORY_MB, QueueServicePhase, STORAGE_MB};

use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::schema::{Attr, BlockSchema, Kind};

pub const TYPE: &str = "sless_queue_service";
const CREATE_TIMEOUT: Duration = Duration::from_secs(600);
const DELETE_TIMEOUT: Duration = Duration::from_secs(300);

pub fn schema() -> BlockSchema {
    BlockSchema {
        description: "A managed SQS-compatible queue service. Use its `endpoint` and keys with any AWS SDK or the AWS CLI.",
        attrs: vec![
            Attr::new("id", Type::String, Kind::Computed, "The queue service's name."),
            Attr::new(
                "name",
                Type::String,
                Kind::Required,
                format!(
                    "Name (a DNS label, 1-{} characters). Changing it replaces the queue service.",
                    name::MAX_LEN
                ),
            )
            .replace(),
            Attr::new(
                "memory_mb",
                Type::Number,
                Kind::OptionalDefault,
                format!(
                    "Memory limit of the queue engine in MiB, {}-{}. Default {DEFAULT_MEMORY_MB}. Changes in place.",
                    MEMORY_MB.start(),
                    MEMORY_MB.end()
                ),
            )
            .default(Value::Number(f64::from(DEFAULT_MEMORY_MB))),
            Attr::new(
                "storage_mb",
                Type::Number,
                Kind::OptionalDefault,
                format!(
                    "Size of the message store in MiB, {}-{}. Default {DEFAULT_STORAGE_MB}. Can only grow, in place.",
                    STORAGE_MB.start(),
                    STORAGE_MB.end()
                ),
            )
            .default(Value::Number(f64::from(DEFAULT_STORAGE_MB))),
            Attr::new(
                "persistence",
                Type::Bool,
                Kind::OptionalDefault,
                "Keep messages on disk across restarts. Default true. Changing it replaces the queue service.",
            )
            .default(Value::Bool(true))
            .replace(),
            Attr::new(
                "phase",
                Type::String,
                Kind::ComputedVolatile,
                format!("Lifecycle phase: {}.", phases(&QueueServicePhase::ALL)),
            ),
            Attr::new(
                "endpoint",
                Type::String,
                Kind::Computed,
                "SQS endpoint URL, for `endpoint_url` of the AWS SDKs.",
            ),
            Attr::new(
                "access_key",
                Type::String,
                Kind::Computed,
                "Access key id for SigV4 signing.",
            )
            .sensitive(),
            Attr::new(
                "secret_key",
                Type::String,
                Kind::Computed,
                "Secret access key for SigV4 signing.",
            )
            .sensitive(),
            Attr::new("created_at", Type::String, Kind::Computed, "Creation time, RFC 3339."),
        ],
        timeouts: true,
    }
}

pub fn data_schema() -> BlockSchema {
    let mut s = schema();
    s.description = "Reads an existing queue service by name.";
    s.timeouts = false;
    for a in &mut s.attrs {
        a.requires_replace = false;
        a.default = None;
        if a.name != "name" {
            a.kind = Kind::Computed;
        }
    }
    s
}

pub fn validate(config: &Value) -> Diagnostics {
    let mut diags = Diagnostics::default();
    check_name(config, &mut diags);
    for (attr, range) in [("memory_mb", MEMORY_MB), ("storage_mb", STORAGE_MB)] {
        if let Some(v) = config.get(attr).as_f64()
            && (v.fract() != 0.0 || !(*range.start() as f64..=*range.end() as f64).contains(&v))
        {
            diags.push_error(
                format!("Invalid {attr}"),
                format!(
                    "must be a whole number from {} to {}, got {v}",
                    range.start(),
                    range.end()
                ),
                Some(attr),
            );
        }
    }
    diags
}

/// State from the API's view, keeping what only the configuration holds.
fn state_of(view: &serde_json::Value, previous: &Value) -> Value {
    let s = |k: &str| Value::opt_str(view[k].as_str());
    let n = |k: &str| view[k].as_f64().map_or(Value::Null, Value::Number);
    let mut m = BTreeMap::new();
    m.insert("id".into(), s("name"));
    m.insert("name".into(), s("name"));
    m.insert("memory_mb".into(), n("memoryMB"));
    m.insert("storage_mb".into(), n("storageMB"));
    m.insert(
        "persistence".into(),
        view["persistence"].as_bool().map_or(Value::Null, Value::Bool),
    );
    m.insert("phase".into(), s("phase"));
    m.insert("endpoint".into(), s("endpoint"));
    m.insert("access_key".into(), s("accessKey"));
    m.insert("secret_key".into(), s("secretKey"));
    m.insert("created_at".into(), s("createdAt"));
    m.insert("timeouts".into(), previous.get("timeouts").clone());
    Value::Object(m).conform(&schema().ty())
}

const COLLECTION: &str = "/queue-services";

fn path(name: &str) -> String {
    format!("{COLLECTION}/{name}")
}

/// Polls until Ready; Failed or the deadline is an error that still carries
/// the state, so Terraform records (and taints) what exists.
async fn wait_ready(
    client: &Client,
    name: &str,
    previous: &Value,
    limit: Duration,
) -> Result<Value, (Diagnostics, Option<Value>)> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(200);
    loop {
        let view = client
            .call(Method::GET, &path(name), None)
            .await
            .map_err(|e| (Diagnostics::from(e), None))?;
        let state = state_of(&view, previous);
        let phase: Option<QueueServicePhase> = serde_json::from_value(view["phase"].clone()).ok();
        match phase {
            Some(QueueServicePhase::Ready) => return Ok(state),
            Some(QueueServicePhase::Failed) => {
                let message = view["message"].as_str().unwrap_or("no message");
                return Err((
                    Diagnostics::error(format!("Queue service {name:?} failed"), message.to_owned()),
                    Some(state),
                ));
            }
            _ => {
                if started.elapsed() >= limit {
                    let detail = format!(
                        "still {} after {:?}: {}",
                        view["phase"].as_str().unwrap_or("unknown"),
                        limit,
                        view["message"].as_str().unwrap_or("no message")
                    );
                    return Err((
                        Diagnostics::error(
                            format!("Timed out waiting for queue service {name:?} to become Ready"),
                            detail,
                        ),
                        Some(state),
                    ));
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

fn body(planned: &Value) -> serde_json::Value {
    json!({
        "memoryMB": planned.get("memory_mb").as_f64().map(|v| v as i64),
        "storageMB": planned.get("storage_mb").as_f64().map(|v| v as i64),
    })
}

pub async fn create(client: &Client, planned: &Value) -> Result<Value, (Diagnostics, Option<Value>)> {
    let name = planned.get("name").as_str().unwrap_or_default().to_owned();
    let limit = timeout(planned, "create", CREATE_TIMEOUT).map_err(|d| (d, None))?;
    let mut request = body(planned);
    request["name"] = json!(name);
    request["persistence"] = json!(planned.get("persistence").as_bool());
    client
        .call(Method::POST, "/queue-services", Some(&request))
        .await
        .map_err(|e| (e.into(), None))?;
    wait_ready(client, &name, planned, limit).await
}

pub async fn update(client: &Client, planned: &Value) -> Result<Value, (Diagnostics, Option<Value>)> {
    let name = planned.get("name").as_str().unwrap_or_default().to_owned();
    let limit = timeout(planned, "create", CREATE_TIMEOUT).map_err(|d| (d, None))?;
    client
        .call(Method::PATCH, &path(&name), Some(&body(planned)))
        .await
        .map_err(|e| (e.into(), None))?;
    wait_ready(client, &name, planned, limit).await
}

pub async fn read(client: &Client, prior: &Value) -> Result<Option<Value>, Diagnostics> {
    Ok(read_view(client, COLLECTION, prior)
        .await?
        .map(|view| state_of(&view, prior)))
}

pub async fn delete(client: &Client, prior: &Value) -> Result<(), Diagnostics> {
    let name = prior.get("name").as_str().unwrap_or_default();
    let limit = timeout(prior, "delete", DELETE_TIMEOUT)?;
    if !delete_object(client, COLLECTION, prior).await? {
        return Ok(());
    }
    let started = Instant::now();
    loop {
        match client.call(Method::GET, &path(name), None).await {
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
            Ok(_) if started.elapsed() >= limit => {
                return Err(Diagnostics::error(
                    format!("Timed out waiting for queue service {name:?} to be deleted"),
                    "",
                ));
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `terraform import sless_queue_service.x NAME`: the rest comes from Read.
pub fn import(id: &str) -> Value {
    import_state(id, &schema().ty())
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::{get, post};
    use serde_json::json;

    use super::*;

    /// A stand-in for the sless API whose queue service stays in `phase`.
    async fn stub_api(phase: &'static str) -> String {
        let view = move || {
            json!({"name": "q", "memoryMB": 64, "storageMB": 512, "persistence": true, "phase": phase,
                   "message": "the queue engine does not answer its health check", "endpoint": null,
                   "accessKey": "AK", "secretKey": "SK", "createdAt": "2026-01-01T00:00:00Z"})
        };
        let app = Router::new()
            .route(
                "/api/v1/queue-services",
                post(move || async move { (axum::http::StatusCode::CREATED, axum::Json(view())) }),
            )
            .route(
                "/api/v1/queue-services/{name}",
                get(move || async move { axum::Json(view()) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn failed_on_create_is_an_error_with_the_server_message_and_keeps_state() {
        let client = Client::new(&stub_api("Failed").await, "token-0123456789abcdef", false).unwrap();
        let planned = planned("10m");
        let (diags, state) = create(&client, &planned).await.unwrap_err();
        assert_eq!(diags.0.len(), 1);
        assert!(diags.0[0].summary.contains("failed"), "{:?}", diags.0[0]);
        assert_eq!(diags.0[0].detail, "the queue engine does not answer its health check");
        let state = state.expect("the object exists, so its state is recorded (tainted)");
        assert_eq!(state.get("phase"), &Value::str("Failed"));
        assert_eq!(state.get("access_key"), &Value::str("AK"));
    }

    fn planned(create_timeout: &str) -> Value {
        Value::Object(BTreeMap::from([
            ("name".into(), Value::str("q")),
            ("memory_mb".into(), Value::Number(64.0)),
            ("storage_mb".into(), Value::Number(512.0)),
            ("persistence".into(), Value::Bool(true)),
            (
                "timeouts".into(),
                Value::Object(BTreeMap::from([("create".into(), Value::str(create_timeout))])),
            ),
        ]))
        .conform(&schema().ty())
    }

    #[tokio::test]
    async fn a_service_that_never_gets_ready_times_out() {
        let client = Client::new(&stub_api("Provisioning").await, "token-0123456789abcdef", false).unwrap();
        let started = Instant::now();
        let (diags, state) = create(&client, &planned("1s")).await.unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(diags.0[0].summary.contains("Timed out"), "{:?}", diags.0[0]);
        assert!(diags.0[0].detail.contains("still Provisioning"), "{:?}", diags.0[0]);
        assert!(state.is_some());
    }

    #[tokio::test]
    async fn timeouts_bound_the_wait() {
        let planned = Value::Object(BTreeMap::from([(
            "timeouts".into(),
            Value::Object(BTreeMap::from([("create".into(), Value::str("soon"))])),
        )]));
        assert!(
            timeout(&planned, "create", CREATE_TIMEOUT).is_err(),
            "an invalid duration is a diagnostic"
        );
        let planned = Value::Object(BTreeMap::from([(
            "timeouts".into(),
            Value::Object(BTreeMap::from([("create".into(), Value::str("90s"))])),
        )]));
        assert_eq!(
            timeout(&planned, "create", CREATE_TIMEOUT).unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(timeout(&Value::Null, "delete", DELETE_TIMEOUT).unwrap(), DELETE_TIMEOUT);
    }

    fn config(name: &str, memory: f64, storage: f64) -> Value {
        Value::Object(BTreeMap::from([
            ("name".into(), Value::str(name)),
            ("memory_mb".into(), Value::Number(memory)),
            ("storage_mb".into(), Value::Number(storage)),
        ]))
    }

    /// The plan refuses what the service would refuse, by the service's
    /// own rules: names are DNS labels, sizes whole numbers in its ranges.
    #[test]
    fn names_and_sizes_are_checked_with_the_services_rules() {
        assert!(validate(&config("orders", 32.0, 10240.0)).0.is_empty());
        let long = "a".repeat(name::MAX_LEN + 1);
        for bad in ["Orders", "-q", "q_1", long.as_str()] {
            let diags = validate(&config(bad, 64.0, 512.0));
            assert_eq!(diags.0.len(), 1, "{bad}");
            assert_eq!(diags.0[0].summary, "Invalid name");
            let expected = sless_model::name::DnsLabel::parse(bad, "name").unwrap_err().message;
            assert_eq!(diags.0[0].detail, expected);
        }
        for (memory, storage, attr) in [
            (31.0, 512.0, "memory_mb"),
            (1025.0, 512.0, "memory_mb"),
            (64.5, 512.0, "memory_mb"),
            (64.0, 127.0, "storage_mb"),
            (64.0, 10241.0, "storage_mb"),
        ] {
            let diags = validate(&config("q", memory, storage));
            assert_eq!(diags.0.len(), 1, "{memory} {storage}");
            assert_eq!(diags.0[0].summary, format!("Invalid {attr}"));
        }
    }
}
