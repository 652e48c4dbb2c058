//! Dead-letter queue redrive: StartMessageMoveTask, ListMessageMoveTasks,
//! CancelMessageMoveTask. A task moves the dead-letter queue's messages that
//! are not in flight, in one journaled step, to the given destination or
//! back to the queue each came from; so it has finished by the time it is
//! answered, and cancelling it finds nothing running (sless differs from
//! SQS, which moves at a rate, here; see the README).

use serde::{Deserialize, Serialize};

use super::Engine;
use super::command::{Op, Reply};
use super::machine::Machine;
use super::queue::Message;
use super::requests::{self, CancelMessageMoveTask, Int, ListMessageMoveTasks, StartMessageMoveTask};
use super::responses::{Empty, MoveTaskResult, MoveTasks, TaskHandle};
use crate::error::SqsError;

/// Tasks kept per source queue for ListMessageMoveTasks.
const KEPT_TASKS: usize = 10;
const MAX_RATE: u64 = 500;

/// One finished move task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MoveTask {
    pub handle: String,
    pub source_arn: String,
    pub destination_arn: Option<String>,
    pub rate: Option<u64>,
    pub moved: u64,
    pub to_move: u64,
    pub started_ms: u64,
}

impl MoveTask {
    /// The task as ListMessageMoveTasks shows it: every task has finished.
    fn finished(&self) -> MoveTaskResult {
        MoveTaskResult {
            status: "COMPLETED",
            source_arn: self.source_arn.clone(),
            destination_arn: self.destination_arn.clone(),
            max_number_of_messages_per_second: self.rate,
            approximate_number_of_messages_moved: self.moved,
            approximate_number_of_messages_to_move: self.to_move,
            started_timestamp: self.started_ms,
        }
    }
}

impl Machine {
    /// The name of this engine's existing queue `arn`.
    fn local_queue(&self, arn: &str, parameter: &str) -> Result<String, SqsError> {
        self.queue_named_by(arn).map(str::to_owned).ok_or_else(|| {
            SqsError::resource_not_found(format!(
                "The resource that you specified for the {parameter} parameter doesn't exist."
            ))
        })
    }

    /// Moves every message of dead-letter queue `source_arn` that is not in
    /// flight to `destination_arn`, or back where it came from.
    pub(super) fn move_messages(
        &mut self,
        source_arn: String,
        destination_arn: Option<String>,
        rate: Option<u64>,
        handle: String,
        now: u64,
    ) -> Result<Reply, SqsError> {
        let source = self.local_queue(&source_arn, "SourceArn")?;
        let is_dead_letter_queue = self.queues.values().any(|q| {
            q.meta
                .attributes
                .redrive_policy()
                .is_some_and(|p| p.dead_letter_target_arn == source_arn)
        });
        if !is_dead_letter_queue {
            return Err(SqsError::invalid_parameter_value(
                "Source queue must be configured as a Dead Letter Queue.",
            ));
        }
        let destination = match &destination_arn {
            Some(arn) => Some(self.local_queue(arn, "DestinationArn")?),
            None => None,
        };
        let taken = self.queue_mut(&source)?.take_movable(now);
        let mut moved = 0;
        for (seq, m) in taken {
            // Where it goes: the destination, or back where it came from.
            let target = destination
                .clone()
                .or_else(|| {
                    self.queue_named_by(m.stored.dead_letter_source_arn.as_deref()?)
                        .map(str::to_owned)
                })
                .filter(|t| *t != source);
            let Some(target) = target else {
                self.queue_mut(&source)?.messages.insert(seq, m);
                continue;
            };
            let mut stored = m.stored;
            stored.receive_count = 0;
            stored.visible_at_ms = now;
            stored.dead_letter_source_arn = None;
            let new_seq = self.take_seq();
            self.queue_mut(&target)?.insert(new_seq, Message::new(stored));
            moved += 1;
        }
        self.tasks.push(MoveTask {
            handle,
            source_arn: source_arn.clone(),
            destination_arn,
            rate,
            moved,
            to_move: moved,
            started_ms: now,
        });
        // Only the newest few per source are kept.
        let total = self.tasks.iter().filter(|t| t.source_arn == source_arn).count();
        let mut dropped = total.saturating_sub(KEPT_TASKS);
        self.tasks.retain(|t| {
            let drop = dropped > 0 && t.source_arn == source_arn;
            dropped -= usize::from(drop);
            !drop
        });
        Ok(Reply::Done)
    }
}

impl Engine {
    pub(super) async fn start_message_move_task(&self, request: StartMessageMoveTask) -> Result<TaskHandle, SqsError> {
        let source_arn = requests::required(&request.source_arn, "SourceArn")?.to_owned();
        let rate = requests::bounded(
            request.max_number_of_messages_per_second,
            "MaxNumberOfMessagesPerSecond",
            MAX_RATE,
        )?;
        if rate == Some(0) {
            return Err(SqsError::invalid_parameter_value(format!(
                "Value 0 for parameter MaxNumberOfMessagesPerSecond is invalid. Reason: must be between 1 and {MAX_RATE}."
            )));
        }
        let handle = sless_runtime::hex::encode(&sless_runtime::random::bytes::<16>());
        self.execute(Op::MoveMessages {
            source_arn,
            destination_arn: request.destination_arn,
            rate,
            handle: handle.clone(),
        })
        .await?;
        Ok(TaskHandle { task_handle: handle })
    }

    pub(super) fn list_message_move_tasks(&self, request: &ListMessageMoveTasks) -> Result<MoveTasks, SqsError> {
        let source_arn = requests::required(&request.source_arn, "SourceArn")?;
        let max = match request.max_results {
            None => 1,
            Some(Int(n @ 1..=10)) => n as usize,
            Some(Int(n)) => {
                return Err(SqsError::invalid_parameter_value(format!(
                    "Value {n} for parameter MaxResults is invalid. Reason: must be between 1 and 10."
                )));
            }
        };
        let machine = self.lock();
        machine.local_queue(source_arn, "SourceArn")?;
        let results = machine
            .tasks
            .iter()
            .rev()
            .filter(|t| t.source_arn == source_arn)
            .take(max)
            .map(MoveTask::finished)
            .collect();
        Ok(MoveTasks { results })
    }

    /// Every task has finished by the time it is answered: none to cancel.
    pub(super) fn cancel_message_move_task(&self, request: &CancelMessageMoveTask) -> Result<Empty, SqsError> {
        let handle = requests::required(&request.task_handle, "TaskHandle")?;
        let known = self.lock().tasks.iter().any(|t| t.handle == handle);
        Err(SqsError::resource_not_found(if known {
            "The task has already completed.".to_owned()
        } else {
            format!("Task {handle} does not exist.")
        }))
    }
}
