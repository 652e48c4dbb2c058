//! Dead-letter queue redrive: StartMessageMoveTask, ListMessageMoveTasks,
//! CancelMessageMoveTask. A task moves the dead-letter queue's messages that
//! are not in flight, in one journaled step, to the given destination or
//! back to the queue each came from; so it has finished by the time it is
//! answered, and cancelling it finds nothing running (sless differs from
//! SQS, which moves at a rate, here; see the README).

use std::collections::BTreeMap;

use super::journal::Change;
use super::queue::{Message, Put};
use super::requests::{self, CancelMessageMoveTask, Int, ListMessageMoveTasks, StartMessageMoveTask};
use super::responses::{Empty, MoveTaskResult, MoveTasks, TaskHandle};
use super::{Engine, State, now_ms};
use crate::error::SqsError;

/// Tasks kept per source queue for ListMessageMoveTasks.
const KEPT_TASKS: usize = 10;
const MAX_RATE: u64 = 500;

/// One finished move task.
#[derive(Debug, Clone)]
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

impl Engine {
    /// The name of this engine's existing queue `arn`.
    fn local_queue(&self, state: &State, arn: &str, parameter: &str) -> Result<String, SqsError> {
        self.queue_named_by(state, arn).map(str::to_owned).ok_or_else(|| {
            SqsError::resource_not_found(format!(
                "The resource that you specified for the {parameter} parameter doesn't exist."
            ))
        })
    }

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
        let (source, incarnation, moved, deliveries, pending, started_ms) = {
            let mut state = self.lock();
            let now = now_ms();
            let source = self.local_queue(&state, &source_arn, "SourceArn")?;
            let is_dead_letter_queue = state.queues.values().any(|q| {
                !q.deleting
                    && q.meta
                        .attributes
                        .redrive_policy()
                        .is_some_and(|p| p.dead_letter_target_arn == source_arn)
            });
            if !is_dead_letter_queue {
                return Err(SqsError::invalid_parameter_value(
                    "Source queue must be configured as a Dead Letter Queue.",
                ));
            }
            let destination = match &request.destination_arn {
                Some(arn) => Some(self.local_queue(&state, arn, "DestinationArn")?),
                None => None,
            };
            let q = state.queue_mut(&source)?;
            let incarnation = q.incarnation;
            let taken = q.take_movable(now);
            // Where each goes: the destination, or back where it came from.
            let mut moved: Vec<(u64, Message)> = Vec::new();
            let mut stays: Vec<(u64, Message)> = Vec::new();
            let mut changes = Vec::new();
            let mut deliveries: BTreeMap<String, (u64, Vec<Put>)> = BTreeMap::new();
            for (seq, m) in taken {
                let target = destination.clone().or_else(|| {
                    let arn = m.stored.dead_letter_source_arn.as_deref()?;
                    self.local_queue(&state, arn, "DestinationArn").ok()
                });
                let Some(target) = target.filter(|t| *t != source) else {
                    stays.push((seq, m));
                    continue;
                };
                let Ok(target_incarnation) = state.queue(&target).map(|q| q.incarnation) else {
                    stays.push((seq, m));
                    continue;
                };
                let mut stored = m.stored.clone();
                stored.receive_count = 0;
                stored.visible_at_ms = now;
                stored.dead_letter_source_arn = None;
                let new_seq = state.take_seq();
                changes.push(Change::DeleteMessage {
                    queue: source.clone(),
                    seq,
                });
                changes.push(Change::PutMessage {
                    queue: target.clone(),
                    seq: new_seq,
                    message: stored.clone(),
                });
                deliveries
                    .entry(target)
                    .or_insert_with(|| (target_incarnation, Vec::new()))
                    .1
                    .push(Put {
                        seq: new_seq,
                        message: stored,
                    });
                moved.push((seq, m));
            }
            if let Ok(q) = state.queue_mut(&source) {
                q.messages.extend(stays);
            }
            (source, incarnation, moved, deliveries, self.submit(changes), now)
        };
        let count = moved.len() as u64;
        match Self::committed(pending).await {
            Ok(()) => {
                for (target, (target_incarnation, puts)) in deliveries {
                    self.deliver(&target, target_incarnation, puts);
                }
            }
            Err(e) => {
                if let Some(q) = self.lock().incarnation_mut(&source, incarnation) {
                    q.messages.extend(moved);
                }
                return Err(e);
            }
        }
        let handle = sless_runtime::hex::encode(&sless_runtime::random::bytes::<16>());
        let mut state = self.lock();
        state.tasks.push(MoveTask {
            handle: handle.clone(),
            source_arn: source_arn.clone(),
            destination_arn: request.destination_arn,
            rate,
            moved: count,
            to_move: count,
            started_ms,
        });
        // Only the newest few per source are kept.
        let total = state.tasks.iter().filter(|t| t.source_arn == source_arn).count();
        let mut dropped = total.saturating_sub(KEPT_TASKS);
        state.tasks.retain(|t| {
            let drop = dropped > 0 && t.source_arn == source_arn;
            dropped -= usize::from(drop);
            !drop
        });
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
        let state = self.lock();
        self.local_queue(&state, source_arn, "SourceArn")?;
        let results = state
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
