//! An SQS-compatible queue engine: one tenant's queues, in memory, made
//! durable by an optional journal (see [`journal`]). Actions take and return
//! the JSON protocol's shapes; [`super::protocol`] adapts the query protocol.
//!
//! Durability before visibility: an action submits its changes to the
//! journal while it holds the state lock (so the journal commits in the
//! order the engine decided), and a change that adds (a message, a queue, an
//! attribute, a deletion) reaches memory only once committed. Changes that
//! hide (a receive taking messages, a queue being deleted) apply at once and
//! are undone when the commit fails, so a failed write leaves the engine as
//! it was. Queue-level actions are serialised by `meta`.
//!
//! This file is too long (issue 12): actions are still parsed from JSON
//! values beside the state changes they make. They are to become typed
//! requests and a pure queue state machine with the journal around it.

pub mod attributes;
pub mod error;
pub mod journal;
pub mod message;
pub mod server;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use attributes::{MAX_MESSAGE_SIZE, QueueAttributes, string_map, validate_queue_name};
use error::SqsError;
use journal::{Change, Journal, Pending};
use message::{MessageAttributes, attributes_json, attributes_md5, attributes_size, md5_hex, validate_body};

pub const MAX_BATCH: usize = 10;
const MAX_WAIT_SECONDS: u64 = 20;
const MAX_VISIBILITY_SECONDS: u64 = 43_200;
const DEDUP_WINDOW_MS: u64 = 5 * 60 * 1000;
/// How often a long poll re-checks for messages whose delay or visibility
/// timeout ended (sends wake it at once).
const POLL_TICK: Duration = Duration::from_millis(100);

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Account id in queue URLs and ARNs (the tenant, as seed 000 has it).
    pub account_id: String,
    pub region: String,
    /// Public base of queue URLs, e.g. `http://127.0.0.1:9324/sqs/acme`.
    pub base_url: String,
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
}

struct Message {
    stored: StoredMessage,
    md5_body: String,
    md5_attributes: Option<String>,
    visible_at_ms: u64,
    receive_count: u32,
    first_receive_ms: Option<u64>,
    /// When the current in-flight period began (for the 12 h cap).
    received_ms: u64,
    receipt: Option<String>,
}

impl Message {
    fn new(stored: StoredMessage) -> Self {
        Self {
            md5_body: md5_hex(stored.body.as_bytes()),
            md5_attributes: attributes_md5(&stored.attributes),
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

    fn delivery(&self) -> Delivery {
        Delivery {
            visible_at_ms: self.visible_at_ms,
            receive_count: self.receive_count,
            first_receive_ms: self.first_receive_ms,
            received_ms: self.received_ms,
            receipt: self.receipt.clone(),
        }
    }

    fn restore(&mut self, d: Delivery) {
        self.visible_at_ms = d.visible_at_ms;
        self.receive_count = d.receive_count;
        self.first_receive_ms = d.first_receive_ms;
        self.received_ms = d.received_ms;
        self.receipt = d.receipt;
    }
}

/// A message's receive state, kept to undo a receive whose commit failed.
struct Delivery {
    visible_at_ms: u64,
    receive_count: u32,
    first_receive_ms: Option<u64>,
    received_ms: u64,
    receipt: Option<String>,
}

/// What one receive attempt took and journaled.
struct Received {
    messages: Vec<Value>,
    incarnation: u64,
    /// Each taken message's sequence, the receipt it was given, and its state before.
    taken: Vec<(u64, String, Delivery)>,
    /// Messages taken out for the dead-letter queue, by their old sequence.
    moved: Vec<(u64, Message)>,
    /// The dead-letter queue (name, incarnation) and what it receives.
    dead_letters: Option<((String, u64), Vec<Put>)>,
    pending: Option<Pending>,
}

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

struct Queue {
    meta: StoredQueue,
    /// Unique per creation: a change decided for one queue is never applied
    /// to a later queue of the same name.
    incarnation: u64,
    /// Messages below this sequence were purged (their late commits are dropped).
    purge_floor: u64,
    /// Its deletion is being committed: absent to every action.
    deleting: bool,
    messages: BTreeMap<u64, Message>,
    /// Deduplication id → (expiry, message id, sequence number).
    dedup: HashMap<String, (u64, String, Option<String>)>,
    notify: Arc<Notify>,
}

impl Queue {
    fn new(meta: StoredQueue, incarnation: u64) -> Self {
        Self {
            meta,
            incarnation,
            purge_floor: 0,
            deleting: false,
            messages: BTreeMap::new(),
            dedup: HashMap::new(),
            notify: Arc::new(Notify::new()),
        }
    }

    /// Drops messages past their retention period.
    fn expire(&mut self, now: u64) -> Vec<u64> {
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
}

struct State {
    queues: BTreeMap<String, Queue>,
    next_seq: u64,
}

fn no_such_queue() -> SqsError {
    SqsError::queue_does_not_exist("The specified queue does not exist.")
}

impl State {
    fn queue(&self, name: &str) -> Option<&Queue> {
        self.queues.get(name).filter(|q| !q.deleting)
    }

    fn queue_mut(&mut self, name: &str) -> Option<&mut Queue> {
        self.queues.get_mut(name).filter(|q| !q.deleting)
    }

    /// The queue `name` if it is still the creation `incarnation`.
    fn incarnation_mut(&mut self, name: &str, incarnation: u64) -> Option<&mut Queue> {
        self.queue_mut(name).filter(|q| q.incarnation == incarnation)
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }
}

/// A message decided under the lock, made visible once committed.
struct Put {
    seq: u64,
    message: StoredMessage,
}

pub struct Engine {
    config: EngineConfig,
    state: Mutex<State>,
    journal: Option<Journal>,
    /// Serialises queue-level actions (create, delete, purge, attributes, tags).
    meta: tokio::sync::Mutex<()>,
}

fn str_param<'a>(input: &'a Value, name: &str) -> Option<&'a str> {
    input.get(name).and_then(Value::as_str)
}

fn required<'a>(input: &'a Value, name: &str) -> Result<&'a str, SqsError> {
    str_param(input, name)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| SqsError::missing_parameter(format!("The request must contain the parameter {name}.")))
}

