//! Typed results in the JSON protocol's shape (the query protocol writes
//! them as XML). Empty members are left out, as SQS does.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::message::{attributes_json, attributes_md5};
use super::queue::{Accepted, Digests, Message};
use crate::error::SqsError;

/// A result with no members: `{}`.
#[derive(Serialize)]
pub struct Empty {}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueueUrl {
    pub queue_url: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct QueueUrls {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queue_urls: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_token: Option<String>,
}

#[derive(Serialize)]
pub struct DeadLetterSources {
    /// Lower-case in SQS's JSON protocol.
    #[serde(rename = "queueUrls")]
    pub queue_urls: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Attributes {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Tags {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

#[derive(Serialize)]
pub struct SendResult {
    /// The batch entry's id (absent for SendMessage).
    #[serde(rename = "Id", skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "MessageId")]
    pub message_id: String,
    #[serde(rename = "MD5OfMessageBody")]
    pub md5_of_message_body: String,
    #[serde(rename = "MD5OfMessageAttributes", skip_serializing_if = "Option::is_none")]
    pub md5_of_message_attributes: Option<String>,
    /// Of the `AWSTraceHeader` sent (the Java SDK checks it).
    #[serde(rename = "MD5OfMessageSystemAttributes", skip_serializing_if = "Option::is_none")]
    pub md5_of_message_system_attributes: Option<String>,
    #[serde(rename = "SequenceNumber", skip_serializing_if = "Option::is_none")]
    pub sequence_number: Option<String>,
}

impl SendResult {
    pub fn new(digests: Digests, accepted: Accepted) -> Self {
        Self {
            id: None,
            message_id: accepted.message_id,
            md5_of_message_body: digests.md5_of_body,
            md5_of_message_attributes: digests.md5_of_attributes,
            md5_of_message_system_attributes: digests.md5_of_system_attributes,
            sequence_number: accepted.sequence_number,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct EntryId {
    pub id: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchFailure {
    pub id: String,
    pub sender_fault: bool,
    pub code: &'static str,
    pub message: String,
}

impl BatchFailure {
    fn new(id: &str, e: &SqsError) -> Self {
        Self {
            id: id.to_owned(),
            sender_fault: e.sender_fault,
            code: e.code,
            message: e.message.clone(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Batch<T> {
    pub successful: Vec<T>,
    pub failed: Vec<BatchFailure>,
}

/// Each batch entry's id and what became of it.
pub type Outcomes<R> = Vec<(String, Result<R, SqsError>)>;

impl<T> Batch<T> {
    pub fn of<R>(outcomes: Outcomes<R>, success: impl Fn(String, R) -> T) -> Self {
        let mut batch = Self {
            successful: Vec::new(),
            failed: Vec::new(),
        };
        for (id, outcome) in outcomes {
            match outcome {
                Ok(r) => batch.successful.push(success(id, r)),
                Err(e) => batch.failed.push(BatchFailure::new(&id, &e)),
            }
        }
        batch
    }
}

/// The outcome of a batch of one, for the single-message actions.
pub fn single<R>(mut outcomes: Outcomes<R>) -> Result<R, SqsError> {
    match outcomes.pop() {
        Some((_, outcome)) => outcome,
        None => Err(SqsError::internal("a request of one entry decided nothing")),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Messages {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<ReceivedMessage>,
}

/// What [`crate::engine::requests::PEEK_ACTION`] shows.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct Peeked {
    pub messages: Vec<PeekedMessage>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct PeekedMessage {
    pub message_id: String,
    pub body: String,
    /// Receives so far; a peek adds none.
    pub approximate_receive_count: u32,
}

#[derive(Serialize)]
pub struct ReceivedMessage {
    #[serde(rename = "MessageId")]
    message_id: String,
    #[serde(rename = "ReceiptHandle")]
    receipt_handle: String,
    #[serde(rename = "MD5OfBody")]
    md5_of_body: String,
    #[serde(rename = "Body")]
    body: String,
    #[serde(rename = "Attributes", skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<&'static str, String>,
    #[serde(rename = "MessageAttributes", skip_serializing_if = "BTreeMap::is_empty")]
    message_attributes: BTreeMap<String, Value>,
    /// Of the message attributes returned, as the SDKs check it.
    #[serde(rename = "MD5OfMessageAttributes", skip_serializing_if = "Option::is_none")]
    md5_of_message_attributes: Option<String>,
}

/// Which attributes a receive asked for.
pub struct Selection<'a> {
    pub system: &'a [String],
    pub message: &'a [String],
}

impl Selection<'_> {
    fn system(&self, name: &str) -> bool {
        self.system.iter().any(|w| w == "All" || w == name)
    }

    fn message(&self, name: &str) -> bool {
        self.message
            .iter()
            .any(|w| w == "All" || w == ".*" || w == name || w.strip_suffix(".*").is_some_and(|p| name.starts_with(p)))
    }
}

impl ReceivedMessage {
    pub fn new(m: &Message, receipt: String, sender: &str, selection: &Selection) -> Self {
        let stored = &m.stored;
        let mut system = BTreeMap::new();
        let mut put = |name: &'static str, value: Option<String>| {
            if let Some(value) = value
                && selection.system(name)
            {
                system.insert(name, value);
            }
        };
        put("SenderId", Some(sender.to_owned()));
        put("SentTimestamp", Some(stored.sent_ms.to_string()));
        put("ApproximateReceiveCount", Some(m.receive_count.to_string()));
        put(
            "ApproximateFirstReceiveTimestamp",
            m.first_receive_ms.map(|ms| ms.to_string()),
        );
        put("MessageGroupId", stored.group_id.clone());
        put("MessageDeduplicationId", stored.dedup_id.clone());
        put("SequenceNumber", stored.sequence_number.clone());
        put("AWSTraceHeader", stored.trace_header.clone());
        put("DeadLetterQueueSourceArn", stored.dead_letter_source_arn.clone());
        let selected: super::message::MessageAttributes = stored
            .attributes
            .iter()
            .filter(|(name, _)| selection.message(name))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Self {
            message_id: stored.id.clone(),
            receipt_handle: receipt,
            md5_of_body: m.md5_body.clone(),
            body: stored.body.clone(),
            attributes: system,
            message_attributes: attributes_json(&selected),
            md5_of_message_attributes: attributes_md5(&selected),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct TaskHandle {
    pub task_handle: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct MoveTasks {
    pub results: Vec<MoveTaskResult>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct MoveTaskResult {
    pub status: &'static str,
    pub source_arn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination_arn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_number_of_messages_per_second: Option<u64>,
    pub approximate_number_of_messages_moved: u64,
    pub approximate_number_of_messages_to_move: u64,
    pub started_timestamp: u64,
}
