//! One queue's state machine, pure: every change takes the time as an
//! argument and does no I/O, so its rules (visibility, FIFO groups, the
//! deduplication window, dead-letter moves, delays, retention) are tested
//! here without a clock, and every replica that applies the same commands
//! ends in the same state ([`super::machine`] applies them). It is one file
//! because the rules read as a whole.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use super::ids::{receipt_for, receipt_seq};
use super::message::{attributes_md5, attributes_size, md5_hex, parse_attributes, trace_header_md5, validate_body};
use super::records::{StoredMessage, StoredQueue};
use super::requests::{MAX_DELAY_SECONDS, MAX_VISIBILITY_SECONDS, SendEntry, bounded, echo, required};
use crate::error::SqsError;

const DEDUP_WINDOW_MS: u64 = 5 * 60 * 1000;
/// How long a FIFO receive can be retried with its attempt id.
const ATTEMPT_WINDOW_MS: u64 = 5 * 60 * 1000;

#[derive(Debug, Clone)]
pub struct Message {
    pub stored: StoredMessage,
    pub md5_body: String,
    pub visible_at_ms: u64,
    pub receive_count: u32,
    pub first_receive_ms: Option<u64>,
    /// When the current in-flight period began (for the 12 h cap).
    received_ms: u64,
    receipt: Option<String>,
}

/// A message as a snapshot keeps it: its record and its receive state.
pub type MessageImage = (StoredMessage, u64, u32, Option<u64>, u64, Option<String>);

impl Message {
    pub fn new(stored: StoredMessage) -> Self {
        Self {
            md5_body: md5_hex(stored.body.as_bytes()),
            visible_at_ms: stored.visible_at_ms,
            receive_count: stored.receive_count,
            first_receive_ms: None,
            received_ms: 0,
            receipt: None,
            stored,
        }
    }

    fn in_flight(&self, now: u64) -> bool {
        self.receipt.is_some() && self.visible_at_ms > now
    }

    /// What a snapshot keeps of it ([`MessageImage`], borrowed).
    pub fn image(&self) -> impl serde::Serialize + '_ {
        (
            &self.stored,
            self.visible_at_ms,
            self.receive_count,
            self.first_receive_ms,
            self.received_ms,
            &self.receipt,
        )
    }

    pub fn from_image(
        (stored, visible_at_ms, receive_count, first_receive_ms, received_ms, receipt): MessageImage,
    ) -> Self {
        Self {
            visible_at_ms,
            receive_count,
            first_receive_ms,
            received_ms,
            receipt,
            ..Self::new(stored)
        }
    }
}

/// A message checked against its queue's rules, ready to be sent by a
/// command, and the digests its sender is answered with.
pub struct Prepared {
    pub message: StoredMessage,
    pub digests: Digests,
}

pub struct Digests {
    pub md5_of_body: String,
    pub md5_of_attributes: Option<String>,
    pub md5_of_system_attributes: Option<String>,
}

/// What sending a prepared message did.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub message_id: String,
    pub sequence_number: Option<String>,
    /// False for a duplicate within the deduplication window.
    pub enqueued: bool,
}

/// What one receive took.
#[derive(Default)]
pub struct Taken {
    /// Each taken message's sequence and the receipt it was given.
    pub received: Vec<(u64, String)>,
    /// Messages taken out for the dead-letter queue, by their sequence here.
    pub dead_letters: Vec<(u64, Message)>,
}

/// How many messages are in each state.
#[derive(Debug, PartialEq, Eq)]
pub struct Counts {
    pub visible: usize,
    pub in_flight: usize,
    pub delayed: usize,
}

/// A FIFO receive attempt: when it expires and what it took.
type Attempt = (u64, Vec<(u64, String)>);
/// A deduplication id's expiry, message id and sequence number.
type Dedup = (u64, String, Option<String>);

pub struct Queue {
    pub meta: StoredQueue,
    /// Counts changes of `meta`: a change decided on an older version is refused.
    pub meta_version: u64,
    /// When it was last purged (ms), for SQS's one purge a minute.
    pub purged_ms: Option<u64>,
    /// FIFO receive attempt id → what that receive took.
    attempts: BTreeMap<String, Attempt>,
    pub messages: BTreeMap<u64, Message>,
    /// Deduplication id → the message it sent.
    dedup: BTreeMap<String, Dedup>,
    /// Woken when messages may have become receivable (or the queue went).
    pub notify: Arc<Notify>,
}

