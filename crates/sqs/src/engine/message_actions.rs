//! Actions on messages: send, receive (with long polling and dead-letter
//! moves), delete and change visibility, each journaled around the queue's
//! state machine.

use std::time::Duration;

use super::journal::{Change, Pending};
use super::message::{attributes_size, parse_attributes};
use super::queue::{Put, Queue, Taken};
use super::requests::{
    self, Int, MAX_VISIBILITY_SECONDS, MAX_WAIT_SECONDS, Peek, ReceiptEntry, ReceiveMessage, SendEntry, VisibilityEntry,
};
use super::responses::{
    Batch, Empty, EntryId, Messages, Outcomes, Peeked, PeekedMessage, ReceivedMessage, Selection, SendResult, single,
};
use super::{Engine, now_ms};
use crate::engine::attributes::MAX_MESSAGE_SIZE;
use crate::error::SqsError;

/// How often a long poll re-checks for messages whose delay or visibility
/// timeout ended (sends wake it at once).
const POLL_TICK: Duration = Duration::from_millis(100);

/// What one receive attempt took and journaled.
struct Received {
    messages: Vec<ReceivedMessage>,
    incarnation: u64,
    taken: Taken,
    /// The dead-letter queue (name, incarnation) and what it receives.
    dead_letters: Option<((String, u64), Vec<Put>)>,
    pending: Option<Pending>,
}

