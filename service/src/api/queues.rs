//! `/api/v1/queue-services/{name}/queues`: the queues of a tenant's queue
//! service, for the console. Each call is an SQS request the API signs with
//! the service's own keys and sends to the service's own endpoint, so it
//! reaches exactly what the tenant's SDK would, through the same gateway.

use std::sync::LazyLock;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Tenant;
use super::error::ApiError;
use super::json::ApiJson;
use super::path::{ApiPath, ApiQuery, Named, QueueServiceKind};
use sless_model::ErrorBody;
use sless_model::FieldError;
use sless_model::queue_service::{QueueServicePhase, QueueServiceView};
use sless_sqs::client::{CallError, Client, MAX_ANSWER_BYTES};
use sless_sqs::engine::requests::{PEEK_ACTION, is_identifier};

/// One client for every call, so connections to the gateway are reused.
static HTTP: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
});

/// sless's own queue attribute: the age of the oldest message, in seconds.
const AGE: &str = "ApproximateAgeOfOldestMessage";
/// Most messages a peek shows.
const PEEK: u8 = 10;

/// A queue and its counts.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub name: String,
    pub url: String,
    pub fifo: bool,
    /// Messages available to receive.
    pub visible: u64,
    /// Received and not yet deleted.
    pub in_flight: u64,
    pub delayed: u64,
    /// Seconds since the oldest message still in the queue was sent; null
    /// where the engine does not say (ElasticMQ).
    pub oldest_message_age_seconds: Option<u64>,
    /// The queue's dead-letter queue, by name.
    pub dead_letter_queue: Option<String>,
    /// The queues that send their dead letters here, by name.
    pub dead_letter_sources: Vec<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueList {
    pub items: Vec<QueueView>,
    /// Present when more queues follow: pass it as `nextToken` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

/// A page of the queue list.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct Page {
    /// Queues a page holds, 1–100; default 50.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
    /// Where the page begins: the `nextToken` of the page before.
    pub next_token: Option<String>,
}

/// Queues a page holds unless asked otherwise, and at most.
const PAGE: u32 = 50;
const MAX_PAGE: u32 = 100;
/// SQS calls one list makes at once.
const CONCURRENT_CALLS: usize = 8;

#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueRequest {
    /// 1–80 of `A-Z a-z 0-9 - _`; a FIFO queue's ends in `.fifo`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,80}(\\.fifo)?$")]
    pub name: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessageRequest {
    /// The message's body; SQS takes no empty one.
    #[schema(min_length = 1)]
    pub body: String,
}

/// A message as a receive with visibility 0 shows it: it stays in the queue.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeekedMessage {
    pub message_id: String,
    pub body: String,
    pub receive_count: u64,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeekList {
    pub items: Vec<PeekedMessage>,
    /// Whether this peek counted as a receive of each message shown: false
    /// on sless's engine, true where the engine can only peek by receiving
    /// with visibility 0 (ElasticMQ), which can move a message into its
    /// dead-letter queue.
    pub receives_counted: bool,
}

/// The SQS endpoint and keys of a tenant's Ready queue service.
struct Service {
    view: QueueServiceView,
    endpoint: String,
}

fn queue_name(name: &str) -> Result<&str, ApiError> {
    if is_identifier(name.strip_suffix(".fifo").unwrap_or(name)) {
        Ok(name)
    } else {
        Err(ApiError::Validation(
            FieldError::invalid(
                "name",
                "must be 1 to 80 of A-Z, a-z, 0-9, - and _, and .fifo for a FIFO queue",
            )
            .into(),
        ))
    }
}

impl Service {
    async fn of(state: &AppState, tenant: &sless_model::name::DnsLabel, name: &str) -> Result<Self, ApiError> {
        let named = Named::<QueueServiceKind>::parse(name)?;
        let view = state
            .platform
            .get_queue_service(tenant, &named.label)
            .await
            .map_err(|e| ApiError::from_platform(e, named.what()))?;
        match (&view.phase, view.endpoint.clone()) {
            (QueueServicePhase::Ready, Some(endpoint)) => Ok(Self { view, endpoint }),
            (phase, _) => Err(ApiError::Conflict(format!(
                "queue service {name:?} is {phase:?}, not Ready"
            ))),
        }
    }