/// A queue as a snapshot keeps it, without its messages.
pub type QueueImage = (
    StoredQueue,
    u64,
    Option<u64>,
    BTreeMap<String, Attempt>,
    BTreeMap<String, Dedup>,
);

/// The one message system attribute SQS takes: `AWSTraceHeader`, a string.
fn trace_header(entry: &SendEntry) -> Result<Option<String>, SqsError> {
    let mut header = None;
    for (name, attribute) in &entry.message_system_attributes {
        let value = attribute.string_value.as_deref().filter(|v| !v.is_empty());
        match (name.as_str(), attribute.data_type.as_deref(), value) {
            ("AWSTraceHeader", Some("String"), Some(v)) if v.len() <= 16 * 1024 => header = Some(v.to_owned()),
            ("AWSTraceHeader", ..) => {
                return Err(SqsError::invalid_parameter_value(
                    "The message system attribute AWSTraceHeader must be a non-empty String of at most 16 KiB.",
                ));
            }
            (other, ..) => {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Message system attribute name '{other}' is invalid."
                )));
            }
        }
    }
    Ok(header)
}

impl Queue {
    pub fn new(meta: StoredQueue) -> Self {
        Self {
            meta,
            meta_version: 0,
            purged_ms: None,
            attempts: BTreeMap::new(),
            messages: BTreeMap::new(),
            dedup: BTreeMap::new(),
            notify: Arc::new(Notify::new()),
        }
    }

