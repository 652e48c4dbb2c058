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

#[cfg(test)]
impl StoredQueue {
    /// A standard queue with no attributes or tags.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.into(),
            fifo: false,
            attributes: QueueAttributes::default(),
            tags: BTreeMap::new(),
            created_s: 1,
            modified_s: 1,
        }
    }
}

#[cfg(test)]
impl StoredMessage {
    /// A visible message of a standard queue, sent at `sent_ms`.
    pub fn with_body(id: &str, body: &str, sent_ms: u64) -> Self {
        Self {
            id: id.into(),
            body: body.into(),
            attributes: MessageAttributes::new(),
            sent_ms,
            visible_at_ms: 1,
            group_id: None,
            dedup_id: None,
            sequence_number: None,
            receive_count: 0,
            trace_header: None,
            dead_letter_source_arn: None,
        }
    }
}
