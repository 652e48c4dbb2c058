//! Actions on queues themselves: create, find, list, delete, purge, their
//! attributes and tags; the requests that make their commands, and how the
//! machine applies those.

use std::collections::BTreeMap;

use super::Engine;
use super::attributes::{self, QueueAttributes, validate_queue_name};
use super::command::{Op, Reply};
use super::machine::Machine;
use super::queue::Queue;
use super::records::StoredQueue;
use super::requests::{self, AttributeNames, CreateQueue, GetQueueUrl, ListQueues, SetAttributes, TagKeys, Tags};
use super::responses::{self, DeadLetterSources, Empty, QueueUrl, QueueUrls};
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
/// How often a change of a queue's metadata is decided again when another
/// change came first.
const META_TRIES: usize = 5;

impl Machine {
    pub(super) fn create_queue(
        &mut self,
        mut meta: StoredQueue,
        given: &[String],
        now: u64,
    ) -> Result<Reply, SqsError> {
        let name = meta.name.clone();
        if let Ok(existing) = self.queue(&name) {
            // Creating an existing queue again is idempotent when every
            // attribute given has the value the queue already has.
            let same = given
                .iter()
                .all(|k| existing.meta.attributes.0.get(k) == meta.attributes.0.get(k));
            if !same {
                return Err(SqsError::queue_name_exists(
                    "A queue already exists with the same name and a different value for attribute(s)",
                ));
            }
            return Ok(Reply::Done);
        }
        self.deleted.retain(|_, at| now < *at + RECREATE_AFTER_MS);
        if self.deleted.contains_key(&name) {
            return Err(SqsError::queue_deleted_recently(
                "You must wait 60 seconds after deleting a queue before you can create another with the same name.",
            ));
        }
        self.check_redrive(&name, &meta.attributes, meta.fifo)?;
        if self.queues.len() >= MAX_QUEUES {
            return Err(SqsError::over_limit(format!(
                "A queue service holds at most {MAX_QUEUES} queues; delete one to create another."
            )));
        }
        meta.created_s = now / 1000;
        meta.modified_s = meta.created_s;
        self.queues.insert(name, Queue::new(meta));
        Ok(Reply::Done)
    }

    pub(super) fn update_queue(&mut self, name: &str, version: u64, meta: StoredQueue) -> Result<Reply, SqsError> {
        let q = self.queue_mut(name)?;
        if q.meta_version != version {
            return Ok(Reply::Stale);
        }
        q.meta = meta;
        q.meta_version += 1;
        Ok(Reply::Done)
    }

    pub(super) fn delete_queue(&mut self, name: &str, now: u64) -> Result<Reply, SqsError> {
        let q = self.queues.remove(name).ok_or_else(super::machine::no_such_queue)?;
        // Its long polls wake up and find it gone.
        q.notify.notify_waiters();
        self.deleted.insert(name.to_owned(), now);
        Ok(Reply::Done)
    }

    pub(super) fn purge_queue(&mut self, name: &str, now: u64) -> Result<Reply, SqsError> {
        let q = self.queue_mut(name)?;
        if q.purged_ms.is_some_and(|at| now < at + PURGE_EVERY_MS) {
            return Err(SqsError::purge_queue_in_progress(format!(
                "Only one PurgeQueue operation on {name} is allowed every 60 seconds."
            )));
        }
        q.purge();
        q.purged_ms = Some(now);
        Ok(Reply::Done)
    }

    /// A redrive policy must name an existing queue of this tenant, of the
    /// same type (FIFO or standard), other than the queue itself.
    fn check_redrive(&self, name: &str, attributes: &QueueAttributes, fifo: bool) -> Result<(), SqsError> {
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
            .queue_named_by(&policy.dead_letter_target_arn)
            .filter(|target| *target != name)
            .ok_or_else(|| invalid("Dead-letter target does not exist."))?;
        if self.queue(target)?.meta.fifo != fifo {
            return Err(invalid("Dead-letter queue must be same type of queue as the source."));
        }
        Ok(())
    }
}

impl Engine {
    /// Changes queue `name`'s metadata by `change`, decided on the latest
    /// version: when another change was applied between deciding and
    /// applying, it is decided again.
    pub(super) async fn update_meta(
        &self,
        name: &str,
        change: impl Fn(&Machine, &mut StoredQueue, u64) -> Result<(), SqsError>,
    ) -> Result<Empty, SqsError> {
        for _ in 0..META_TRIES {
            let op = {
                let machine = self.lock();
                let q = machine.queue(name)?;
                let mut meta = q.meta.clone();
                change(&machine, &mut meta, super::clock(&machine))?;
                Op::UpdateQueue {
                    name: name.to_owned(),
                    version: q.meta_version,
                    meta,
                }
            };
            if let Reply::Done = self.execute(op).await? {
                return Ok(Empty {});
            }
        }
        Err(SqsError::internal(format!(
            "queue {name} was changed by other requests meanwhile; retry"
        )))
    }

    pub(super) async fn create_queue(&self, request: CreateQueue) -> Result<QueueUrl, SqsError> {
        let name = requests::required(&request.queue_name, "QueueName")?;
        let given = &request.attributes;
        let fifo = name.ends_with(".fifo");
        validate_queue_name(name, fifo || given.get("FifoQueue").is_some_and(|v| v == "true"))?;
        let mut attributes = QueueAttributes::default();
        attributes.apply(given, true, fifo)?;
        let queue = StoredQueue {
            name: name.to_owned(),
            fifo,
            attributes,
            tags: request.tags,
            created_s: 0,
            modified_s: 0,
        };
        let given = given.keys().cloned().collect();
        self.execute(Op::CreateQueue { queue, given }).await?;
        Ok(QueueUrl {
            queue_url: self.queue_url(name),
        })
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
            .filter(|(n, _)| n.starts_with(&request.queue_name_prefix) && n.as_str() > request.next_token.as_str())
            .map(|(n, _)| n.clone())
            .collect();
        Ok(QueueUrls {
            queue_urls: names.iter().take(page).map(|n| self.queue_url(n)).collect(),
            // SQS pages only when asked to.
            next_token: (names.len() > page && max.is_some()).then(|| names[page - 1].clone()),
        })
    }

    pub(super) async fn delete_queue(&self, name: &str) -> Result<Empty, SqsError> {
        self.execute(Op::DeleteQueue { name: name.to_owned() }).await?;
        Ok(Empty {})
    }

    pub(super) async fn purge_queue(&self, name: &str) -> Result<Empty, SqsError> {
        self.execute(Op::PurgeQueue { name: name.to_owned() }).await?;
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
        self.update_meta(name, |machine, meta, now| {
            let fifo = meta.fifo;
            meta.attributes.apply(&request.attributes, false, fifo)?;
            // Only a policy being set is checked: a queue whose dead-letter
            // queue was deleted takes its other changes, as on AWS.
            if request.attributes.contains_key("RedrivePolicy") {
                machine.check_redrive(name, &meta.attributes, fifo)?;
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
            meta.tags.extend(request.tags.clone());
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
        let machine = self.lock();
        machine.queue(name)?;
        let queue_urls = machine
            .queues
            .values()
            .filter(|q| {
                q.meta
                    .attributes
                    .redrive_policy()
                    .is_some_and(|p| p.dead_letter_target_arn == arn)
            })
            .map(|q| self.queue_url(&q.meta.name))
            .collect();
        Ok(DeadLetterSources { queue_urls })
    }
}
