//! Actions on messages: send, receive (with long polling and dead-letter
//! moves), delete and change visibility; the requests that make their
//! commands, and how the machine applies those.

use std::time::Duration;

use super::command::{Op, Reply};
use super::ids::{random_nonce, random_uuid};
use super::machine::Machine;
use super::message::{attributes_size, parse_attributes};
use super::queue::{Accepted, Digests, Message, Prepared};
use super::requests::{
    self, Int, MAX_VISIBILITY_SECONDS, MAX_WAIT_SECONDS, Peek, ReceiptEntry, ReceiveMessage, SendEntry, VisibilityEntry,
};
use super::responses::{
    Batch, Empty, EntryId, Messages, Outcomes, Peeked, PeekedMessage, ReceivedMessage, Selection, SendResult, single,
};
use super::{Engine, clock};
use crate::engine::attributes::MAX_MESSAGE_SIZE;
use crate::error::SqsError;

/// How often a long poll re-checks for messages whose delay or visibility
/// timeout ended (sends wake it at once).
const POLL_TICK: Duration = Duration::from_millis(100);

impl Machine {
    pub(super) fn send(
        &mut self,
        name: &str,
        messages: Vec<super::records::StoredMessage>,
        now: u64,
    ) -> Result<Reply, SqsError> {
        let Self { queues, next_seq, .. } = self;
        let q = queues.get_mut(name).ok_or_else(super::machine::no_such_queue)?;
        let accepted = messages
            .into_iter()
            .map(|message| {
                let accepted = q.accept(message, *next_seq, now);
                *next_seq += u64::from(accepted.enqueued);
                accepted
            })
            .collect();
        Ok(Reply::Sent(accepted))
    }

    /// Takes messages (a retried FIFO attempt takes what it took before),
    /// drops expired ones and moves those received too often to the
    /// dead-letter queue.
    pub(super) fn receive(
        &mut self,
        name: &str,
        max: usize,
        visibility_ms: u64,
        attempt: Option<&str>,
        nonce: &str,
        now: u64,
    ) -> Result<Reply, SqsError> {
        let source_arn = self.identity.queue_arn(name);
        let policy = self.queue(name)?.meta.attributes.redrive_policy();
        let dlq = policy
            .as_ref()
            .and_then(|p| p.dead_letter_target_arn.rsplit(':').next())
            .filter(|n| *n != name && self.queues.contains_key(*n))
            .map(str::to_owned);
        let max_receive_count = dlq.as_ref().and(policy.as_ref()).map(|p| p.max_receive_count);
        let q = self.queue_mut(name)?;
        let held = |q: &super::queue::Queue, taken: &[(u64, String)]| {
            taken
                .iter()
                .filter_map(|(seq, receipt)| Some((q.messages.get(seq)?.clone(), receipt.clone())))
                .collect()
        };
        if let Some(replayed) = attempt.and_then(|id| q.replay_attempt(id, now)) {
            return Ok(Reply::Received(held(q, &replayed)));
        }
        q.expire(now);
        let taken = q.receive(max, visibility_ms, max_receive_count, now, nonce);
        if let Some(id) = attempt {
            q.record_attempt(id, &taken, now);
        }
        let received = held(q, &taken.received);
        if let Some(dlq) = dlq {
            for (_, m) in taken.dead_letters {
                let mut stored = m.stored;
                stored.receive_count = m.receive_count;
                stored.visible_at_ms = now;
                stored.dead_letter_source_arn = Some(source_arn.clone());
                let seq = self.take_seq();
                self.queue_mut(&dlq)?.insert(seq, Message::new(stored));
            }
        }
        Ok(Reply::Received(received))
    }

    pub(super) fn delete(&mut self, name: &str, receipts: &[String]) -> Result<Reply, SqsError> {
        let q = self.queue_mut(name)?;
        let each = receipts
            .iter()
            .map(|r| {
                let held = q.held_by_receipt(r)?;
                if let Some(seq) = held {
                    q.messages.remove(&seq);
                }
                Ok(())
            })
            .collect();
        Ok(Reply::Each(each))
    }

    pub(super) fn change_visibility(
        &mut self,
        name: &str,
        changes: &[(String, u64)],
        now: u64,
    ) -> Result<Reply, SqsError> {
        let q = self.queue_mut(name)?;
        let each = changes
            .iter()
            .map(|(handle, timeout)| q.change_visibility(handle, *timeout, now))
            .collect();
        Ok(Reply::Each(each))
    }
}