    /// What a snapshot keeps of it besides its messages ([`QueueImage`], borrowed).
    pub fn image(&self) -> impl serde::Serialize + '_ {
        (
            &self.meta,
            self.meta_version,
            self.purged_ms,
            &self.attempts,
            &self.dedup,
        )
    }

    pub fn from_image((meta, meta_version, purged_ms, attempts, dedup): QueueImage) -> Self {
        Self {
            meta_version,
            purged_ms,
            attempts,
            dedup,
            ..Self::new(meta)
        }
    }

    /// Drops messages past their retention period and deduplication ids
    /// past their window; returns the dropped messages' sequences.
    pub fn expire(&mut self, now: u64) -> Vec<u64> {
        let retention_ms = u64::from(self.meta.attributes.number("MessageRetentionPeriod")) * 1000;
        let expired: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, m)| m.stored.sent_ms + retention_ms <= now)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in &expired {
            self.messages.remove(seq);
        }
        self.dedup.retain(|_, (expires, ..)| *expires > now);
        expired
    }

    pub fn counts(&self, now: u64) -> Counts {
        let mut counts = Counts {
            visible: 0,
            in_flight: 0,
            delayed: 0,
        };
        for m in self.messages.values() {
            if m.visible_at_ms <= now {
                counts.visible += 1;
            } else if m.receipt.is_some() {
                counts.in_flight += 1;
            } else {
                counts.delayed += 1;
            }
        }
        counts
    }

    /// How old the oldest message still in the queue is, in seconds (0
    /// when it is empty). Linear, as [`Self::counts`]: both are asked for
    /// by a person, not per message.
    pub fn oldest_age_s(&self, now: u64) -> u64 {
        self.messages
            .values()
            .map(|m| m.stored.sent_ms)
            .min()
            .map_or(0, |sent| now.saturating_sub(sent) / 1000)
    }

    /// Checks one message against this queue's rules and makes it message
    /// `id`, sent at `now`; [`Self::accept`] then sends it (or not, when
    /// it is a duplicate by then).
    pub fn prepare(&self, entry: &SendEntry, id: String, now: u64) -> Result<Prepared, SqsError> {
        let body = required(&entry.message_body, "MessageBody")?;
        validate_body(body)?;
        let attributes = parse_attributes(&entry.message_attributes)?;
        let max = self.meta.attributes.number("MaximumMessageSize") as usize;
        if body.len() + attributes_size(&attributes) > max {
            return Err(SqsError::invalid_parameter_value(format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {max} bytes."
            )));
        }
        let delay = bounded(entry.delay_seconds, "DelaySeconds", MAX_DELAY_SECONDS)?;
        let group_id = entry.message_group_id.clone();
        let mut dedup_id = entry.message_deduplication_id.clone();
        for (value, field) in [(&group_id, "MessageGroupId"), (&dedup_id, "MessageDeduplicationId")] {
            if let Some(v) = value
                && (v.is_empty() || v.len() > 128 || !v.chars().all(|c| c.is_ascii_graphic()))
            {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {} for parameter {field} is invalid. Reason: up to 128 printable ASCII characters.",
                    echo(v)
                )));
            }
        }
        if self.meta.fifo {
            if group_id.is_none() {
                return Err(SqsError::missing_parameter(
                    "The request must contain the parameter MessageGroupId.",
                ));
            }
            if let Some(d) = delay.filter(|d| *d > 0) {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {d} for parameter DelaySeconds is invalid. Reason: The request include parameter that is \
                     not valid for this queue type."
                )));
            }
            if dedup_id.is_none() {
                if !self.meta.attributes.flag("ContentBasedDeduplication") {
                    return Err(SqsError::invalid_parameter_value(
                        "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId \
                         provided explicitly",
                    ));
                }
                dedup_id = Some(sless_runtime::hex::encode(&Sha256::digest(body.as_bytes())));
            }
        } else if dedup_id.is_some() {
            return Err(SqsError::invalid_parameter_value(
                "The request include parameter MessageDeduplicationId that is not valid for this queue type",
            ));
        }
        let trace_header = trace_header(entry)?;
        let md5_of_body = md5_hex(body.as_bytes());
        let md5_of_attributes = attributes_md5(&attributes);
        let md5_of_system_attributes = trace_header.as_deref().map(trace_header_md5);
        let delay_ms = delay.unwrap_or_else(|| u64::from(self.meta.attributes.number("DelaySeconds"))) * 1000;
        let message = StoredMessage {
            id,
            body: body.to_owned(),
            attributes,
            sent_ms: now,
            visible_at_ms: now + delay_ms,
            group_id,
            dedup_id,
            sequence_number: None,
            receive_count: 0,
            trace_header,
            dead_letter_source_arn: None,
        };
        Ok(Prepared {
            message,
            digests: Digests {
                md5_of_body,
                md5_of_attributes,
                md5_of_system_attributes,
            },
        })
    }

    /// Sends a prepared message as sequence `seq`, unless its deduplication
    /// id sent one within the 5-minute window: a duplicate is acknowledged
    /// as that one, not enqueued.
    pub fn accept(&mut self, mut message: StoredMessage, seq: u64, now: u64) -> Accepted {
        if let Some(d) = &message.dedup_id
            && let Some((expires, id, sequence_number)) = self.dedup.get(d)
            && *expires > now
        {
            return Accepted {
                message_id: id.clone(),
                sequence_number: sequence_number.clone(),
                enqueued: false,
            };
        }
        message.sequence_number = self.meta.fifo.then(|| format!("{seq:020}"));
        if let Some(d) = &message.dedup_id {
            self.dedup.insert(
                d.clone(),
                (
                    now + DEDUP_WINDOW_MS,
                    message.id.clone(),
                    message.sequence_number.clone(),
                ),
            );
        }
        let accepted = Accepted {
            message_id: message.id.clone(),
            sequence_number: message.sequence_number.clone(),
            enqueued: true,
        };
        self.insert(seq, Message::new(message));
        accepted
    }

    /// Puts a message in as sequence `seq` and wakes the receives waiting.
    pub fn insert(&mut self, seq: u64, message: Message) {
        self.messages.insert(seq, message);
        self.notify.notify_waiters();
    }

    /// Drops every message, in flight or not.
    pub fn purge(&mut self) {
        self.messages.clear();
    }

    /// Takes up to `max` receivable messages for `visibility_ms`. In a FIFO
    /// queue a group with a message in flight or delayed yields nothing
    /// behind it. With `max_receive_count`, a message received that often
    /// already is taken out for the dead-letter queue instead.
    /// Receipts name the message's sequence and `nonce`, which each receive
    /// draws anew.
    pub fn receive(
        &mut self,
        max: usize,
        visibility_ms: u64,
        max_receive_count: Option<u32>,
        now: u64,
        nonce: &str,
    ) -> Taken {
        let fifo = self.meta.fifo;
        let mut taken = Taken::default();
        let mut to_dead_letter = Vec::new();
        let mut blocked_groups: HashSet<String> = HashSet::new();
        for (seq, m) in self.messages.iter_mut() {
            if taken.received.len() >= max {
                break;
            }
            if m.visible_at_ms > now {
                if fifo && let Some(g) = &m.stored.group_id {
                    blocked_groups.insert(g.clone());
                }
                continue;
            }
            if fifo
                && let Some(g) = &m.stored.group_id
                && blocked_groups.contains(g)
            {
                continue;
            }
            if max_receive_count.is_some_and(|limit| m.receive_count >= limit) {
                to_dead_letter.push(*seq);
                continue;
            }
            m.receive_count += 1;
            m.first_receive_ms.get_or_insert(now);
            m.received_ms = now;
            m.visible_at_ms = now + visibility_ms;
            let receipt = receipt_for(*seq, nonce);
            m.receipt = Some(receipt.clone());
            taken.received.push((*seq, receipt));
        }
        taken.dead_letters = to_dead_letter
            .iter()
            .filter_map(|seq| self.messages.remove(seq).map(|m| (*seq, m)))
            .collect();
        taken
    }

    /// The sequences of up to `max` messages a receive would take now, in
    /// the order it would take them; nothing changes.
    pub fn peek(&self, max: usize, now: u64) -> Vec<u64> {
        let mut blocked_groups: HashSet<&str> = HashSet::new();
        let mut seen = Vec::new();
        for (seq, m) in &self.messages {
            if seen.len() >= max {
                break;
            }
            let group = m.stored.group_id.as_deref().filter(|_| self.meta.fifo);
            if m.visible_at_ms > now {
                blocked_groups.extend(group);
                continue;
            }
            if group.is_some_and(|g| blocked_groups.contains(g)) {
                continue;
            }
            seen.push(*seq);
        }
        seen
    }

    /// Takes out every message not in flight, for a move task.
    pub fn take_movable(&mut self, now: u64) -> Vec<(u64, Message)> {
        let seqs: Vec<u64> = self
            .messages
            .iter()
            .filter(|(_, m)| !m.in_flight(now))
            .map(|(seq, _)| *seq)
            .collect();
        seqs.into_iter()
            .filter_map(|seq| self.messages.remove(&seq).map(|m| (seq, m)))
            .collect()
    }

    /// What a receive with attempt `id` took, if it was within 5 minutes
    /// and none of those messages changed since (deleted, made visible,
    /// received again): the same messages, the same receipts.
    pub fn replay_attempt(&mut self, id: &str, now: u64) -> Option<Vec<(u64, String)>> {
        self.attempts.retain(|_, (expires, _)| *expires > now);
        let (_, held) = self.attempts.get(id)?;
        let unchanged = held.iter().all(|(seq, receipt)| {
            self.messages
                .get(seq)
                .is_some_and(|m| m.receipt.as_deref() == Some(receipt.as_str()) && m.in_flight(now))
        });
        unchanged.then(|| held.clone())
    }

    /// Remembers what a receive with attempt `id` took, for 5 minutes.
    pub fn record_attempt(&mut self, id: &str, taken: &Taken, now: u64) {
        // A retry of a receive that took nothing takes what is there then.
        if taken.received.is_empty() {
            return;
        }
        self.attempts
            .insert(id.to_owned(), (now + ATTEMPT_WINDOW_MS, taken.received.clone()));
    }

    /// The sequence of the message a receipt handle names, if it is still
    /// there under that receipt. Deleting a message that is gone, or with a
    /// superseded receipt, succeeds without effect, as in SQS.
    pub fn held_by_receipt(&self, handle: &str) -> Result<Option<u64>, SqsError> {
        let seq = receipt_seq(handle)?;
        Ok(self
            .messages
            .get(&seq)
            .filter(|m| m.receipt.as_deref() == Some(handle))
            .map(|_| seq))
    }

    /// Makes an in-flight message receivable again `timeout_s` from now,
    /// within 12 hours of when it was received.
    pub fn change_visibility(&mut self, handle: &str, timeout_s: u64, now: u64) -> Result<(), SqsError> {
        let seq = receipt_seq(handle)?;
        if timeout_s > MAX_VISIBILITY_SECONDS {
            return Err(SqsError::invalid_parameter_value(format!(
                "Value {timeout_s} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200."
            )));
        }
        let m = self
            .messages
            .get_mut(&seq)
            .filter(|m| m.receipt.as_deref() == Some(handle) && m.in_flight(now))
            .ok_or_else(|| {
                SqsError::message_not_inflight(
                    "Message does not exist or is not available for visibility timeout change.",
                )
            })?;
        let until = now + timeout_s * 1000;
        if until - m.received_ms > MAX_VISIBILITY_SECONDS * 1000 {
            return Err(SqsError::invalid_parameter_value(
                "Value for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message is \
                 beyond the limit [43200 seconds]",
            ));
        }
        m.visible_at_ms = until;
        if timeout_s == 0 {
            self.notify.notify_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