    /// The service and the URL of its queue `queue`; a name no queue can
    /// have is a queue that does not exist.
    async fn with_queue(
        state: &AppState,
        tenant: &sless_model::name::DnsLabel,
        name: &str,
        queue: &str,
    ) -> Result<(Self, String), ApiError> {
        let queue = queue_name(queue).map_err(|_| ApiError::NotFound("queue".into()))?;
        let service = Self::of(state, tenant, name).await?;
        let url = sless_sqs::engine::queue_url(
            &service.endpoint,
            &sless_sqs::credentials::account_id(&service.view.tenant_id),
            queue,
        );
        Ok((service, url))
    }

    /// One SQS action, signed with the service's keys.
    async fn call(&self, action: &str, input: Value) -> Result<Value, ApiError> {
        let access = self.view.access_key.as_deref().unwrap_or_default();
        let secret = self.view.secret_key.as_deref().unwrap_or_default();
        let client = Client::new(HTTP.clone(), access, secret, sless_sqs::DEFAULT_REGION);
        match client.call(&self.endpoint, action, &input, MAX_ANSWER_BYTES).await {
            Ok(value) => Ok(value),
            Err(CallError::Refused { status, code, message }) => Err(match code.as_deref() {
                Some("QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue") => {
                    ApiError::NotFound("queue".into())
                }
                Some("QueueAlreadyExists" | "QueueNameExists") => ApiError::AlreadyExists("queue".into()),
                // The tenant's own rate through the gateway (its console
                // or this API spending it beside its clients): a second's
                // wait refills at least one request.
                Some("RequestThrottled" | "ThrottlingException") => {
                    ApiError::TooManyRequests(std::time::Duration::from_secs(1))
                }
                // The name is free again 60 s after its queue was deleted.
                Some("QueueDeletedRecently" | "AWS.SimpleQueueService.QueueDeletedRecently") => {
                    ApiError::Conflict(message.unwrap_or_else(|| "the queue was deleted recently".into()))
                }
                // The tenant's own queue service's words, for the tenant,
                // on the field the action was given.
                _ if status.is_client_error() => {
                    let field = if action == "SendMessage" { "body" } else { "name" };
                    ApiError::Validation(FieldError::invalid(field, message.unwrap_or_else(|| "refused".into())).into())
                }
                _ => ApiError::Unavailable,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "queue service unreachable from the API");
                Err(ApiError::Unavailable)
            }
        }
    }

    /// A queue's counts and dead-letter queue; its sources are filled in
    /// by [`Self::queues`], which sees every queue.
    async fn view(&self, url: &str) -> Result<QueueView, ApiError> {
        let attributes =
            |names: &[&str]| self.call("GetQueueAttributes", json!({"QueueUrl": url, "AttributeNames": names}));
        // sless's engine reports the age when asked by name; an engine
        // that knows no such attribute refuses it, and is asked again.
        let attributes = match attributes(&["All", AGE]).await {
            Err(ApiError::Validation(_)) => attributes(&["All"]).await?,
            other => other?,
        }["Attributes"]
            .clone();
        let number = |key: &str| attributes[key].as_str().and_then(|v| v.parse().ok());
        let count = |key: &str| number(key).unwrap_or(0);
        let dead_letter_queue = attributes["RedrivePolicy"]
            .as_str()
            .and_then(|p| serde_json::from_str::<Value>(p).ok())
            .and_then(|p| {
                p["deadLetterTargetArn"]
                    .as_str()
                    .and_then(|a| a.rsplit(':').next())
                    .map(str::to_owned)
            });
        let name = url.rsplit('/').next().unwrap_or_default().to_owned();
        Ok(QueueView {
            fifo: name.ends_with(".fifo"),
            name,
            url: url.to_owned(),
            visible: count("ApproximateNumberOfMessages"),
            in_flight: count("ApproximateNumberOfMessagesNotVisible"),
            delayed: count("ApproximateNumberOfMessagesDelayed"),
            oldest_message_age_seconds: number(AGE),
            dead_letter_queue,
            dead_letter_sources: Vec::new(),
        })
    }