/// Each batch entry's id and what its checks made of it.
type Checked<T> = Vec<(String, Result<T, SqsError>)>;

fn unexpected() -> SqsError {
    SqsError::internal("a command was answered with another command's reply")
}

impl Engine {
    /// Sends `entries` in one command; each entry succeeds or fails alone.
    async fn send(&self, name: &str, entries: Vec<SendEntry>) -> Result<Outcomes<SendResult>, SqsError> {
        let (now, prepared): (u64, Checked<Prepared>) = {
            let machine = self.lock();
            let now = clock(&machine);
            let q = machine.queue(name)?;
            let prepared = entries
                .into_iter()
                .map(|entry| {
                    let prepared = q.prepare(&entry, random_uuid(), now);
                    (entry.id, prepared)
                })
                .collect();
            (now, prepared)
        };
        let mut messages = Vec::new();
        let prepared: Vec<(String, Result<Digests, SqsError>)> = prepared
            .into_iter()
            .map(|(id, p)| {
                let digests = p.map(|Prepared { message, digests }| {
                    messages.push(message);
                    digests
                });
                (id, digests)
            })
            .collect();
        let Reply::Sent(accepted) = self
            .execute_at(
                now,
                Op::Send {
                    queue: name.to_owned(),
                    messages,
                },
            )
            .await?
        else {
            return Err(unexpected());
        };
        let mut accepted = accepted.into_iter();
        Ok(prepared
            .into_iter()
            .map(|(id, p)| {
                let outcome = p.and_then(|digests| {
                    let a: Accepted = accepted.next().ok_or_else(unexpected)?;
                    Ok(SendResult::new(digests, a))
                });
                (id, outcome)
            })
            .collect())
    }

    pub(super) async fn send_message(&self, name: &str, entry: SendEntry) -> Result<SendResult, SqsError> {
        single(self.send(name, vec![entry]).await?)
    }

    pub(super) async fn send_message_batch(
        &self,
        name: &str,
        entries: Vec<SendEntry>,
    ) -> Result<Batch<SendResult>, SqsError> {
        let total: usize = entries
            .iter()
            .map(|e| {
                e.message_body.as_ref().map_or(0, String::len)
                    + parse_attributes(&e.message_attributes).map_or(0, |a| attributes_size(&a))
            })
            .sum();
        if total > MAX_MESSAGE_SIZE as usize {
            return Err(SqsError::batch_request_too_long(format!(
                "Batch requests cannot be longer than {MAX_MESSAGE_SIZE} bytes. You have sent {total} bytes."
            )));
        }
        let outcomes = self.send(name, entries).await?;
        Ok(Batch::of(outcomes, |id, sent| SendResult { id: Some(id), ..sent }))
    }

    /// What a receive would take now, changing nothing (no journal write).
    pub(super) fn peek_messages(&self, name: &str, request: &Peek) -> Result<Peeked, SqsError> {
        let max = request.max()?;
        self.with_queue(name, |q, now| {
            let messages = q
                .peek(max, now)
                .iter()
                .filter_map(|seq| q.messages.get(seq))
                .map(|m| PeekedMessage {
                    message_id: m.stored.id.clone(),
                    body: m.stored.body.clone(),
                    approximate_receive_count: m.receive_count,
                })
                .collect();
            Ok(Peeked { messages })
        })
    }

