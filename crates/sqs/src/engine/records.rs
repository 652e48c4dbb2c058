//! The durable records of queues and messages: what the journal keeps.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::attributes::QueueAttributes;
use super::message::MessageAttributes;

/// The durable part of a queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredQueue {
    pub name: String,
    pub fifo: bool,
    pub attributes: QueueAttributes,
    pub tags: BTreeMap<String, String>,
    pub created_s: u64,
    pub modified_s: u64,
}

/// The durable part of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub id: String,
    pub body: String,
    pub attributes: MessageAttributes,
    pub sent_ms: u64,
    pub visible_at_ms: u64,
    pub group_id: Option<String>,
    pub dedup_id: Option<String>,
    pub sequence_number: Option<String>,
    /// Receives before a move to a dead-letter queue, carried over.
    pub receive_count: u32,
    /// The `AWSTraceHeader` system attribute, as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_header: Option<String>,
    /// Once moved to a dead-letter queue: the queue it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_source_arn: Option<String>,
}