    /// The names of the queues that send their dead letters to `url`'s.
    async fn sources(&self, url: &str) -> Result<Vec<String>, ApiError> {
        let listed = self
            .call(
                "ListDeadLetterSourceQueues",
                json!({"QueueUrl": url, "MaxResults": 1000}),
            )
            .await?;
        Ok(listed["queueUrls"]
            .as_array()
            .or(listed["QueueUrls"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|u| u.as_str()?.rsplit('/').next().map(str::to_owned))
            .collect())
    }

    /// One page of the service's queues, their views fetched a few at a
    /// time. A queue's dead-letter sources are the queues whose redrive
    /// policy names it: from the page's own attributes when the page holds
    /// every queue, else asked of the engine for each queue of the page.
    async fn queues(&self, limit: u32, next_token: Option<&str>) -> Result<QueueList, ApiError> {
        use futures_util::{StreamExt, TryStreamExt};
        let mut request = json!({"MaxResults": limit});
        let first_page = next_token.is_none();
        if let Some(token) = next_token {
            request["NextToken"] = json!(token);
        }
        let listed = self.call("ListQueues", request).await?;
        let next_token = listed["NextToken"].as_str().map(str::to_owned);
        let urls: Vec<String> = listed["QueueUrls"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u.as_str().map(str::to_owned))
            .collect();
        let mut views: Vec<QueueView> =
            futures_util::stream::iter(urls.into_iter().map(|url| async move { self.view(&url).await }))
                .buffered(CONCURRENT_CALLS)
                .try_collect()
                .await?;
        let whole = next_token.is_none() && first_page;
        if whole {
            let targets: Vec<(String, String)> = views
                .iter()
                .filter_map(|v| Some((v.dead_letter_queue.clone()?, v.name.clone())))
                .collect();
            for view in &mut views {
                view.dead_letter_sources = targets
                    .iter()
                    .filter(|(dlq, _)| *dlq == view.name)
                    .map(|(_, source)| source.clone())
                    .collect();
            }
        } else {
            let urls: Vec<String> = views.iter().map(|v| v.url.clone()).collect();
            let sources: Vec<Vec<String>> =
                futures_util::stream::iter(urls.into_iter().map(|url| async move { self.sources(&url).await }))
                    .buffered(CONCURRENT_CALLS)
                    .try_collect()
                    .await?;
            for (view, sources) in views.iter_mut().zip(sources) {
                view.dead_letter_sources = sources;
            }
        }
        Ok(QueueList {
            items: views,
            next_token,
        })
    }
}

/// The queues of a queue service, with their counts, a page at a time.
#[utoipa::path(get, path = "/api/v1/queue-services/{name}/queues", tag = "queues",
    params(("name" = String, Path, description = "The queue service"), Page),
    responses((status = 200, body = QueueList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The queue service is not Ready")),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(page): ApiQuery<Page>,
) -> Result<Json<QueueList>, ApiError> {
    let limit = page.limit.unwrap_or(PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let service = Service::of(&state, &tenant, &name).await?;
    Ok(Json(service.queues(limit, page.next_token.as_deref()).await?))
}

/// Create a queue (a FIFO queue when its name ends in `.fifo`).
#[utoipa::path(post, path = "/api/v1/queue-services/{name}/queues", tag = "queues",
    params(("name" = String, Path, description = "The queue service")),
    request_body = QueueRequest,
    responses((status = 201, body = QueueView), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn create(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<QueueRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let queue = queue_name(&body.name)?;
    let service = Service::of(&state, &tenant, &name).await?;
    let mut input = json!({"QueueName": queue});
    if queue.ends_with(".fifo") {
        input["Attributes"] = json!({"FifoQueue": "true"});
    }
    let created = service.call("CreateQueue", input).await?;
    let url = created["QueueUrl"].as_str().unwrap_or_default();
    // A queue just made is no queue's dead-letter queue yet (a redrive
    // policy can only name a queue that exists).
    let view = service.view(url).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Delete a queue and its messages.
#[utoipa::path(delete, path = "/api/v1/queue-services/{name}/queues/{queue}", tag = "queues",
    params(("name" = String, Path, description = "The queue service"), ("queue" = String, Path)),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn delete(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath((name, queue)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (service, url) = Service::with_queue(&state, &tenant, &name, &queue).await?;
    service.call("DeleteQueue", json!({"QueueUrl": url})).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a test message.
#[utoipa::path(post, path = "/api/v1/queue-services/{name}/queues/{queue}/messages", tag = "queues",
    params(("name" = String, Path, description = "The queue service"), ("queue" = String, Path)),
    request_body = MessageRequest,
    responses((status = 201), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn send(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath((name, queue)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<MessageRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let (service, url) = Service::with_queue(&state, &tenant, &name, &queue).await?;
    let fifo = url.ends_with(".fifo");
    let mut input = json!({"QueueUrl": url, "MessageBody": body.body});
    if fifo {
        input["MessageGroupId"] = json!("console");
        // Each console send is a new message: the time is its identity.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        input["MessageDeduplicationId"] = json!(format!("console-{now}"));
    }
    let sent = service.call("SendMessage", input).await?;
    Ok((StatusCode::CREATED, Json(json!({"messageId": sent["MessageId"]}))))
}

/// Up to ten messages a receive would take now, left in the queue. sless's
/// engine shows them without receiving them; another engine is asked for a
/// receive with visibility 0, which counts (and says so).
#[utoipa::path(get, path = "/api/v1/queue-services/{name}/queues/{queue}/messages", tag = "queues",
    params(("name" = String, Path, description = "The queue service"), ("queue" = String, Path)),
    responses((status = 200, body = PeekList), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn peek(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath((name, queue)): ApiPath<(String, String)>,
) -> Result<Json<PeekList>, ApiError> {
    let (service, url) = Service::with_queue(&state, &tenant, &name, &queue).await?;
    let peek = json!({"QueueUrl": url, "MaxNumberOfMessages": PEEK});
    let (messages, receives_counted) = match service.call(PEEK_ACTION, peek).await {
        Ok(peeked) => (peeked["Messages"].clone(), false),
        // An engine without sless's peek refuses the action.
        Err(ApiError::Validation(_)) => {
            let received = service
                .call(
                    "ReceiveMessage",
                    json!({"QueueUrl": url, "MaxNumberOfMessages": PEEK, "VisibilityTimeout": 0,
                           "MessageSystemAttributeNames": ["ApproximateReceiveCount"]}),
                )
                .await?;
            (received["Messages"].clone(), true)
        }
        Err(e) => return Err(e),
    };
    let items = messages
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| PeekedMessage {
            message_id: m["MessageId"].as_str().unwrap_or_default().to_owned(),
            body: m["Body"].as_str().unwrap_or_default().to_owned(),
            receive_count: m["ApproximateReceiveCount"]
                .as_u64()
                .or_else(|| m["Attributes"]["ApproximateReceiveCount"].as_str()?.parse().ok())
                .unwrap_or(0),
        })
        .collect();
    Ok(Json(PeekList {
        items,
        receives_counted,
    }))
}

/// Move a dead-letter queue's messages back to the queues they came from
/// (SQS's StartMessageMoveTask; sless completes it at once).
#[utoipa::path(post, path = "/api/v1/queue-services/{name}/queues/{queue}/redrive", tag = "queues",
    params(("name" = String, Path, description = "The queue service"), ("queue" = String, Path, description = "The dead-letter queue")),
    responses((status = 200), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("bearer" = [])))]
pub async fn redrive(
    State(state): State<AppState>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    ApiPath((name, queue)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (service, url) = Service::with_queue(&state, &tenant, &name, &queue).await?;
    let attributes = service
        .call(
            "GetQueueAttributes",
            json!({"QueueUrl": url, "AttributeNames": ["QueueArn"]}),
        )
        .await?;
    let arn = attributes["Attributes"]["QueueArn"].as_str().unwrap_or_default();
    let task = service.call("StartMessageMoveTask", json!({"SourceArn": arn})).await?;
    Ok(Json(json!({"taskHandle": task["TaskHandle"]})))
}