fn int_param(input: &Value, name: &str) -> Result<Option<u64>, SqsError> {
    match input.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| SqsError::invalid_parameter_value(format!("Invalid value for {name}"))),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| SqsError::invalid_parameter_value(format!("Invalid value for {name}"))),
        Some(_) => Err(SqsError::invalid_parameter_value(format!("Invalid value for {name}"))),
    }
}

fn bounded(input: &Value, name: &str, max: u64) -> Result<Option<u64>, SqsError> {
    match int_param(input, name)? {
        Some(v) if v > max => Err(SqsError::invalid_parameter_value(format!(
            "Value {v} for parameter {name} is invalid. Reason: must be between 0 and {max}."
        ))),
        other => Ok(other),
    }
}

fn list_param<'a>(input: &'a Value, name: &str) -> Vec<&'a str> {
    input
        .get(name)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn random_uuid() -> String {
    let b = sless_runtime::random::bytes::<16>();
    let h = sless_runtime::hex::encode(&b);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn receipt_for(seq: u64) -> String {
    let nonce = sless_runtime::hex::encode(&sless_runtime::random::bytes::<12>());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{seq}:{nonce}"))
}

fn receipt_seq(handle: &str) -> Result<u64, SqsError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(handle)
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|text| text.split_once(':').and_then(|(seq, _)| seq.parse().ok()))
        .ok_or_else(|| {
            SqsError::receipt_handle_is_invalid(format!(
                "The input receipt handle \"{handle}\" is not a valid receipt handle."
            ))
        })
}

