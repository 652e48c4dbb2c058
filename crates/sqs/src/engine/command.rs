//! Every change to an engine's queues is one [`Command`]. The engine that
//! takes a request makes it, with everything that must not differ between
//! the copies that apply it (the time, message ids, receipt nonces, task
//! handles); the journal keeps it; then [`super::machine::Machine::apply`]
//! applies it, on every copy of the state alike, and its [`Reply`] answers
//! the request. Checks that need no state run before a command is made, so
//! the journal holds no command that a request's own fault refused.

use serde::{Deserialize, Serialize};

use super::queue::{Accepted, Message};
use super::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Command {
    /// When it was made (ms since the epoch, by the maker's clock). The
    /// state's clock never goes back: it takes the latest time applied.
    pub now_ms: u64,
    pub op: Op,
}

impl Command {
    /// About how many bytes a command, or a log entry without commands,
    /// takes in the log besides message bodies.
    pub const BASE_WEIGHT: usize = 256;

    /// About how many bytes it takes in the log.
    pub fn weight(&self) -> usize {
        match &self.op {
            Op::Send { messages, .. } => messages.iter().map(|m| Self::BASE_WEIGHT + m.body.len()).sum(),
            _ => Self::BASE_WEIGHT,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Creates `queue` (its times are set when applied). `given` names the
    /// attributes the request gave: creating an existing queue succeeds
    /// when each has the value the queue has.
    CreateQueue {
        queue: StoredQueue,
        given: Vec<String>,
    },
    /// Replaces queue `name`'s metadata, if it is still at `version`.
    UpdateQueue {
        name: String,
        version: u64,
        meta: StoredQueue,
    },
    DeleteQueue {
        name: String,
    },
    PurgeQueue {
        name: String,
    },
    /// Sends prepared messages (see [`super::queue::Queue::prepare`]).
    Send {
        queue: String,
        messages: Vec<StoredMessage>,
    },
    /// Takes up to `max` messages for `visibility_ms`; receipts carry `nonce`.
    Receive {
        queue: String,
        max: usize,
        visibility_ms: u64,
        attempt: Option<String>,
        nonce: String,
    },
    /// Deletes the messages these receipt handles hold.
    Delete {
        queue: String,
        receipts: Vec<String>,
    },
    /// Sets the visibility timeout (seconds) of messages by receipt handle.
    ChangeVisibility {
        queue: String,
        changes: Vec<(String, u64)>,
    },
    /// A message move task out of dead-letter queue `source_arn`.
    MoveMessages {
        source_arn: String,
        destination_arn: Option<String>,
        rate: Option<u64>,
        handle: String,
    },
}

/// What applying a command did, for the request that made it.
#[derive(Debug)]
pub enum Reply {
    Done,
    /// An [`Op::UpdateQueue`] decided on an older version: nothing changed.
    Stale,
    Sent(Vec<Accepted>),
    /// Each message taken, as it is now, with its receipt handle.
    Received(Vec<(Message, String)>),
    /// Each receipt's or visibility change's outcome, in order.
    Each(Vec<Result<(), SqsError>>),
}
