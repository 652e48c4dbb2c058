//! An engine's state: its queues, as the commands applied so far left them.
//! [`Machine::apply`] is the one way it changes, and it is deterministic:
//! it reads no clock and draws nothing random (a command carries those), so
//! replaying a journal, or applying a replicated log on another copy, ends
//! in the same state with the same replies. Each kind of command is applied
//! beside its requests: queues in `queue_actions`, messages in
//! `message_actions`, move tasks in `move_tasks`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::command::{Command, Op, Reply};
use super::move_tasks::MoveTask;
use super::queue::{Message, MessageImage, Queue, QueueImage};
use super::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;

/// Whose queues these are: what their ARNs name.
#[derive(Debug, Clone)]
pub struct Identity {
    pub account_id: String,
    pub region: String,
}

impl Identity {
    pub fn queue_arn(&self, name: &str) -> String {
        format!("arn:aws:sqs:{}:{}:{name}", self.region, self.account_id)
    }
}

pub struct Machine {
    pub identity: Identity,
    pub queues: BTreeMap<String, Queue>,
    /// The next message's sequence: unique across the engine's queues.
    pub next_seq: u64,
    /// The latest time applied (ms).
    pub clock_ms: u64,
    /// When each queue was last deleted (ms): its name is not taken again
    /// for 60 s, as in SQS.
    pub deleted: BTreeMap<String, u64>,
    /// Finished message move tasks, for ListMessageMoveTasks.
    pub tasks: Vec<MoveTask>,
}

/// The machine as a snapshot keeps it, without its queues: the next
/// sequence, the clock, the deleted names and the move tasks.
pub type HeaderImage = (u64, u64, BTreeMap<String, u64>, Vec<MoveTask>);

pub fn no_such_queue() -> SqsError {
    SqsError::queue_does_not_exist("The specified queue does not exist.")
}

impl Machine {
    pub fn new(identity: Identity) -> Self {
        Self {
            identity,
            queues: BTreeMap::new(),
            next_seq: 1,
            clock_ms: 0,
            deleted: BTreeMap::new(),
            tasks: Vec::new(),
        }
    }

    /// A machine holding `queues` and `messages` (a journal of an earlier
    /// format, migrated).
    pub fn with(identity: Identity, queues: Vec<StoredQueue>, messages: Vec<(String, u64, StoredMessage)>) -> Self {
        let mut machine = Self::new(identity);
        for q in queues {
            machine.queues.insert(q.name.clone(), Queue::new(q));
        }
        for (queue, seq, stored) in messages {
            if let Some(q) = machine.queues.get_mut(&queue) {
                machine.next_seq = machine.next_seq.max(seq + 1);
                q.messages.insert(seq, Message::new(stored));
            }
        }
        machine
    }

    /// Applies one command. An error is the command's reply, as much as a
    /// success is: the state is as it was.
    pub fn apply(&mut self, command: Command) -> Result<Reply, SqsError> {
        self.clock_ms = self.clock_ms.max(command.now_ms);
        let now = self.clock_ms;
        match command.op {
            Op::CreateQueue { queue, given } => self.create_queue(queue, &given, now),
            Op::UpdateQueue { name, version, meta } => self.update_queue(&name, version, meta),
            Op::DeleteQueue { name } => self.delete_queue(&name, now),
            Op::PurgeQueue { name } => self.purge_queue(&name, now),
            Op::Send { queue, messages } => self.send(&queue, messages, now),
            Op::Receive {
                queue,
                max,
                visibility_ms,
                attempt,
                nonce,
            } => self.receive(&queue, max, visibility_ms, attempt.as_deref(), &nonce, now),
            Op::Delete { queue, receipts } => self.delete(&queue, &receipts),
            Op::ChangeVisibility { queue, changes } => self.change_visibility(&queue, &changes, now),
            Op::MoveMessages {
                source_arn,
                destination_arn,
                rate,
                handle,
            } => self.move_messages(source_arn, destination_arn, rate, handle, now),
        }
    }

    pub fn queue(&self, name: &str) -> Result<&Queue, SqsError> {
        self.queues.get(name).ok_or_else(no_such_queue)
    }

    pub fn queue_mut(&mut self, name: &str) -> Result<&mut Queue, SqsError> {
        self.queues.get_mut(name).ok_or_else(no_such_queue)
    }

    /// The name of this engine's existing queue whose ARN is `arn`.
    pub fn queue_named_by<'a>(&self, arn: &'a str) -> Option<&'a str> {
        let name = arn.rsplit(':').next()?;
        (arn == self.identity.queue_arn(name) && self.queues.contains_key(name)).then_some(name)
    }

    pub fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// What a snapshot keeps of it besides its queues ([`HeaderImage`], borrowed).
    pub fn header(&self) -> impl Serialize + '_ {
        (self.next_seq, self.clock_ms, &self.deleted, &self.tasks)
    }

    pub fn restore_header(&mut self, (next_seq, clock_ms, deleted, tasks): HeaderImage) {
        self.next_seq = next_seq;
        self.clock_ms = clock_ms;
        self.deleted = deleted;
        self.tasks = tasks;
    }

    pub fn restore_queue(&mut self, image: QueueImage) {
        let queue = Queue::from_image(image);
        self.queues.insert(queue.meta.name.clone(), queue);
    }

    /// Puts back message `seq` of queue `name`, which a snapshot restored before.
    pub fn restore_message(&mut self, name: &str, seq: u64, image: MessageImage) -> Result<(), String> {
        let q = self
            .queues
            .get_mut(name)
            .ok_or_else(|| format!("a message of queue {name}, which the snapshot does not hold"))?;
        q.messages.insert(seq, Message::from_image(image));
        Ok(())
    }
}

#[cfg(test)]
impl Identity {
    /// The identity tests give their machines.
    pub fn for_tests() -> Self {
        Self {
            account_id: "000000000000".into(),
            region: "r".into(),
        }
    }
}

#[cfg(test)]
impl Machine {
    /// Everything a snapshot keeps of it, as JSON lines: two machines with
    /// the same image are the same state.
    pub fn image(&self) -> String {
        let mut image = vec![serde_json::to_string(&self.header()).expect("a header encodes")];
        for q in self.queues.values() {
            image.push(serde_json::to_string(&q.image()).expect("a queue encodes"));
            image.extend(q.messages.iter().map(|(seq, m)| {
                format!(
                    "{seq} {}",
                    serde_json::to_string(&m.image()).expect("a message encodes")
                )
            }));
        }
        image.join("\n")
    }
}
