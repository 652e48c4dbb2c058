//! `sless_queue_service`: a tenant's managed SQS-compatible endpoint.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde::{Deserialize, Serialize};

use super::{check_name, check_whole, delete_object, phases, read_view};
use sless_model::name;
use sless_model::queue_service::{
    BYTES_PER_SECOND, DEFAULT_MEMORY_MB, DEFAULT_STORAGE_MB, Durability, MEMORY_MB, PROCESS_SYNC_MS, QueueServicePhase,
    QueueServiceRequest, QueueServiceView, REQUESTS_PER_SECOND, STORAGE_MB,
};

use crate::client::Client;
use crate::cty::{Type, Value};
use crate::diag::Diagnostics;
use crate::resource::{Applied, Failure, Named, Resource, Timeouts};
use crate::schema::{Attr, BlockSchema, Kind};

const CREATE_TIMEOUT: Duration = Duration::from_secs(600);
const DELETE_TIMEOUT: Duration = Duration::from_secs(300);
const COLLECTION: &str = "/queue-services";

fn path(name: &str) -> String {
    format!("{COLLECTION}/{name}")
}

pub struct QueueService;

/// The state of a `sless_queue_service`, one field per attribute.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueServiceState {
    pub id: Option<String>,
    pub name: Option<String>,
    pub memory_mb: Option<f64>,
    pub storage_mb: Option<f64>,
    pub persistence: Option<bool>,
    /// A string, so that a wrong value is the plan's diagnostic.
    pub durability: Option<String>,
    pub replicas: Option<f64>,
    pub requests_per_second: Option<f64>,
    pub bytes_per_second: Option<f64>,
    pub phase: Option<QueueServicePhase>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    pub created_at: Option<String>,
    pub timeouts: Option<Timeouts>,
}

impl Named for QueueServiceState {
    fn name(&self) -> Option<&str> {
        self.name.as_deref().or(self.id.as_deref())
    }
}

impl QueueServiceState {
    /// The state of `view`, with the `timeouts` only the configuration
    /// holds. Every field of the view is named here: one the model adds or
    /// renames fails to compile until this says where it goes.
    fn of(view: QueueServiceView, timeouts: Option<Timeouts>) -> Self {
        let QueueServiceView {
            name,
            tenant_id: _,
            memory_mb,
            storage_mb,
            persistence,
            durability,
            replicas,
            requests_per_second,
            bytes_per_second,
            phase,
            endpoint,
            region,
            access_key,
            secret_key,
            // Shown in diagnostics while waiting, not kept in state.
            message: _,
            created_at,
            ready_at: _,
        } = view;
        Self {
            id: Some(name.clone()),
            name: Some(name),
            memory_mb: Some(f64::from(memory_mb)),
            storage_mb: Some(f64::from(storage_mb)),
            persistence: Some(persistence),
            durability: Some(durability.as_str().to_owned()),
            replicas: Some(f64::from(replicas)),
            requests_per_second: requests_per_second.map(f64::from),
            bytes_per_second: bytes_per_second.map(|b| b as f64),
            phase: Some(phase),
            endpoint,
            region: Some(region),
            access_key,
            secret_key,
            created_at: Some(created_at),
            timeouts,
        }
    }

    /// The whole of what a create asks for or an update replaces (a PUT:
    /// a rate left out of the configuration returns to the platform's
    /// default); validation has made the numbers whole and the durability
    /// one of its values.
    fn request(&self) -> QueueServiceRequest {
        QueueServiceRequest {
            name: None,
            memory_mb: self.memory_mb.map(|v| v as i64),
            storage_mb: self.storage_mb.map(|v| v as i64),
            persistence: self.persistence,
            durability: self.durability.as_deref().and_then(|d| d.parse().ok()),
            replicas: self.replicas.map(|v| v as i64),
            requests_per_second: self.requests_per_second.map(|v| v as i64),
            bytes_per_second: self.bytes_per_second.map(|v| v as i64),
        }
    }
}