    pub(super) async fn receive_message(&self, name: &str, request: ReceiveMessage) -> Result<Messages, SqsError> {
        let max = request.max()?;
        let (default_visibility, default_wait, notify, fifo) = self.with_queue(name, |q, _| {
            Ok((
                u64::from(q.meta.attributes.number("VisibilityTimeout")),
                u64::from(q.meta.attributes.number("ReceiveMessageWaitTimeSeconds")),
                q.notify.clone(),
                q.meta.fifo,
            ))
        })?;
        let visibility = requests::bounded(request.visibility_timeout, "VisibilityTimeout", MAX_VISIBILITY_SECONDS)?
            .unwrap_or(default_visibility);
        let wait =
            requests::bounded(request.wait_time_seconds, "WaitTimeSeconds", MAX_WAIT_SECONDS)?.unwrap_or(default_wait);
        let attempt = request.attempt_id(fifo)?.map(str::to_owned);
        let system: Vec<String> = request
            .attribute_names
            .into_iter()
            .chain(request.message_system_attribute_names)
            .collect();
        let selection = Selection {
            system: &system,
            message: &request.message_attribute_names,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
        // A retried attempt takes what it took before, which peeks do not show.
        let mut replay = attempt.is_some();
        loop {
            let waiter = notify.notified();
            tokio::pin!(waiter);
            waiter.as_mut().enable();
            // Only a receive that may take something is a command: an
            // empty queue's long polls journal nothing.
            let receivable = {
                let machine = self.lock();
                !machine.queue(name)?.peek(1, clock(&machine)).is_empty()
            };
            if replay || receivable {
                replay = false;
                let op = Op::Receive {
                    queue: name.to_owned(),
                    max,
                    visibility_ms: visibility * 1000,
                    attempt: attempt.clone(),
                    nonce: random_nonce(),
                };
                let Reply::Received(taken) = self.execute(op).await? else {
                    return Err(unexpected());
                };
                if !taken.is_empty() {
                    let account = &self.config.account_id;
                    let messages = taken
                        .iter()
                        .map(|(m, receipt)| ReceivedMessage::new(m, receipt.clone(), account, &selection))
                        .collect();
                    return Ok(Messages { messages });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(Messages { messages: Vec::new() });
            }
            let tick = (tokio::time::Instant::now() + POLL_TICK).min(deadline);
            tokio::select! {
                () = &mut waiter => {}
                () = tokio::time::sleep_until(tick) => {}
            }
        }
    }

    /// Deletes the messages `entries` hold receipts for, in one command.
    async fn delete(&self, name: &str, entries: Vec<ReceiptEntry>) -> Result<Outcomes<()>, SqsError> {
        let checked: Checked<String> = entries
            .into_iter()
            .map(|e| {
                let receipt = requests::required(&e.receipt_handle, "ReceiptHandle").map(str::to_owned);
                (e.id, receipt)
            })
            .collect();
        let receipts = checked.iter().filter_map(|(_, r)| r.clone().ok()).collect();
        let op = Op::Delete {
            queue: name.to_owned(),
            receipts,
        };
        self.each(op, checked).await
    }

    /// Runs `op`, made of the entries of `checked` that passed their checks,
    /// and answers each entry: refused by its check, or what `op` did with it.
    async fn each<T>(&self, op: Op, checked: Checked<T>) -> Result<Outcomes<()>, SqsError> {
        let Reply::Each(done) = self.execute(op).await? else {
            return Err(unexpected());
        };
        let mut done = done.into_iter();
        Ok(checked
            .into_iter()
            .map(|(id, c)| (id, c.and_then(|_| done.next().unwrap_or_else(|| Err(unexpected())))))
            .collect())
    }

    pub(super) async fn delete_message(&self, name: &str, entry: ReceiptEntry) -> Result<Empty, SqsError> {
        single(self.delete(name, vec![entry]).await?)?;
        Ok(Empty {})
    }

    pub(super) async fn delete_message_batch(
        &self,
        name: &str,
        entries: Vec<ReceiptEntry>,
    ) -> Result<Batch<EntryId>, SqsError> {
        let outcomes = self.delete(name, entries).await?;
        Ok(Batch::of(outcomes, |id, ()| EntryId { id }))
    }

    /// Changes the visibility of the messages `entries` hold receipts for,
    /// in one command.
    async fn change(&self, name: &str, entries: Vec<VisibilityEntry>) -> Result<Outcomes<()>, SqsError> {
        let checked: Checked<(String, u64)> = entries
            .into_iter()
            .map(|e| {
                let change = requests::required(&e.receipt_handle, "ReceiptHandle").and_then(|handle| {
                    let Int(timeout) = e.visibility_timeout.ok_or_else(|| {
                        SqsError::missing_parameter("The request must contain the parameter VisibilityTimeout.")
                    })?;
                    Ok((handle.to_owned(), timeout))
                });
                (e.id, change)
            })
            .collect();
        let changes = checked.iter().filter_map(|(_, c)| c.clone().ok()).collect();
        let op = Op::ChangeVisibility {
            queue: name.to_owned(),
            changes,
        };
        self.each(op, checked).await
    }

    pub(super) async fn change_visibility(&self, name: &str, entry: VisibilityEntry) -> Result<Empty, SqsError> {
        single(self.change(name, vec![entry]).await?)?;
        Ok(Empty {})
    }

    pub(super) async fn change_visibility_batch(
        &self,
        name: &str,
        entries: Vec<VisibilityEntry>,
    ) -> Result<Batch<EntryId>, SqsError> {
        let outcomes = self.change(name, entries).await?;
        Ok(Batch::of(outcomes, |id, ()| EntryId { id }))
    }
}
