//! Actions on queues themselves: create, find, list, delete, purge, their
//! attributes and tags. Each holds `meta` while its change commits.

use std::collections::BTreeMap;

use super::attributes::{self, QueueAttributes, validate_queue_name};
use super::journal::Change;
use super::queue::Queue;
use super::records::StoredQueue;
use super::requests::{self, AttributeNames, CreateQueue, GetQueueUrl, ListQueues, SetAttributes, TagKeys, Tags};
use super::responses::{self, DeadLetterSources, Empty, QueueUrl, QueueUrls};
use super::{Engine, State, now_ms};
use crate::error::SqsError;

/// Most tags on one queue.
const MAX_TAGS: usize = 50;
/// SQS refuses a second purge of a queue within 60 s…
const PURGE_EVERY_MS: u64 = 60_000;
/// …and a queue of a name deleted less than 60 s ago.
const RECREATE_AFTER_MS: u64 = 60_000;
const MAX_LIST_RESULTS: u64 = 1000;
/// The most queues one engine (one queue service) holds: SQS bounds an
/// account's queues by quota, and this way one ListQueues page lists them
/// all.
pub const MAX_QUEUES: usize = MAX_LIST_RESULTS as usize;

impl Engine {
    /// Commits a new version of queue `name`'s metadata made by `change`,
    /// then applies it. Holds `meta`, so nothing else changes the queue.
    pub(super) async fn update_meta(
        &self,
        name: &str,
        change: impl FnOnce(&State, &mut StoredQueue, u64) -> Result<(), SqsError>,
    ) -> Result<Empty, SqsError> {
        let _meta = self.meta.lock().await;
        let (meta, pending) = {
            let state = self.lock();
            let mut meta = state.queue(name)?.meta.clone();
            change(&state, &mut meta, now_ms())?;
            let pending = self.submit(vec![Change::PutQueue(meta.clone())]);
            (meta, pending)
        };
        Self::committed(pending).await?;
        if let Ok(q) = self.lock().queue_mut(name) {
            q.meta = meta;
        }
        Ok(Empty {})
    }

    /// A redrive policy must name an existing queue of this tenant, of the
    /// same type (FIFO or standard), other than the queue itself.
    fn check_redrive(
        &self,
        state: &State,
        name: &str,
        attributes: &QueueAttributes,
        fifo: bool,
    ) -> Result<(), SqsError> {
        let Some(policy) = attributes.redrive_policy() else {
            return Ok(());
        };
        let invalid = |reason: &str| {
            SqsError::invalid_parameter_value(format!(
                "Value {} for parameter RedrivePolicy is invalid. Reason: {reason}",
                attributes.0.get("RedrivePolicy").map_or("", String::as_str)
            ))
        };
        let target = self
            .queue_named_by(state, &policy.dead_letter_target_arn)
            .filter(|target| *target != name)
            .ok_or_else(|| invalid("Dead-letter target does not exist."))?;
        let dlq = state.queue(target)?;
        if dlq.meta.fifo != fifo {
            return Err(invalid("Dead-letter queue must be same type of queue as the source."));
        }
        Ok(())
    }