/// One or three replicas, three only with persistence: the service's rule.
fn check_replicas(config: &QueueServiceState, diags: &mut Diagnostics) {
    let Some(replicas) = config.replicas else { return };
    if replicas.fract() != 0.0 {
        diags.push_error(
            "Invalid replicas",
            format!("must be 1 or 3 (got {replicas})"),
            Some("replicas"),
        );
        return;
    }
    let request = QueueServiceRequest {
        persistence: config.persistence,
        replicas: Some(replicas as i64),
        ..Default::default()
    };
    if let Err(errors) = request.spec_over(Default::default()) {
        for e in errors.0.into_iter().filter(|e| e.field == "replicas") {
            diags.push_error("Invalid replicas", e.message, Some("replicas"));
        }
    }
}

/// Polls until Ready; Failed or the deadline is an error that still carries
/// the state, so Terraform records (and taints) what exists.
async fn wait_ready(client: &Client, name: &str, timeouts: Option<Timeouts>) -> Applied<QueueServiceState> {
    let limit = Timeouts::create(timeouts.as_ref(), CREATE_TIMEOUT)?;
    let started = Instant::now();
    let mut delay = Duration::from_millis(200);
    loop {
        let view: QueueServiceView = client.get(&path(name)).await?;
        let phase = view.phase;
        let message = view.message.clone().unwrap_or_else(|| "no message".into());
        let state = QueueServiceState::of(view, timeouts.clone());
        let failure = match phase {
            QueueServicePhase::Ready => return Ok((state, Diagnostics::default())),
            QueueServicePhase::Failed => Diagnostics::error(format!("Queue service {name:?} failed"), message),
            _ if started.elapsed() >= limit => Diagnostics::error(
                format!("Timed out waiting for queue service {name:?} to become Ready"),
                format!("still {phase:?} after {limit:?}: {message}"),
            ),
            _ => {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        return Err(Failure {
            diagnostics: failure,
            state: Some(state),
        });
    }
}

#[tonic::async_trait]
impl Resource for QueueService {
    type State = QueueServiceState;
    const TYPE: &'static str = "sless_queue_service";

    fn schema(&self) -> BlockSchema {
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
                    "durability",
                    Type::String,
                    Kind::OptionalDefault,
                    format!(
                        "When a message counts as kept, with persistence on: `disk` (default) once it is synced to \
                         disk, surviving a crash of the machine; `process` once it is written to the journal, \
                         surviving a crash of the queue engine but losing up to the last {PROCESS_SYNC_MS} ms of \
                         messages to a crash of the machine. Changes in place (the engine restarts)."
                    ),
                )
                .default(Value::String(Durability::Disk.as_str().into())),
                Attr::new(
                    "replicas",
                    Type::Number,
                    Kind::OptionalComputed,
                    "How many replicas of the queue engine keep the queues: 1, or 3 (needs persistence), which \
                     acknowledge a message once two of them hold it and go on serving when one is lost. Default: \
                     the platform's (1 in `sless dev` unless started with `--replicas 3`). Changes in place, \
                     keeping every message; where the platform runs one engine only, 3 is refused.",
                ),
                Attr::new(
                    "requests_per_second",
                    Type::Number,
                    Kind::Optional,
                    format!(
                        "SQS requests a second this service's tenant may make through each gateway, {}-{}, \
                         with a burst of one second's worth; over it calls are answered `RequestThrottled`, \
                         which the AWS SDKs retry. Unset: the platform's default (none in `sless dev` unless \
                         started with `--tenant-requests-per-second`). Changes in place.",
                        REQUESTS_PER_SECOND.start(),
                        REQUESTS_PER_SECOND.end()
                    ),
                ),
                Attr::new(
                    "bytes_per_second",
                    Type::Number,
                    Kind::Optional,
                    format!(
                        "Request body bytes a second this service's tenant may send through each gateway, \
                         {}-{} (at least one largest message a second). Unset: the platform's default. \
                         Changes in place.",
                        BYTES_PER_SECOND.start(),
                        BYTES_PER_SECOND.end()
                    ),
                ),
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
                    "region",
                    Type::String,
                    Kind::Computed,
                    "The region the queues' ARNs carry, for `region` of the AWS SDKs (the endpoint takes a \
                     signature of any region, so an SDK's default works too).",
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

    fn data_description(&self) -> &'static str {
        "Reads an existing queue service by name."
    }

    fn validate(&self, config: &QueueServiceState) -> Diagnostics {
        let mut diags = Diagnostics::default();
        check_name(config.name.as_deref(), &mut diags);
        check_whole(config.memory_mb, "memory_mb", MEMORY_MB, &mut diags);
        check_whole(config.storage_mb, "storage_mb", STORAGE_MB, &mut diags);
        check_replicas(config, &mut diags);
        check_whole(
            config.requests_per_second,
            "requests_per_second",
            REQUESTS_PER_SECOND,
            &mut diags,
        );
        check_whole(
            config.bytes_per_second,
            "bytes_per_second",
            BYTES_PER_SECOND,
            &mut diags,
        );
        // The service's rules, through its request (durability needs persistence).
        if let Some(durability) = &config.durability {
            match durability.parse::<Durability>() {
                Err(e) => diags.push_error("Invalid durability", e.message, Some("durability")),
                Ok(durability) => {
                    let request = QueueServiceRequest {
                        persistence: config.persistence,
                        durability: Some(durability),
                        ..Default::default()
                    };
                    if let Err(errors) = request.spec_over(Default::default()) {
                        for e in errors.0 {
                            diags.push_error(format!("Invalid {}", e.field), e.message, Some("durability"));
                        }
                    }
                }
            }
        }
        diags
    }

    async fn create(&self, client: &Client, planned: QueueServiceState) -> Applied<QueueServiceState> {
        let name = planned.name.clone().unwrap_or_default();
        // Checked before anything is created.
        Timeouts::create(planned.timeouts.as_ref(), CREATE_TIMEOUT)?;
        let request = QueueServiceRequest {
            name: Some(name.clone()),
            ..planned.request()
        };
        client
            .send::<_, QueueServiceView>(Method::POST, COLLECTION, &request)
            .await?;
        wait_ready(client, &name, planned.timeouts).await
    }

    async fn read(&self, client: &Client, prior: &QueueServiceState) -> Result<Option<QueueServiceState>, Diagnostics> {
        Ok(read_view(client, COLLECTION, prior.name())
            .await?
            .map(|view| QueueServiceState::of(view, prior.timeouts.clone())))
    }

    async fn update(&self, client: &Client, planned: QueueServiceState) -> Applied<QueueServiceState> {
        let name = planned.name.clone().unwrap_or_default();
        Timeouts::create(planned.timeouts.as_ref(), CREATE_TIMEOUT)?;
        client
            .send::<_, QueueServiceView>(Method::PUT, &path(&name), &planned.request())
            .await?;
        wait_ready(client, &name, planned.timeouts).await
    }

    async fn delete(&self, client: &Client, prior: QueueServiceState) -> Result<(), Diagnostics> {
        let name = prior.name().unwrap_or_default();
        let limit = Timeouts::delete(prior.timeouts.as_ref(), DELETE_TIMEOUT)?;
        if !delete_object(client, COLLECTION, name).await? {
            return Ok(());
        }
        let started = Instant::now();
        loop {
            match client.get::<serde::de::IgnoredAny>(&path(name)).await {
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
    fn import(&self, id: &str) -> QueueServiceState {
        QueueServiceState {
            id: Some(id.to_owned()),
            name: Some(id.to_owned()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::{get, post};

    use super::*;

    /// A queue service's view as the API writes it. A struct literal: a
    /// field the model renames fails to compile here, not at apply.
    fn view(phase: QueueServicePhase) -> QueueServiceView {
        QueueServiceView {
            name: "q".into(),
            tenant_id: "acme".into(),
            memory_mb: 64,
            storage_mb: 512,
            persistence: true,
            durability: Durability::Process,
            replicas: 1,
            requests_per_second: Some(500),
            bytes_per_second: None,
            phase,
            endpoint: None,
            region: "ru-msk-1".into(),
            access_key: Some("AK".into()),
            secret_key: Some("SK".into()),
            message: Some("the queue engine does not answer its health check".into()),
            created_at: "2026-01-01T00:00:00Z".into(),
            ready_at: None,
        }
    }

    /// A stand-in for the sless API whose queue service stays in `phase`.
    async fn stub_api(phase: QueueServicePhase) -> String {
        let app = Router::new()
            .route(
                "/api/v1/queue-services",
                post(move || async move { (axum::http::StatusCode::CREATED, axum::Json(view(phase))) }),
            )
            .route(
                "/api/v1/queue-services/{name}",
                get(move || async move { axum::Json(view(phase)) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn planned(create_timeout: &str) -> QueueServiceState {
        QueueServiceState {
            name: Some("q".into()),
            memory_mb: Some(64.0),
            storage_mb: Some(512.0),
            persistence: Some(true),
            timeouts: Some(Timeouts {
                create: Some(create_timeout.into()),
                delete: None,
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn failed_on_create_is_an_error_with_the_server_message_and_keeps_state() {
        let client = Client::new(
            &stub_api(QueueServicePhase::Failed).await,
            "token-0123456789abcdef",
            false,
        )
        .unwrap();
        let Err(failure) = QueueService.create(&client, planned("10m")).await else {
            panic!("a Failed service is an error");
        };
        let diags = failure.diagnostics;
        assert_eq!(diags.0.len(), 1);
        assert!(diags.0[0].summary.contains("failed"), "{:?}", diags.0[0]);
        assert_eq!(diags.0[0].detail, "the queue engine does not answer its health check");
        let state = failure
            .state
            .expect("the object exists, so its state is recorded (tainted)");
        assert_eq!(state.phase, Some(QueueServicePhase::Failed));
        assert_eq!(state.access_key.as_deref(), Some("AK"));
        assert_eq!(
            state.timeouts,
            planned("10m").timeouts,
            "what only the configuration holds is kept"
        );
    }

    #[tokio::test]
    async fn a_service_that_never_gets_ready_times_out() {
        let client = Client::new(
            &stub_api(QueueServicePhase::Provisioning).await,
            "token-0123456789abcdef",
            false,
        )
        .unwrap();
        let started = Instant::now();
        let Err(failure) = QueueService.create(&client, planned("1s")).await else {
            panic!("a service that never gets ready is an error");
        };
        assert!(started.elapsed() < Duration::from_secs(5));
        let diags = failure.diagnostics;
        assert!(diags.0[0].summary.contains("Timed out"), "{:?}", diags.0[0]);
        assert!(diags.0[0].detail.contains("still Provisioning"), "{:?}", diags.0[0]);
        assert!(failure.state.is_some());
    }

    #[test]
    fn timeouts_bound_the_wait() {
        let block = |create: &str| Timeouts {
            create: Some(create.into()),
            delete: None,
        };
        assert!(
            Timeouts::create(Some(&block("soon")), CREATE_TIMEOUT).is_err(),
            "an invalid duration is a diagnostic"
        );
        assert_eq!(
            Timeouts::create(Some(&block("90s")), CREATE_TIMEOUT).unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(Timeouts::delete(None, DELETE_TIMEOUT).unwrap(), DELETE_TIMEOUT);
    }

    /// The view the API serializes reads back, through JSON, into the
    /// state of every attribute.
    #[test]
    fn the_apis_view_becomes_the_state_of_every_attribute() {
        let json = serde_json::to_string(&view(QueueServicePhase::Ready)).unwrap();
        let view: QueueServiceView = serde_json::from_str(&json).unwrap();
        let state = QueueServiceState::of(view, None);
        let value = Value::from_typed(&state, &QueueService.schema().ty()).unwrap();
        assert_eq!(value.get("id"), &Value::str("q"));
        assert_eq!(value.get("memory_mb"), &Value::Number(64.0));
        assert_eq!(value.get("storage_mb"), &Value::Number(512.0));
        assert_eq!(value.get("persistence"), &Value::Bool(true));
        assert_eq!(value.get("durability"), &Value::str("process"));
        assert_eq!(value.get("requests_per_second"), &Value::Number(500.0));
        assert_eq!(value.get("bytes_per_second"), &Value::Null);
        assert_eq!(value.get("phase"), &Value::str("Ready"));
        assert_eq!(value.get("secret_key"), &Value::str("SK"));
        assert_eq!(value.get("created_at"), &Value::str("2026-01-01T00:00:00Z"));
        assert!(value.to_typed::<QueueServiceState>().unwrap() == state);
    }

    fn config(name: &str, memory: f64, storage: f64) -> QueueServiceState {
        QueueServiceState {
            name: Some(name.into()),
            memory_mb: Some(memory),
            storage_mb: Some(storage),
            ..Default::default()
        }
    }

    /// The plan refuses what the service would refuse, by the service's
    /// own rules: names are DNS labels, sizes whole numbers in its ranges.
    #[test]
    fn names_and_sizes_are_checked_with_the_services_rules() {
        assert!(QueueService.validate(&config("orders", 32.0, 10240.0)).0.is_empty());
        let long = "a".repeat(name::MAX_LEN + 1);
        for bad in ["Orders", "-q", "q_1", long.as_str()] {
            let diags = QueueService.validate(&config(bad, 64.0, 512.0));
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
            let diags = QueueService.validate(&config("q", memory, storage));
            assert_eq!(diags.0.len(), 1, "{memory} {storage}");
            assert_eq!(diags.0[0].summary, format!("Invalid {attr}"));
        }
        let durability = |value: &str, persistence: bool| {
            let config = QueueServiceState {
                durability: Some(value.into()),
                persistence: Some(persistence),
                ..config("q", 64.0, 512.0)
            };
            QueueService.validate(&config).0
        };
        assert!(durability("process", true).is_empty());
        assert!(durability("disk", false).is_empty());
        let wrong = durability("fsync", true);
        assert_eq!(wrong[0].summary, "Invalid durability");
        assert!(wrong[0].detail.contains("disk, process"), "{}", wrong[0].detail);
        assert_eq!(durability("process", false)[0].summary, "Invalid durability");
    }

    #[test]
    fn replicas_are_one_or_three_and_three_need_persistence() {
        let replicas = |value: f64, persistence: bool| {
            let config = QueueServiceState {
                replicas: Some(value),
                persistence: Some(persistence),
                ..config("q", 64.0, 512.0)
            };
            QueueService.validate(&config).0
        };
        assert!(replicas(3.0, true).is_empty());
        assert!(replicas(1.0, false).is_empty());
        for wrong in [0.0, 2.0, 2.5, 4.0, -3.0, 1e300] {
            let diags = replicas(wrong, true);
            assert_eq!(diags.len(), 1, "{wrong}");
            assert_eq!(diags[0].summary, "Invalid replicas");
            assert!(diags[0].detail.contains("1 or 3"), "{}", diags[0].detail);
        }
        assert!(replicas(3.0, false)[0].detail.contains("persistence"));
    }

    #[test]
    fn rates_are_whole_numbers_in_the_services_ranges() {
        let rates = |requests: Option<f64>, bytes: Option<f64>| {
            let config = QueueServiceState {
                requests_per_second: requests,
                bytes_per_second: bytes,
                ..config("q", 64.0, 512.0)
            };
            QueueService.validate(&config).0
        };
        assert!(rates(None, None).is_empty());
        assert!(rates(Some(1.0), Some(1_048_576.0)).is_empty());
        assert!(rates(Some(100_000.0), Some(1_073_741_824.0)).is_empty());
        for (requests, bytes, attr) in [
            (Some(0.0), None, "requests_per_second"),
            (Some(100_001.0), None, "requests_per_second"),
            (Some(2.5), None, "requests_per_second"),
            (None, Some(1_048_575.0), "bytes_per_second"),
            (None, Some(1e300), "bytes_per_second"),
        ] {
            let diags = rates(requests, bytes);
            assert_eq!(diags.len(), 1, "{requests:?} {bytes:?}");
            assert_eq!(diags[0].summary, format!("Invalid {attr}"));
        }
    }
}
