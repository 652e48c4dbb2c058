//! Typed requests: one struct per action, in the JSON protocol's shape (the
//! query protocol is reshaped into it first). Parsing checks types, presence
//! and the rules that need no queue; the rules that depend on a queue (its
//! size limit, FIFO or not) are the queue's, in [`super::queue`].

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use super::params::Int;
use super::params::{or_default, texts};
use crate::error::SqsError;

pub const MAX_BATCH: usize = 10;
pub const MAX_WAIT_SECONDS: u64 = 20;
pub const MAX_VISIBILITY_SECONDS: u64 = 43_200;
pub const MAX_DELAY_SECONDS: u64 = 900;
/// How much of a rejected value an error message repeats.
const MAX_ECHO: usize = 200;

pub enum Request {
    CreateQueue(CreateQueue),
    GetQueueUrl(GetQueueUrl),
    ListQueues(ListQueues),
    StartMessageMoveTask(StartMessageMoveTask),
    ListMessageMoveTasks(ListMessageMoveTasks),
    CancelMessageMoveTask(CancelMessageMoveTask),
    /// An action on the queue a `QueueUrl` names.
    OnQueue(String, QueueRequest),
}

pub enum QueueRequest {
    DeleteQueue,
    PurgeQueue,
    GetQueueAttributes(AttributeNames),
    SetQueueAttributes(SetAttributes),
    TagQueue(Tags),
    UntagQueue(TagKeys),
    ListQueueTags,
    ListDeadLetterSourceQueues,
    SendMessage(SendEntry),
    SendMessageBatch(Vec<SendEntry>),
    ReceiveMessage(ReceiveMessage),
    Peek(Peek),
    DeleteMessage(ReceiptEntry),
    DeleteMessageBatch(Vec<ReceiptEntry>),
    ChangeMessageVisibility(VisibilityEntry),
    ChangeMessageVisibilityBatch(Vec<VisibilityEntry>),
    AddPermission(AddPermission),
    RemovePermission(Label),
}

impl Request {
    pub fn parse(action: &str, input: &Value) -> Result<Self, SqsError> {
        // Only the listed actions are served, so an action added below and
        // not to the list (which the gateway's metrics name) fails its tests.
        if !crate::protocol::ACTIONS.contains(&action) {
            return Err(SqsError::invalid_action(format!(
                "The action {action} is not valid for this endpoint."
            )));
        }
        type Parse = fn(&Value) -> Result<QueueRequest, SqsError>;
        let request: Parse = match action {
            "CreateQueue" => return Ok(Self::CreateQueue(parse(input)?)),
            "GetQueueUrl" => return Ok(Self::GetQueueUrl(parse(input)?)),
            "ListQueues" => return Ok(Self::ListQueues(parse(input)?)),
            "StartMessageMoveTask" => return Ok(Self::StartMessageMoveTask(parse(input)?)),
            "ListMessageMoveTasks" => return Ok(Self::ListMessageMoveTasks(parse(input)?)),
            "CancelMessageMoveTask" => return Ok(Self::CancelMessageMoveTask(parse(input)?)),
            "AddPermission" => |i| Ok(QueueRequest::AddPermission(parse(i)?)),
            "RemovePermission" => |i| Ok(QueueRequest::RemovePermission(parse(i)?)),
            "DeleteQueue" => |_| Ok(QueueRequest::DeleteQueue),
            "PurgeQueue" => |_| Ok(QueueRequest::PurgeQueue),
            "ListQueueTags" => |_| Ok(QueueRequest::ListQueueTags),
            "ListDeadLetterSourceQueues" => |_| Ok(QueueRequest::ListDeadLetterSourceQueues),
            "GetQueueAttributes" => |i| Ok(QueueRequest::GetQueueAttributes(parse(i)?)),
            "SetQueueAttributes" => |i| Ok(QueueRequest::SetQueueAttributes(parse(i)?)),
            "TagQueue" => |i| Ok(QueueRequest::TagQueue(parse(i)?)),
            "UntagQueue" => |i| Ok(QueueRequest::UntagQueue(parse(i)?)),
            "SendMessage" => |i| Ok(QueueRequest::SendMessage(parse(i)?)),
            "SendMessageBatch" => |i| {
                Ok(QueueRequest::SendMessageBatch(batch(
                    i,
                    "SendMessageBatchRequestEntry",
                )?))
            },
            "ReceiveMessage" => |i| Ok(QueueRequest::ReceiveMessage(parse(i)?)),
            PEEK_ACTION => |i| Ok(QueueRequest::Peek(parse(i)?)),
            "DeleteMessage" => |i| Ok(QueueRequest::DeleteMessage(parse(i)?)),
            "DeleteMessageBatch" => |i| {
                Ok(QueueRequest::DeleteMessageBatch(batch(
                    i,
                    "DeleteMessageBatchRequestEntry",
                )?))
            },
            "ChangeMessageVisibility" => |i| Ok(QueueRequest::ChangeMessageVisibility(parse(i)?)),
            "ChangeMessageVisibilityBatch" => |i| {
                Ok(QueueRequest::ChangeMessageVisibilityBatch(batch(
                    i,
                    "ChangeMessageVisibilityBatchRequestEntry",
                )?))
            },
            other => {
                return Err(SqsError::invalid_action(format!(
                    "The action {other} is not valid for this endpoint."
                )));
            }
        };
        // The queue first, so a request without one says so before
        // anything else is wrong with it.
        let name = parse::<QueueTarget>(input)?.name()?;
        Ok(Self::OnQueue(name, request(input)?))
    }
}