    pub(super) async fn create_queue(&self, request: CreateQueue) -> Result<QueueUrl, SqsError> {
        let name = requests::required(&request.queue_name, "QueueName")?;
        let given = &request.attributes;
        let fifo = name.ends_with(".fifo");
        validate_queue_name(name, fifo || given.get("FifoQueue").is_some_and(|v| v == "true"))?;
        let mut attributes = QueueAttributes::default();
        attributes.apply(given, true, fifo)?;
        let url = QueueUrl {
            queue_url: self.queue_url(name),
        };
        let _meta = self.meta.lock().await;
        let (meta, pending) = {
            let state = self.lock();
            if let Ok(existing) = state.queue(name) {
                // Creating an existing queue again is idempotent when every
                // attribute given has the value the queue already has.
                let same = given
                    .keys()
                    .all(|k| existing.meta.attributes.0.get(k) == attributes.0.get(k));
                if !same {
                    return Err(SqsError::queue_name_exists(
                        "A queue already exists with the same name and a different value for attribute(s)",
                    ));
                }
                return Ok(url);
            }
            if state
                .deleted
                .get(name)
                .is_some_and(|at| now_ms() < at + RECREATE_AFTER_MS)
            {
                return Err(SqsError::queue_deleted_recently(
                    "You must wait 60 seconds after deleting a queue before you can create another with the same \
                     name.",
                ));
            }
            self.check_redrive(&state, name, &attributes, fifo)?;
            if state.queues.len() >= MAX_QUEUES {
                return Err(SqsError::over_limit(format!(
                    "A queue service holds at most {MAX_QUEUES} queues; delete one to create another."
                )));
            }
            let now = now_ms() / 1000;
            let meta = StoredQueue {
                name: name.to_owned(),
                fifo,
                attributes,
                tags: request.tags,
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
        Ok(url)
    }

    pub(super) fn get_queue_url(&self, request: &GetQueueUrl) -> Result<QueueUrl, SqsError> {
        let name = requests::required(&request.queue_name, "QueueName")?;
        self.lock().queue(name)?;
        Ok(QueueUrl {
            queue_url: self.queue_url(name),
        })
    }

    pub(super) fn list_queues(&self, request: &ListQueues) -> Result<QueueUrls, SqsError> {
        let max = requests::bounded(request.max_results, "MaxResults", MAX_LIST_RESULTS)?;
        let page = max.map_or(MAX_LIST_RESULTS, |m| m.max(1)) as usize;
        let names: Vec<String> = self
            .lock()
            .queues
            .iter()
            .filter(|(n, q)| {
                !q.deleting && n.starts_with(&request.queue_name_prefix) && n.as_str() > request.next_token.as_str()
            })
            .map(|(n, _)| n.clone())
            .collect();
        Ok(QueueUrls {
            queue_urls: names.iter().take(page).map(|n| self.queue_url(n)).collect(),
            // SQS pages only when asked to.
            next_token: (names.len() > page && max.is_some()).then(|| names[page - 1].clone()),
        })
    }

    pub(super) async fn delete_queue(&self, name: &str) -> Result<Empty, SqsError> {
        let _meta = self.meta.lock().await;
        let pending = {
            let mut state = self.lock();
            let q = state.queue_mut(name)?;
            // Gone for every action from now on, so nothing new is journaled
            // for it behind its deletion.
            q.deleting = true;
            q.notify.notify_waiters();
            self.submit(vec![Change::DeleteQueue(name.to_owned())])
        };
        let committed = Self::committed(pending).await;
        let mut state = self.lock();
        match committed {
            Ok(()) => {
                state.queues.remove(name);
                state.deleted.insert(name.to_owned(), now_ms());
                Ok(Empty {})
            }
            Err(e) => {
                if let Some(q) = state.queues.get_mut(name) {
                    q.deleting = false;
                }
                Err(e)
            }
        }
    }

    pub(super) async fn purge_queue(&self, name: &str) -> Result<Empty, SqsError> {
        let _meta = self.meta.lock().await;
        let (floor, pending) = {
            let state = self.lock();
            let q = state.queue(name)?;
            if q.purged_ms.is_some_and(|at| now_ms() < at + PURGE_EVERY_MS) {
                return Err(SqsError::purge_queue_in_progress(format!(
                    "Only one PurgeQueue operation on {name} is allowed every 60 seconds."
                )));
            }
            // Every message journaled before the purge has a lower sequence.
            (state.next_seq, self.submit(vec![Change::PurgeQueue(name.to_owned())]))
        };
        Self::committed(pending).await?;
        if let Ok(q) = self.lock().queue_mut(name) {
            q.purge(floor);
            q.purged_ms = Some(now_ms());
        }
        Ok(Empty {})
    }

    pub(super) fn get_queue_attributes(
        &self,
        name: &str,
        request: &AttributeNames,
    ) -> Result<responses::Attributes, SqsError> {
        let wanted = &request.attribute_names;
        let everything = wanted.iter().any(|w| w == "All");
        self.with_queue(name, |q, now| {
            if let Some(unknown) = wanted.iter().find(|w| *w != "All" && !attributes::is_known(w)) {
                return Err(SqsError::invalid_attribute_name(format!(
                    "Unknown Attribute {unknown}."
                )));
            }
            let mut all: BTreeMap<String, String> = q.meta.attributes.0.clone();
            for n in attributes::numeric_names() {
                all.entry(n.to_owned())
                    .or_insert_with(|| q.meta.attributes.number(n).to_string());
            }
            // SQS-managed encryption is on for a queue without a KMS key
            // (SQS's default since 2022); sless's journal is protected by
            // its volume, as the README says.
            all.entry("SqsManagedSseEnabled".into())
                .or_insert_with(|| (!q.meta.attributes.0.contains_key("KmsMasterKeyId")).to_string());
            if q.meta.fifo {
                all.insert("FifoQueue".into(), "true".into());
                all.entry("ContentBasedDeduplication".into())
                    .or_insert_with(|| "false".into());
                for (attribute, default) in attributes::fifo_defaults() {
                    all.entry(attribute.into()).or_insert_with(|| default.into());
                }
            }
            let counts = q.counts(now);
            all.insert("ApproximateNumberOfMessages".into(), counts.visible.to_string());
            all.insert(
                "ApproximateNumberOfMessagesNotVisible".into(),
                counts.in_flight.to_string(),
            );
            all.insert("ApproximateNumberOfMessagesDelayed".into(), counts.delayed.to_string());
            all.insert("CreatedTimestamp".into(), q.meta.created_s.to_string());
            all.insert("LastModifiedTimestamp".into(), q.meta.modified_s.to_string());
            all.insert("QueueArn".into(), self.queue_arn(&q.meta.name));
            all.retain(|k, _| everything || wanted.contains(k));
            if wanted.iter().any(|w| w == "ApproximateAgeOfOldestMessage") {
                all.insert("ApproximateAgeOfOldestMessage".into(), q.oldest_age_s(now).to_string());
            }
            Ok(responses::Attributes { attributes: all })
        })
    }

    pub(super) async fn set_queue_attributes(&self, name: &str, request: SetAttributes) -> Result<Empty, SqsError> {
        self.update_meta(name, |state, meta, now| {
            let fifo = meta.fifo;
            meta.attributes.apply(&request.attributes, false, fifo)?;
            // Only a policy being set is checked: a queue whose dead-letter
            // queue was deleted takes its other changes, as on AWS.
            if request.attributes.contains_key("RedrivePolicy") {
                self.check_redrive(state, name, &meta.attributes, fifo)?;
            }
            meta.modified_s = now / 1000;
            Ok(())
        })
        .await
    }

    pub(super) async fn tag_queue(&self, name: &str, request: Tags) -> Result<Empty, SqsError> {
        self.update_meta(name, |_, meta, _| {
            if request.tags.is_empty() {
                return Err(SqsError::missing_parameter(
                    "The request must contain the parameter Tags.",
                ));
            }
            let added = request.tags.keys().filter(|k| !meta.tags.contains_key(*k)).count();
            if meta.tags.len() + added > MAX_TAGS {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Too many tags added for queue (at most {MAX_TAGS})."
                )));
            }
            meta.tags.extend(request.tags);
            Ok(())
        })
        .await
    }

    pub(super) async fn untag_queue(&self, name: &str, request: TagKeys) -> Result<Empty, SqsError> {
        self.update_meta(name, |_, meta, _| {
            if request.tag_keys.is_empty() {
                return Err(SqsError::missing_parameter(
                    "The request must contain the parameter TagKeys.",
                ));
            }
            for key in &request.tag_keys {
                meta.tags.remove(key);
            }
            Ok(())
        })
        .await
    }

    pub(super) fn list_queue_tags(&self, name: &str) -> Result<responses::Tags, SqsError> {
        self.with_queue(name, |q, _| {
            Ok(responses::Tags {
                tags: q.meta.tags.clone(),
            })
        })
    }

    pub(super) fn list_dead_letter_sources(&self, name: &str) -> Result<DeadLetterSources, SqsError> {
        let arn = self.queue_arn(name);
        let state = self.lock();
        state.queue(name)?;
        let queue_urls = state
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
        Ok(DeadLetterSources { queue_urls })
    }
}