impl Engine {
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
                if let Some(q) = self.lock().incarnation_mut(name, incarnation) {
                    q.forget_dedup(&puts);
                }
                Err(e)
            }
        }
    }

    /// Sends `entries` in one commit; each entry succeeds or fails alone.
    async fn send(&self, name: &str, entries: Vec<SendEntry>) -> Result<Outcomes<SendResult>, SqsError> {
        let mut outcomes = Vec::with_capacity(entries.len());
        let mut puts = Vec::new();
        let (incarnation, pending) = {
            let mut state = self.lock();
            let now = now_ms();
            let incarnation = state.queue(name)?.incarnation;
            for entry in entries {
                let seq = state.next_seq;
                let outcome = state.queue_mut(name)?.send(&entry, seq, now).map(|mut sent| {
                    if let Some(put) = sent.put.take() {
                        puts.push(put);
                    }
                    SendResult::new(&sent)
                });
                if puts.last().is_some_and(|p| p.seq == seq) {
                    state.next_seq += 1;
                }
                outcomes.push((entry.id, outcome));
            }
            (incarnation, self.submit_puts(name, &puts))
        };
        self.commit_puts(name, incarnation, puts, pending).await?;
        Ok(outcomes)
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

    /// The messages of `q` that `held` names by sequence, with their receipts,
    /// as a receive answers them.
    fn answered<'a>(
        &self,
        q: &Queue,
        held: impl Iterator<Item = (&'a u64, &'a String)>,
        selection: &Selection,
    ) -> Vec<ReceivedMessage> {
        held.filter_map(|(seq, receipt)| {
            let m = q.messages.get(seq)?;
            Some(ReceivedMessage::new(
                m,
                receipt.clone(),
                &self.config.account_id,
                selection,
            ))
        })
        .collect()
    }

    /// One receive attempt: takes up to `max` visible messages (at once, so
    /// no other receive takes them) and journals expiries and dead-letter
    /// moves before the lock is released.
    fn try_receive(
        &self,
        name: &str,
        max: usize,
        visibility_ms: u64,
        selection: &Selection,
        attempt: Option<&str>,
    ) -> Result<Received, SqsError> {
        let mut state = self.lock();
        let now = now_ms();
        // A retried FIFO receive with the same attempt id gets the same
        // messages and receipts while none of them changed.
        let q = state.queue_mut(name)?;
        if let Some(held) = attempt.and_then(|id| q.replay_attempt(id, now)) {
            return Ok(Received {
                messages: self.answered(q, held.iter().map(|(seq, r)| (seq, r)), selection),
                incarnation: q.incarnation,
                taken: Taken::default(),
                dead_letters: None,
                pending: None,
            });
        }
        let (policy, incarnation) = {
            let q = state.queue(name)?;
            (q.meta.attributes.redrive_policy(), q.incarnation)
        };
        let dlq = policy
            .as_ref()
            .and_then(|p| p.dead_letter_target_arn.rsplit(':').next())
            .filter(|n| *n != name)
            .and_then(|n| state.queue(n).ok().map(|q| (n.to_owned(), q.incarnation)));
        let max_receive_count = dlq.as_ref().and(policy.as_ref()).map(|p| p.max_receive_count);
        let q = state.queue_mut(name)?;
        let mut changes: Vec<Change> = q
            .expire(now)
            .into_iter()
            .map(|seq| Change::DeleteMessage {
                queue: name.to_owned(),
                seq,
            })
            .collect();
        let taken = q.receive(max, visibility_ms, max_receive_count, now);
        if let Some(id) = attempt {
            q.record_attempt(id, &taken, now);
        }
        let messages = self.answered(q, taken.received.iter().map(|(seq, r, _)| (seq, r)), selection);
        let mut dead_letters = Vec::new();
        if let Some((dlq_name, _)) = &dlq {
            for (old_seq, m) in &taken.dead_letters {
                let mut stored = m.stored.clone();
                stored.receive_count = m.receive_count;
                stored.visible_at_ms = now;
                stored.dead_letter_source_arn = Some(self.queue_arn(name));
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
            dead_letters: dlq.map(|d| (d, dead_letters)),
            pending: self.submit(changes),
        })
    }

    /// Waits for a receive's changes to commit: then its dead letters reach
    /// their queue; if the commit fails, everything it took is put back.
    async fn finish_receive(&self, name: &str, received: Received) -> Result<Vec<ReceivedMessage>, SqsError> {
        let Received {
            messages,
            incarnation,
            taken,
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
                if let Some(q) = self.lock().incarnation_mut(name, incarnation) {
                    q.undo_receive(taken);
                }
                Err(e)
            }
        }
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
        loop {
            let waiter = notify.notified();
            tokio::pin!(waiter);
            waiter.as_mut().enable();
            let received = self.try_receive(name, max, visibility * 1000, &selection, attempt.as_deref())?;
            let messages = self.finish_receive(name, received).await?;
            if !messages.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(Messages { messages });
            }
            let tick = (tokio::time::Instant::now() + POLL_TICK).min(deadline);
            tokio::select! {
                () = &mut waiter => {}
                () = tokio::time::sleep_until(tick) => {}
            }
        }
    }

    /// Deletes the messages `entries` hold receipts for, in one commit.
    async fn delete(&self, name: &str, entries: Vec<ReceiptEntry>) -> Result<Outcomes<()>, SqsError> {
        let mut outcomes = Vec::with_capacity(entries.len());
        let mut seqs = Vec::new();
        let (incarnation, pending) = {
            let state = self.lock();
            let q = state.queue(name)?;
            for entry in entries {
                let held =
                    requests::required(&entry.receipt_handle, "ReceiptHandle").and_then(|h| q.held_by_receipt(h));
                outcomes.push((entry.id, held.map(|seq| seqs.extend(seq))));
            }
            let changes = seqs
                .iter()
                .map(|seq| Change::DeleteMessage {
                    queue: name.to_owned(),
                    seq: *seq,
                })
                .collect();
            (q.incarnation, self.submit(changes))
        };
        Self::committed(pending).await?;
        if let Some(q) = self.lock().incarnation_mut(name, incarnation) {
            for seq in seqs {
                q.messages.remove(&seq);
            }
        }
        Ok(outcomes)
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

    fn change_one(&self, name: &str, entry: &VisibilityEntry) -> Result<(), SqsError> {
        let handle = requests::required(&entry.receipt_handle, "ReceiptHandle")?;
        let Int(timeout) = entry
            .visibility_timeout
            .ok_or_else(|| SqsError::missing_parameter("The request must contain the parameter VisibilityTimeout."))?;
        self.with_queue(name, |q, now| q.change_visibility(handle, timeout, now))
    }

    pub(super) fn change_visibility(&self, name: &str, entry: &VisibilityEntry) -> Result<Empty, SqsError> {
        self.change_one(name, entry)?;
        Ok(Empty {})
    }

    pub(super) fn change_visibility_batch(
        &self,
        name: &str,
        entries: Vec<VisibilityEntry>,
    ) -> Result<Batch<EntryId>, SqsError> {
        let mut outcomes = Vec::with_capacity(entries.len());
        for entry in entries {
            match self.change_one(name, &entry) {
                Err(e) if e.shape == "QueueDoesNotExist" => return Err(e),
                outcome => outcomes.push((entry.id, outcome)),
            }
        }
        Ok(Batch::of(outcomes, |id, ()| EntryId { id }))
    }
}