fn parse<T: DeserializeOwned>(input: &Value) -> Result<T, SqsError> {
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let reason = e.inner().to_string();
        SqsError::invalid_parameter_value(format!("Invalid value for the parameter {path}: {}", echo(&reason)))
    })
}

/// A rejected value as an error message repeats it: at most [`MAX_ECHO`]
/// bytes of it, so a huge value is not sent back.
pub fn echo(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() <= MAX_ECHO {
        return value.into();
    }
    let cut = (0..=MAX_ECHO).rev().find(|i| value.is_char_boundary(*i)).unwrap_or(0);
    format!("{}…", &value[..cut]).into()
}

/// A parameter SQS requires: absent or empty is a `MissingParameter`.
pub fn required<'a>(value: &'a Option<String>, name: &str) -> Result<&'a str, SqsError> {
    value
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| SqsError::missing_parameter(format!("The request must contain the parameter {name}.")))
}

/// An integer parameter no greater than `max`.
pub fn bounded(value: Option<Int>, name: &str, max: u64) -> Result<Option<u64>, SqsError> {
    match value {
        Some(Int(v)) if v > max => Err(SqsError::invalid_parameter_value(format!(
            "Value {v} for parameter {name} is invalid. Reason: must be between 0 and {max}."
        ))),
        other => Ok(other.map(|Int(v)| v)),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct QueueTarget {
    queue_url: Option<String>,
}

impl QueueTarget {
    /// The queue a `QueueUrl` names: its last path segment.
    fn name(&self) -> Result<String, SqsError> {
        let url = required(&self.queue_url, "QueueUrl")?;
        Ok(url
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CreateQueue {
    pub queue_name: Option<String>,
    #[serde(default, deserialize_with = "texts")]
    pub attributes: BTreeMap<String, String>,
    /// Lower-case in the JSON protocol's CreateQueue.
    #[serde(default, rename = "tags", deserialize_with = "texts")]
    pub tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetQueueUrl {
    pub queue_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListQueues {
    #[serde(default, deserialize_with = "or_default")]
    pub queue_name_prefix: String,
    pub max_results: Option<Int>,
    #[serde(default, deserialize_with = "or_default")]
    pub next_token: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AttributeNames {
    #[serde(default, deserialize_with = "or_default")]
    pub attribute_names: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SetAttributes {
    #[serde(default, deserialize_with = "texts")]
    pub attributes: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Tags {
    #[serde(default, deserialize_with = "texts")]
    pub tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TagKeys {
    #[serde(default, deserialize_with = "or_default")]
    pub tag_keys: Vec<String>,
}

/// One message attribute as sent; [`super::message::parse_attributes`] checks it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct AttributeInput {
    pub data_type: Option<String>,
    pub string_value: Option<String>,
    /// Base64.
    pub binary_value: Option<String>,
}

/// A message to send: SendMessage's parameters, or one batch entry's.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct SendEntry {
    #[serde(default, deserialize_with = "or_default")]
    pub id: String,
    pub message_body: Option<String>,
    pub delay_seconds: Option<Int>,
    #[serde(default, deserialize_with = "or_default")]
    pub message_attributes: BTreeMap<String, AttributeInput>,
    /// `AWSTraceHeader` only.
    #[serde(default, deserialize_with = "or_default")]
    pub message_system_attributes: BTreeMap<String, AttributeInput>,
    pub message_group_id: Option<String>,
    pub message_deduplication_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceiveMessage {
    pub max_number_of_messages: Option<Int>,
    pub visibility_timeout: Option<Int>,
    pub wait_time_seconds: Option<Int>,
    #[serde(default, deserialize_with = "or_default")]
    pub attribute_names: Vec<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub message_system_attribute_names: Vec<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub message_attribute_names: Vec<String>,
    pub receive_request_attempt_id: Option<String>,
}

impl ReceiveMessage {
    /// The attempt id of a receive from a FIFO queue (standard queues
    /// ignore it, as SQS does): 1–128 printable ASCII characters.
    pub fn attempt_id(&self, fifo: bool) -> Result<Option<&str>, SqsError> {
        match self.receive_request_attempt_id.as_deref() {
            Some(id) if fifo => {
                if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(SqsError::invalid_parameter_value(format!(
                        "Value {} for parameter ReceiveRequestAttemptId is invalid. Reason: up to 128 printable \
                         ASCII characters.",
                        echo(id)
                    )));
                }
                Ok(Some(id))
            }
            _ => Ok(None),
        }
    }

    /// How many messages to take at most (1 unless asked).
    pub fn max(&self) -> Result<usize, SqsError> {
        max_messages(self.max_number_of_messages.as_ref())
    }
}

/// `MaxNumberOfMessages`: 1–10, default 1.
fn max_messages(n: Option<&Int>) -> Result<usize, SqsError> {
    match n {
        None => Ok(1),
        Some(Int(n @ 1..=10)) => Ok(*n as usize),
        Some(Int(n)) => Err(SqsError::invalid_parameter_value(format!(
            "Value {n} for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if \
             provided."
        ))),
    }
}

/// sless's own action, not SQS's: what a receive would take now, shown
/// without receiving it (no receive counted, no visibility changed), for
/// the console. Other SQS engines answer it as an unknown action.
pub const PEEK_ACTION: &str = "SlessPeekMessages";

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Peek {
    pub max_number_of_messages: Option<Int>,
}

impl Peek {
    /// 1–10, as a receive's.
    pub fn max(&self) -> Result<usize, SqsError> {
        max_messages(self.max_number_of_messages.as_ref())
    }
}

/// A message named by its receipt: DeleteMessage's, or one batch entry's.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ReceiptEntry {
    #[serde(default, deserialize_with = "or_default")]
    pub id: String,
    pub receipt_handle: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct VisibilityEntry {
    #[serde(default, deserialize_with = "or_default")]
    pub id: String,
    pub receipt_handle: Option<String>,
    pub visibility_timeout: Option<Int>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AddPermission {
    pub label: Option<String>,
    #[serde(default, rename = "AWSAccountIds", deserialize_with = "or_default")]
    pub aws_account_ids: Vec<String>,
    #[serde(default, deserialize_with = "or_default")]
    pub actions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Label {
    pub label: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StartMessageMoveTask {
    pub source_arn: Option<String>,
    pub destination_arn: Option<String>,
    pub max_number_of_messages_per_second: Option<Int>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListMessageMoveTasks {
    pub source_arn: Option<String>,
    pub max_results: Option<Int>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct CancelMessageMoveTask {
    pub task_handle: Option<String>,
}

/// A batch entry's id, by which results are reported.
pub trait Entry {
    fn id(&self) -> &str;
}

impl Entry for SendEntry {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Entry for ReceiptEntry {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Entry for VisibilityEntry {
    fn id(&self) -> &str {
        &self.id
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
#[serde(bound = "T: Deserialize<'de>")]
struct Batch<T> {
    #[serde(default, deserialize_with = "or_default")]
    entries: Vec<T>,
}

/// SQS's identifiers (batch entry ids, permission labels, queue names
/// without `.fifo`): 1–80 of `[A-Za-z0-9_-]`.
pub fn is_identifier(text: &str) -> bool {
    (1..=80).contains(&text.len())
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A batch's entries (`entry` names their kind in errors): 1–10, ids of
/// 1–80 `[A-Za-z0-9_-]`, distinct.
fn batch<T: DeserializeOwned + Entry>(input: &Value, entry: &str) -> Result<Vec<T>, SqsError> {
    let entries = parse::<Batch<T>>(input)?.entries;
    if entries.is_empty() {
        return Err(SqsError::empty_batch(format!(
            "There should be at least one {entry} in the request."
        )));
    }
    if entries.len() > MAX_BATCH {
        return Err(SqsError::too_many_entries(format!(
            "Maximum number of entries per request are {MAX_BATCH}. You have sent {}.",
            entries.len()
        )));
    }
    let mut seen = HashSet::new();
    for entry in &entries {
        let id = entry.id();
        if !is_identifier(id) {
            return Err(SqsError::invalid_batch_entry_id(
                "A batch entry id can only contain alphanumeric characters, hyphens and underscores. It can be at \
                 most 80 letters long.",
            ));
        }
        if !seen.insert(id) {
            return Err(SqsError::batch_ids_not_distinct(format!("Id {id} repeated.")));
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests;