/// Batch entry ids: 1–80 of `[A-Za-z0-9_-]`, distinct, 1–10 entries.
fn batch_entries<'a>(input: &'a Value, name: &str) -> Result<Vec<&'a Value>, SqsError> {
    let entries: Vec<&Value> = input
        .get(name)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if entries.is_empty() {
        return Err(SqsError::empty_batch(
            "There should be at least one entry in the request.",
        ));
    }
    if entries.len() > MAX_BATCH {
        return Err(SqsError::too_many_entries(format!(
            "Maximum number of entries per request are {MAX_BATCH}. You have sent {}.",
            entries.len()
        )));
    }
    let mut seen = HashSet::new();
    for entry in &entries {
        let id = str_param(entry, "Id").unwrap_or_default();
        if id.is_empty() || id.len() > 80 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
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

fn batch_failure(id: &str, e: &SqsError) -> Value {
    json!({"Id": id, "SenderFault": e.sender_fault, "Code": e.code, "Message": e.message})
}

impl Engine {
    /// An engine with its journal (if `journal` is given) replayed.
    pub fn open(config: EngineConfig, journal: Option<&std::path::Path>) -> Result<Arc<Self>, SqsError> {
        let mut state = State {
            queues: BTreeMap::new(),
            next_seq: 1,
        };
        let journal = match journal {
            None => None,
            Some(path) => {
                let (journal, queues, messages) = Journal::open(path)?;
                for q in queues {
                    let incarnation = state.take_seq();
                    state.queues.insert(q.name.clone(), Queue::new(q, incarnation));
                }
                for (queue, seq, stored) in messages {
                    if let Some(q) = state.queues.get_mut(&queue) {
                        state.next_seq = state.next_seq.max(seq + 1);
                        q.messages.insert(seq, Message::new(stored));
                    }
                }
                Some(journal)
            }
        };
        Ok(Arc::new(Self {
            config,
            state: Mutex::new(state),
            journal,
            meta: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Submits `changes` to the journal; call it under the state lock.
    fn submit(&self, changes: Vec<Change>) -> Option<Pending> {
        match &self.journal {
            Some(journal) if !changes.is_empty() => Some(journal.submit(changes)),
            _ => None,
        }
    }

    async fn committed(pending: Option<Pending>) -> Result<(), SqsError> {
        match pending {
            Some(p) => p.committed().await,
            None => Ok(()),
        }
    }

    /// Makes committed messages visible in queue `name` (unless it was
    /// deleted or purged past them meanwhile).
    fn deliver(&self, name: &str, incarnation: u64, puts: Vec<Put>) {
        let mut state = self.lock();
        if let Some(q) = state.incarnation_mut(name, incarnation) {
            for put in puts.into_iter().filter(|p| p.seq >= q.purge_floor) {
                q.messages.insert(put.seq, Message::new(put.message));
            }
            q.notify.notify_waiters();
        }
    }

    /// Commits a new version of queue `name`'s metadata made by `change`,
    /// then applies it. Holds `meta`, so nothing else changes the queue.
    async fn update_meta(
        &self,
        name: &str,
        change: impl FnOnce(&mut StoredQueue, u64) -> Result<(), SqsError>,
    ) -> Result<(), SqsError> {
        let _meta = self.meta.lock().await;
        let (meta, pending) = {
            let state = self.lock();
            let mut meta = state.queue(name).ok_or_else(no_such_queue)?.meta.clone();
            change(&mut meta, now_ms())?;
            let pending = self.submit(vec![Change::PutQueue(meta.clone())]);
            (meta, pending)
        };
        Self::committed(pending).await?;
        if let Some(q) = self.lock().queue_mut(name) {
            q.meta = meta;
        }
        Ok(())
    }

    fn queue_url(&self, name: &str) -> String {
        format!(
            "{}/{}/{name}",
            self.config.base_url.trim_end_matches('/'),
            self.config.account_id
        )
    }

    fn queue_arn(&self, name: &str) -> String {
        format!("arn:aws:sqs:{}:{}:{name}", self.config.region, self.config.account_id)
    }

    /// The queue a `QueueUrl` names: its last path segment.
    fn queue_name(input: &Value) -> Result<String, SqsError> {
        let url = required(input, "QueueUrl")?;
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
        Ok(name.to_owned())
    }

    /// Runs one action of the JSON protocol's shape.
    pub async fn handle(&self, action: &str, input: &Value) -> Result<Value, SqsError> {
        match action {
            "CreateQueue" => self.create_queue(input).await,
            "GetQueueUrl" => self.get_queue_url(input),
            "ListQueues" => Ok(self.list_queues(input)),
            "DeleteQueue" => self.delete_queue(input).await,
            "PurgeQueue" => self.purge_queue(input).await,
            "GetQueueAttributes" => self.get_queue_attributes(input),
            "SetQueueAttributes" => self.set_queue_attributes(input).await,
            "TagQueue" => self.tag_queue(input, true).await,
            "UntagQueue" => self.tag_queue(input, false).await,
            "ListQueueTags" => self.list_queue_tags(input),
            "SendMessage" => self.send_message(input).await,
            "SendMessageBatch" => self.send_message_batch(input).await,
            "ReceiveMessage" => self.receive_message(input).await,
            "DeleteMessage" => self.delete_message(input).await,
            "DeleteMessageBatch" => self.delete_message_batch(input).await,
            "ChangeMessageVisibility" => self.change_visibility(input),
            "ChangeMessageVisibilityBatch" => self.change_visibility_batch(input),
            "ListDeadLetterSourceQueues" => self.list_dead_letter_sources(input),
            other => Err(SqsError::invalid_action(format!(
                "The action {other} is not valid for this endpoint."
            ))),
        }
    }

    async fn create_queue(&self, input: &Value) -> Result<Value, SqsError> {
        let name = required(input, "QueueName")?;
        let given = string_map(input.get("Attributes"))?;
        let fifo = name.ends_with(".fifo");
        validate_queue_name(name, fifo || given.get("FifoQueue").is_some_and(|v| v == "true"))?;
        let mut attributes = QueueAttributes::default();
        attributes.apply(&given, true, fifo)?;
        let tags = string_map(input.get("tags"))?;
        let url = self.queue_url(name);
        let _meta = self.meta.lock().await;
        let (meta, pending) = {
            let state = self.lock();
            if let Some(existing) = state.queue(name) {
                let mut wanted = QueueAttributes::default();
                wanted.apply(&given, true, fifo)?;
                let same = given.iter().all(|(k, v)| existing.meta.attributes.0.get(k) == Some(v));
                if !same {
                    return Err(SqsError::queue_name_exists(
                        "A queue already exists with the same name and a different value for attribute(s)",
                    ));
                }
                return Ok(json!({"QueueUrl": url}));
            }
            let now = now_ms() / 1000;
            let meta = StoredQueue {
                name: name.to_owned(),
                fifo,
                attributes,
                tags,
                created_s: now,
                modified_s: now,
            };
            let pending = self.submit(vec![Change::PutQueue(meta.clone())]);
            (meta, pending)
        };
        Self::committed(pending).await?;
        let mut state = self.lock();
        let incarnation = state.take_seq();
        state.queues.insert(name.to_owned(), Queue::new(meta, incarnation));
        Ok(json!({"QueueUrl": url}))
    }

    fn get_queue_url(&self, input: &Value) -> Result<Value, SqsError> {
        let name = required(input, "QueueName")?;
        self.lock().queue(name).ok_or_else(no_such_queue)?;
        Ok(json!({"QueueUrl": self.queue_url(name)}))
    }

    fn list_queues(&self, input: &Value) -> Value {
        let prefix = str_param(input, "QueueNamePrefix").unwrap_or_default();
        let max = int_param(input, "MaxResults")
            .ok()
            .flatten()
            .map_or(1000, |m| m.clamp(1, 1000)) as usize;
        let after = str_param(input, "NextToken").unwrap_or_default();
        let names: Vec<String> = self
            .lock()
            .queues
            .iter()
            .filter(|(n, q)| !q.deleting && n.starts_with(prefix) && n.as_str() > after)
            .map(|(n, _)| n.clone())
            .collect();
        let page: Vec<String> = names.iter().take(max).map(|n| self.queue_url(n)).collect();
        let mut out = json!({});
        if !page.is_empty() {
            out["QueueUrls"] = json!(page);
        }
        if names.len() > max && input.get("MaxResults").is_some() {
            out["NextToken"] = json!(names[max - 1]);
        }
        out
    }

    fn with_queue<R>(&self, name: &str, f: impl FnOnce(&mut Queue, u64) -> Result<R, SqsError>) -> Result<R, SqsError> {
        let mut state = self.lock();
        let q = state.queue_mut(name).ok_or_else(no_such_queue)?;
        f(q, now_ms())
    }

    async fn delete_queue(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let _meta = self.meta.lock().await;
        let pending = {
            let mut state = self.lock();
            let q = state.queue_mut(&name).ok_or_else(no_such_queue)?;
            // Gone for every action from now on, so nothing new is journaled
            // for it behind its deletion.
            q.deleting = true;
            q.notify.notify_waiters();
            self.submit(vec![Change::DeleteQueue(name.clone())])
        };
        let committed = Self::committed(pending).await;
        let mut state = self.lock();
        match committed {
            Ok(()) => {
                state.queues.remove(&name);
                Ok(json!({}))
            }
            Err(e) => {
                if let Some(q) = state.queues.get_mut(&name) {
                    q.deleting = false;
                }
                Err(e)
            }
        }
    }

    async fn purge_queue(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let _meta = self.meta.lock().await;
        let (floor, pending) = {
            let state = self.lock();
            state.queue(&name).ok_or_else(no_such_queue)?;
            // Every message journaled before the purge has a lower sequence.
            (state.next_seq, self.submit(vec![Change::PurgeQueue(name.clone())]))
        };
        Self::committed(pending).await?;
        if let Some(q) = self.lock().queue_mut(&name) {
            q.purge_floor = floor;
            q.messages.retain(|seq, _| *seq >= floor);
        }
        Ok(json!({}))
    }

    fn get_queue_attributes(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let wanted = list_param(input, "AttributeNames");
        self.with_queue(&name, |q, now| {
            let mut all: BTreeMap<String, String> = q.meta.attributes.0.clone();
            for n in attributes::numeric_names() {
                all.entry(n.to_owned())
                    .or_insert_with(|| q.meta.attributes.number(n).to_string());
            }
            if q.meta.fifo {
                all.insert("FifoQueue".into(), "true".into());
                all.entry("ContentBasedDeduplication".into())
                    .or_insert_with(|| "false".into());
            }
            let visible = q.messages.values().filter(|m| m.visible_at_ms <= now).count();
            let in_flight = q.messages.values().filter(|m| m.in_flight(now)).count();
            let delayed = q
                .messages
                .values()
                .filter(|m| m.visible_at_ms > now && m.receipt.is_none())
                .count();
            all.insert("ApproximateNumberOfMessages".into(), visible.to_string());
            all.insert("ApproximateNumberOfMessagesNotVisible".into(), in_flight.to_string());
            all.insert("ApproximateNumberOfMessagesDelayed".into(), delayed.to_string());
            all.insert("CreatedTimestamp".into(), q.meta.created_s.to_string());
            all.insert("LastModifiedTimestamp".into(), q.meta.modified_s.to_string());
            all.insert("QueueArn".into(), self.queue_arn(&q.meta.name));
            let everything = wanted.is_empty() || wanted.contains(&"All");
            for w in &wanted {
                if *w != "All" && !attributes::is_known(w) {
                    return Err(SqsError::invalid_attribute_name(format!("Unknown Attribute {w}.")));
                }
            }
            if wanted.is_empty() {
                return Ok(json!({}));
            }
            let selected: Map<String, Value> = all
                .into_iter()
                .filter(|(k, _)| everything || wanted.contains(&k.as_str()))
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            Ok(if selected.is_empty() {
                json!({})
            } else {
                json!({"Attributes": selected})
            })
        })
    }

    async fn set_queue_attributes(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let given = string_map(input.get("Attributes"))?;
        self.update_meta(&name, |meta, now| {
            let fifo = meta.fifo;
            meta.attributes.apply(&given, false, fifo)?;
            meta.modified_s = now / 1000;
            Ok(())
        })
        .await?;
        Ok(json!({}))
    }

    async fn tag_queue(&self, input: &Value, add: bool) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        self.update_meta(&name, |meta, _| {
            if add {
                let tags = string_map(input.get("Tags"))?;
                if tags.is_empty() {
                    return Err(SqsError::missing_parameter(
                        "The request must contain the parameter Tags.",
                    ));
                }
                if meta.tags.len() + tags.len() > 50 {
                    return Err(SqsError::invalid_parameter_value(
                        "Too many tags added for queue (at most 50).",
                    ));
                }
                meta.tags.extend(tags);
            } else {
                for key in list_param(input, "TagKeys") {
                    meta.tags.remove(key);
                }
            }
            Ok(())
        })
        .await?;
        Ok(json!({}))
    }

    fn list_queue_tags(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        self.with_queue(&name, |q, _| {
            Ok(if q.meta.tags.is_empty() {
                json!({})
            } else {
                json!({"Tags": q.meta.tags})
            })
        })
    }

    fn list_dead_letter_sources(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let arn = self.queue_arn(&name);
        let state = self.lock();
        state.queue(&name).ok_or_else(no_such_queue)?;
        let urls: Vec<String> = state
            .queues
            .values()
            .filter(|q| {
                !q.deleting
                    && q.meta
                        .attributes
                        .redrive_policy()
                        .is_some_and(|p| p.dead_letter_target_arn == arn)
            })
            .map(|q| self.queue_url(&q.meta.name))
            .collect();
        Ok(json!({"queueUrls": urls}))
    }

    /// Validates one message and decides its sequence (under the state
    /// lock); `None` for a duplicate within the deduplication window. The
    /// deduplication id is reserved at once ([`Self::forget_dedup`] undoes it).
    fn enqueue(&self, state: &mut State, queue: &str, entry: &Value) -> Result<(Value, Option<Put>), SqsError> {
        let next_seq = state.next_seq;
        let q = state.queue_mut(queue).ok_or_else(no_such_queue)?;
        let now = now_ms();
        let body = required(entry, "MessageBody")?;
        validate_body(body)?;
        let attributes = message::parse_attributes(entry.get("MessageAttributes"))?;
        let max = q.meta.attributes.number("MaximumMessageSize") as usize;
        if body.len() + attributes_size(&attributes) > max {
            return Err(SqsError::invalid_parameter_value(format!(
                "One or more parameters are invalid. Reason: Message must be shorter than {max} bytes."
            )));
        }
        let delay = bounded(entry, "DelaySeconds", 900)?;
        let group_id = str_param(entry, "MessageGroupId").map(str::to_owned);
        let mut dedup_id = str_param(entry, "MessageDeduplicationId").map(str::to_owned);
        for (value, field) in [(&group_id, "MessageGroupId"), (&dedup_id, "MessageDeduplicationId")] {
            if let Some(v) = value
                && (v.is_empty() || v.len() > 128 || !v.chars().all(|c| c.is_ascii_graphic()))
            {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {v} for parameter {field} is invalid. Reason: up to 128 printable ASCII characters."
                )));
            }
        }
        if q.meta.fifo {
            if group_id.is_none() {
                return Err(SqsError::missing_parameter(
                    "The request must contain the parameter MessageGroupId.",
                ));
            }
            if delay.is_some_and(|d| d > 0) {
                return Err(SqsError::invalid_parameter_value(
                    "Value for parameter DelaySeconds is invalid. Reason: The request include parameter that is not \
                     valid for this queue type.",
                ));
            }
            if dedup_id.is_none() {
                if !q.meta.attributes.flag("ContentBasedDeduplication") {
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
        let md5_body = md5_hex(body.as_bytes());
        let md5_attributes = attributes_md5(&attributes);
        let mut out = json!({"MD5OfMessageBody": md5_body});
        if let Some(md5) = &md5_attributes {
            out["MD5OfMessageAttributes"] = json!(md5);
        }
        // Within the 5-minute window a duplicate is acknowledged, not enqueued.
        if let Some(d) = &dedup_id
            && let Some((expires, id, seq)) = q.dedup.get(d)
            && *expires > now
        {
            out["MessageId"] = json!(id);
            if let Some(seq) = seq {
                out["SequenceNumber"] = json!(seq);
            }
            return Ok((out, None));
        }
        let delay_ms = delay.unwrap_or_else(|| u64::from(q.meta.attributes.number("DelaySeconds"))) * 1000;
        let seq = next_seq;
        let sequence_number = q.meta.fifo.then(|| format!("{seq:020}"));
        let stored = StoredMessage {
            id: random_uuid(),
            body: body.to_owned(),
            attributes,
            sent_ms: now,
            visible_at_ms: now + delay_ms,
            group_id,
            dedup_id: dedup_id.clone(),
            sequence_number: sequence_number.clone(),
            receive_count: 0,
        };
        out["MessageId"] = json!(stored.id);
        if let Some(s) = &sequence_number {
            out["SequenceNumber"] = json!(s);
        }
        if let Some(d) = dedup_id {
            q.dedup
                .insert(d, (now + DEDUP_WINDOW_MS, stored.id.clone(), sequence_number));
        }
        state.next_seq += 1;
        Ok((out, Some(Put { seq, message: stored })))
    }

    /// Journals `puts` of queue `name` (under the state lock).
    fn submit_puts(&self, name: &str, puts: &[Put]) -> Option<Pending> {
        self.submit(
            puts.iter()
                .map(|p| Change::PutMessage {
                    queue: name.to_owned(),
                    seq: p.seq,
                    message: p.message.clone(),
                })
                .collect(),
        )
    }

    /// After a failed commit: the deduplication ids `puts` reserved are free again.
    fn forget_dedup(&self, name: &str, incarnation: u64, puts: &[Put]) {
        let mut state = self.lock();
        if let Some(q) = state.incarnation_mut(name, incarnation) {
            for put in puts {
                if let Some(d) = &put.message.dedup_id
                    && q.dedup.get(d).is_some_and(|(_, id, _)| *id == put.message.id)
                {
                    q.dedup.remove(d);
                }
            }
        }
    }

    /// Commits `puts`, then makes them visible; a failed commit changes nothing.
    async fn commit_puts(
        &self,
        name: &str,
        incarnation: u64,
        puts: Vec<Put>,
        pending: Option<Pending>,
    ) -> Result<(), SqsError> {
        match Self::committed(pending).await {
            Ok(()) => {
                self.deliver(name, incarnation, puts);
                Ok(())
            }
            Err(e) => {
                self.forget_dedup(name, incarnation, &puts);
                Err(e)
            }
        }
    }

    async fn send_message(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let (out, puts, incarnation, pending) = {
            let mut state = self.lock();
            let incarnation = state.queue(&name).ok_or_else(no_such_queue)?.incarnation;
            let (out, put) = self.enqueue(&mut state, &name, input)?;
            let puts: Vec<Put> = put.into_iter().collect();
            let pending = self.submit_puts(&name, &puts);
            (out, puts, incarnation, pending)
        };
        self.commit_puts(&name, incarnation, puts, pending).await?;
        Ok(out)
    }

    async fn send_message_batch(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let entries = batch_entries(input, "Entries")?;
        let bodies: usize = entries
            .iter()
            .map(|e| {
                str_param(e, "MessageBody").map_or(0, str::len)
                    + message::parse_attributes(e.get("MessageAttributes")).map_or(0, |a| attributes_size(&a))
            })
            .sum();
        if bodies > MAX_MESSAGE_SIZE as usize {
            return Err(SqsError::batch_request_too_long(format!(
                "Batch requests cannot be longer than {MAX_MESSAGE_SIZE} bytes. You have sent {bodies} bytes."
            )));
        }
        let (mut successful, mut failed, mut puts) = (Vec::new(), Vec::new(), Vec::new());
        let (incarnation, pending) = {
            let mut state = self.lock();
            let incarnation = state.queue(&name).ok_or_else(no_such_queue)?.incarnation;
            for entry in entries {
                let id = str_param(entry, "Id").unwrap_or_default();
                match self.enqueue(&mut state, &name, entry) {
                    Ok((mut out, put)) => {
                        out["Id"] = json!(id);
                        successful.push(out);
                        puts.extend(put);
                    }
                    Err(e) => failed.push(batch_failure(id, &e)),
                }
            }
            (incarnation, self.submit_puts(&name, &puts))
        };
        self.commit_puts(&name, incarnation, puts, pending).await?;
        Ok(json!({"Successful": successful, "Failed": failed}))
    }

    /// One receive attempt: takes up to `max` visible messages (at once, so
    /// no other receive takes them) and journals expiries and dead-letter
    /// moves before the lock is released.
    fn try_receive(&self, name: &str, max: usize, visibility_ms: u64) -> Result<Received, SqsError> {
        let mut state = self.lock();
        let now = now_ms();
        let (policy, fifo, incarnation) = {
            let q = state.queue(name).ok_or_else(no_such_queue)?;
            (q.meta.attributes.redrive_policy(), q.meta.fifo, q.incarnation)
        };
        let dlq = policy
            .as_ref()
            .and_then(|p| p.dead_letter_target_arn.rsplit(':').next())
            .filter(|n| *n != name)
            .and_then(|n| state.queue(n).map(|q| (n.to_owned(), q.incarnation)));
        let mut changes = Vec::new();
        let q = state.queue_mut(name).ok_or_else(no_such_queue)?;
        for seq in q.expire(now) {
            changes.push(Change::DeleteMessage {
                queue: name.to_owned(),
                seq,
            });
        }
        let mut taken = Vec::new();
        let mut to_dead_letter = Vec::new();
        let mut blocked_groups: HashSet<String> = HashSet::new();
        for (seq, m) in q.messages.iter_mut() {
            if taken.len() >= max {
                break;
            }
            let group = m.stored.group_id.clone();
            if fifo {
                if let Some(g) = &group
                    && blocked_groups.contains(g)
                {
                    continue;
                }
                if m.visible_at_ms > now {
                    if let Some(g) = group {
                        blocked_groups.insert(g);
                    }
                    continue;
                }
            } else if m.visible_at_ms > now {
                continue;
            }
            if let (Some(p), Some(_)) = (&policy, &dlq)
                && m.receive_count >= p.max_receive_count
            {
                to_dead_letter.push(*seq);
                continue;
            }
            let before = m.delivery();
            m.receive_count += 1;
            m.first_receive_ms.get_or_insert(now);
            m.received_ms = now;
            m.visible_at_ms = now + visibility_ms;
            let receipt = receipt_for(*seq);
            m.receipt = Some(receipt.clone());
            taken.push((*seq, receipt, before));
        }
        let moved: Vec<(u64, Message)> = to_dead_letter
            .iter()
            .filter_map(|seq| q.messages.remove(seq).map(|m| (*seq, m)))
            .collect();
        let messages = taken
            .iter()
            .filter_map(|(seq, receipt, _)| {
                let m = q.messages.get(seq)?;
                Some(Self::message_json(m, receipt.clone(), &self.config.account_id))
            })
            .collect();
        let mut dead_letters = Vec::new();
        if let Some((dlq_name, _)) = &dlq {
            for (old_seq, m) in &moved {
                let mut stored = m.stored.clone();
                stored.receive_count = m.receive_count;
                stored.visible_at_ms = now;
                changes.push(Change::DeleteMessage {
                    queue: name.to_owned(),
                    seq: *old_seq,
                });
                let seq = state.take_seq();
                changes.push(Change::PutMessage {
                    queue: dlq_name.clone(),
                    seq,
                    message: stored.clone(),
                });
                dead_letters.push(Put { seq, message: stored });
            }
        }
        Ok(Received {
            messages,
            incarnation,
            taken,
            moved,
            dead_letters: dlq.map(|d| (d, dead_letters)),
            pending: self.submit(changes),
        })
    }

    /// Waits for a receive's changes to commit: then its dead letters reach
    /// their queue; if the commit fails, everything it took is put back.
    async fn finish_receive(&self, name: &str, received: Received) -> Result<Vec<Value>, SqsError> {
        let Received {
            messages,
            incarnation,
            taken,
            moved,
            dead_letters,
            pending,
        } = received;
        match Self::committed(pending).await {
            Ok(()) => {
                if let Some(((dlq, dlq_incarnation), puts)) = dead_letters {
                    self.deliver(&dlq, dlq_incarnation, puts);
                }
                Ok(messages)
            }
            Err(e) => {
                let mut state = self.lock();
                if let Some(q) = state.incarnation_mut(name, incarnation) {
                    for (seq, receipt, before) in taken {
                        if let Some(m) = q.messages.get_mut(&seq)
                            && m.receipt.as_deref() == Some(receipt.as_str())
                        {
                            m.restore(before);
                        }
                    }
                    q.messages.extend(moved);
                    q.notify.notify_waiters();
                }
                Err(e)
            }
        }
    }

    fn message_json(m: &Message, receipt: String, account: &str) -> Value {
        let mut system = Map::new();
        system.insert("SenderId".into(), json!(account));
        system.insert("SentTimestamp".into(), json!(m.stored.sent_ms.to_string()));
        system.insert("ApproximateReceiveCount".into(), json!(m.receive_count.to_string()));
        system.insert(
            "ApproximateFirstReceiveTimestamp".into(),
            json!(m.first_receive_ms.unwrap_or(m.received_ms).to_string()),
        );
        if let Some(g) = &m.stored.group_id {
            system.insert("MessageGroupId".into(), json!(g));
        }
        if let Some(d) = &m.stored.dedup_id {
            system.insert("MessageDeduplicationId".into(), json!(d));
        }
        if let Some(s) = &m.stored.sequence_number {
            system.insert("SequenceNumber".into(), json!(s));
        }
        json!({
            "MessageId": m.stored.id,
            "ReceiptHandle": receipt,
            "MD5OfBody": m.md5_body,
            "Body": m.stored.body,
            "Attributes": system,
            "MessageAttributes": attributes_json(&m.stored.attributes, |_| true),
            "MD5OfMessageAttributes": m.md5_attributes,
        })
    }

    /// Keeps only the requested system and message attributes of a message.
    fn select(mut m: Value, system: &[&str], message_attrs: &[&str]) -> Value {
        let all_system = system.contains(&"All");
        if let Some(Value::Object(attrs)) = m.get_mut("Attributes") {
            attrs.retain(|k, _| all_system || system.contains(&k.as_str()));
        }
        let keep = |name: &str| {
            message_attrs.iter().any(|w| {
                *w == "All" || *w == ".*" || *w == name || w.strip_suffix(".*").is_some_and(|p| name.starts_with(p))
            })
        };
        let md5 = m.get("MD5OfMessageAttributes").cloned();
        if let Some(Value::Object(attrs)) = m.get_mut("MessageAttributes") {
            attrs.retain(|k, _| keep(k));
        }
        let obj = m.as_object_mut().expect("message is an object");
        if obj
            .get("Attributes")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            obj.remove("Attributes");
        }
        if obj
            .get("MessageAttributes")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            obj.remove("MessageAttributes");
            obj.remove("MD5OfMessageAttributes");
        } else if md5.as_ref().is_some_and(Value::is_null) {
            obj.remove("MD5OfMessageAttributes");
        }
        m
    }

    async fn receive_message(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let max = match int_param(input, "MaxNumberOfMessages")? {
            None => 1,
            Some(n @ 1..=10) => n as usize,
            Some(n) => {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {n} for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."
                )));
            }
        };
        let (default_visibility, default_wait, notify) = self.with_queue(&name, |q, _| {
            Ok((
                u64::from(q.meta.attributes.number("VisibilityTimeout")),
                u64::from(q.meta.attributes.number("ReceiveMessageWaitTimeSeconds")),
                q.notify.clone(),
            ))
        })?;
        let visibility = bounded(input, "VisibilityTimeout", MAX_VISIBILITY_SECONDS)?.unwrap_or(default_visibility);
        let wait = bounded(input, "WaitTimeSeconds", MAX_WAIT_SECONDS)?.unwrap_or(default_wait);
        let mut system: Vec<&str> = list_param(input, "AttributeNames");
        system.extend(list_param(input, "MessageSystemAttributeNames"));
        let message_attrs = list_param(input, "MessageAttributeNames");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        loop {
            let waiter = notify.notified();
            tokio::pin!(waiter);
            waiter.as_mut().enable();
            let received = self.try_receive(&name, max, visibility * 1000)?;
            let messages = self.finish_receive(&name, received).await?;
            if !messages.is_empty() || tokio::time::Instant::now() >= deadline {
                let messages: Vec<Value> = messages
                    .into_iter()
                    .map(|m| Self::select(m, &system, &message_attrs))
                    .collect();
                return Ok(if messages.is_empty() {
                    json!({})
                } else {
                    json!({"Messages": messages})
                });
            }
            let tick = (tokio::time::Instant::now() + POLL_TICK).min(deadline);
            tokio::select! {
                () = &mut waiter => {}
                () = tokio::time::sleep_until(tick) => {}
            }
        }
    }

    /// The sequence of the message a receipt handle names, if it is still
    /// there under that receipt. Deleting a message that is gone, or with a
    /// superseded receipt, succeeds without effect, as in SQS.
    fn held_by_receipt(q: &Queue, handle: &str) -> Result<Option<u64>, SqsError> {
        let seq = receipt_seq(handle)?;
        Ok(q.messages
            .get(&seq)
            .filter(|m| m.receipt.as_deref() == Some(handle))
            .map(|_| seq))
    }

    /// Commits the deletion of `seqs` from queue `name`, then removes them.
    async fn commit_deletes(
        &self,
        name: &str,
        incarnation: u64,
        seqs: Vec<u64>,
        pending: Option<Pending>,
    ) -> Result<(), SqsError> {
        Self::committed(pending).await?;
        if let Some(q) = self.lock().incarnation_mut(name, incarnation) {
            for seq in seqs {
                q.messages.remove(&seq);
            }
        }
        Ok(())
    }

    fn submit_deletes(&self, name: &str, seqs: &[u64]) -> Option<Pending> {
        self.submit(
            seqs.iter()
                .map(|seq| Change::DeleteMessage {
                    queue: name.to_owned(),
                    seq: *seq,
                })
                .collect(),
        )
    }

    async fn delete_message(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let handle = required(input, "ReceiptHandle")?;
        let (incarnation, seqs, pending) = {
            let state = self.lock();
            let q = state.queue(&name).ok_or_else(no_such_queue)?;
            let seqs: Vec<u64> = Self::held_by_receipt(q, handle)?.into_iter().collect();
            let pending = self.submit_deletes(&name, &seqs);
            (q.incarnation, seqs, pending)
        };
        self.commit_deletes(&name, incarnation, seqs, pending).await?;
        Ok(json!({}))
    }

    async fn delete_message_batch(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let entries = batch_entries(input, "Entries")?;
        let (mut successful, mut failed, mut seqs) = (Vec::new(), Vec::new(), Vec::new());
        let (incarnation, pending) = {
            let state = self.lock();
            let q = state.queue(&name).ok_or_else(no_such_queue)?;
            for entry in entries {
                let id = str_param(entry, "Id").unwrap_or_default();
                match required(entry, "ReceiptHandle").and_then(|h| Self::held_by_receipt(q, h)) {
                    Ok(seq) => {
                        seqs.extend(seq);
                        successful.push(json!({"Id": id}));
                    }
                    Err(e) => failed.push(batch_failure(id, &e)),
                }
            }
            (q.incarnation, self.submit_deletes(&name, &seqs))
        };
        self.commit_deletes(&name, incarnation, seqs, pending).await?;
        Ok(json!({"Successful": successful, "Failed": failed}))
    }

    fn change_one(&self, name: &str, entry: &Value) -> Result<(), SqsError> {
        let handle = required(entry, "ReceiptHandle")?;
        let seq = receipt_seq(handle)?;
        let timeout = int_param(entry, "VisibilityTimeout")?
            .ok_or_else(|| SqsError::missing_parameter("The request must contain the parameter VisibilityTimeout."))?;
        if timeout > MAX_VISIBILITY_SECONDS {
            return Err(SqsError::invalid_parameter_value(format!(
                "Value {timeout} for parameter VisibilityTimeout is invalid. Reason: Must be between 0 and 43200."
            )));
        }
        let notify = self.with_queue(name, |q, now| {
            let m = q
                .messages
                .get_mut(&seq)
                .filter(|m| m.receipt.as_deref() == Some(handle) && m.in_flight(now))
                .ok_or_else(|| {
                    SqsError::message_not_inflight(
                        "Message does not exist or is not available for visibility timeout change.",
                    )
                })?;
            let until = now + timeout * 1000;
            if until - m.received_ms > MAX_VISIBILITY_SECONDS * 1000 {
                return Err(SqsError::invalid_parameter_value(
                    "Value for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message \
                     is beyond the limit [43200 seconds]",
                ));
            }
            m.visible_at_ms = until;
            Ok(q.notify.clone())
        })?;
        if timeout == 0 {
            notify.notify_waiters();
        }
        Ok(())
    }

    fn change_visibility(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        self.change_one(&name, input)?;
        Ok(json!({}))
    }

    fn change_visibility_batch(&self, input: &Value) -> Result<Value, SqsError> {
        let name = Self::queue_name(input)?;
        let entries = batch_entries(input, "Entries")?;
        let (mut successful, mut failed) = (Vec::new(), Vec::new());
        for entry in entries {
            let id = str_param(entry, "Id").unwrap_or_default();
            match self.change_one(&name, entry) {
                Ok(()) => successful.push(json!({"Id": id})),
                Err(e) if e.shape == "QueueDoesNotExist" => return Err(e),
                Err(e) => failed.push(batch_failure(id, &e)),
            }
        }
        Ok(json!({"Successful": successful, "Failed": failed}))
    }
}

#[cfg(test)]
mod tests;
