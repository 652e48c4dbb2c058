//! A Jepsen-style history of SQS operations and its checker. Clients
//! record each operation's invocation, completion and outcome (ok, failed,
//! unknown); [`check`] reads the history afterwards and names every
//! violation of what a queue service promises:
//!
//! - every acknowledged send is delivered (the run ends by draining every
//!   queue, so "still in the queue" counts as delivered);
//! - nothing is delivered that was not sent, or whose send definitely
//!   failed;
//! - a message is stored once per send: deliveries of one send carry one
//!   message id, the one its acknowledgement gave (a FIFO send retried
//!   with its deduplication id is one send);
//! - nothing is delivered after its deletion was acknowledged with the
//!   receipt of its latest delivery;
//! - an acknowledged receive hides what it delivered for the visibility
//!   timeout: no other receive gets the message before (a receive is a
//!   write, and a failover must not lose it);
//! - a FIFO group's messages are first delivered in the order they were
//!   sent, without gaps.
//!
//! Standard queues may deliver a message again while it is not deleted
//! (SQS's at-least-once); so may FIFO queues after a visibility timeout.
//! Both are allowed; a second copy of one send is not.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Time since the run began, on the clients' clock.
pub type At = Duration;

/// What a client learnt of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged.
    Ok,
    /// Refused before it could take effect (for instance by a replica that
    /// is not the leader).
    Failed,
    /// It may or may not have taken effect: a timeout, a lost connection,
    /// a server error.
    Unknown,
}

/// A message's place in a FIFO queue: its group and its number there. A
/// group's producer sends number n+1 only once n was acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fifo {
    pub group: String,
    pub seq: u64,
}

/// One attempt to send `body`, unique within its queue across sends
/// (attempts of one FIFO send share it and its deduplication id).
#[derive(Clone, Debug)]
pub struct Send {
    pub queue: String,
    pub body: String,
    pub fifo: Option<Fifo>,
    pub invoked: At,
    pub completed: At,
    pub outcome: Outcome,
    /// The message id an acknowledgement gave.
    pub message_id: Option<String>,
}

/// One message in the answer of an acknowledged receive.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub queue: String,
    pub body: String,
    pub message_id: String,
    pub receipt: String,
    /// When the receive was invoked, and when its answer came.
    pub invoked: At,
    pub completed: At,
}

/// One attempt to delete the message of `receipt`.
#[derive(Clone, Debug)]
pub struct Delete {
    pub queue: String,
    pub receipt: String,
    pub completed: At,
    pub outcome: Outcome,
}

/// Everything the clients did. Deliveries are in the order the clients
/// received them; a queue's consumer is sequential where order is checked.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub sends: Vec<Send>,
    pub deliveries: Vec<Delivery>,
    pub deletes: Vec<Delete>,
}

/// A broken promise, with what shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    Lost {
        queue: String,
        body: String,
    },
    NeverSent {
        queue: String,
        body: String,
    },
    FailedButDelivered {
        queue: String,
        body: String,
    },
    StoredTwice {
        queue: String,
        body: String,
        ids: Vec<String>,
    },
    OtherId {
        queue: String,
        body: String,
        acknowledged: String,
        delivered: String,
    },
    DeliveredAfterDelete {
        queue: String,
        body: String,
        deleted: At,
        received: At,
    },
    DeliveredWhileHidden {
        queue: String,
        body: String,
        hidden_at: At,
        received: At,
    },
    OutOfOrder {
        queue: String,
        group: String,
        expected: u64,
        delivered: u64,
    },
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub acknowledged: usize,
    pub unknown: usize,
    pub failed: usize,
    pub deliveries: usize,
    pub violations: Vec<Violation>,
}

impl Report {
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A receipt is certainly the latest of its message if the deletion with
/// it completed this long before the message could be visible again
/// (clock skew between the clients and the service, both on one host).
const MARGIN: Duration = Duration::from_secs(2);

/// Checks `history`, whose receives all used `visibility` as their
/// visibility timeout (and no visibility was changed).
pub fn check(history: &History, visibility: Duration) -> Report {
    let mut report = Report::default();
    let sends = sends_by_body(history, &mut report);
    let mut delivered: BTreeMap<(&str, &str), BTreeSet<&str>> = BTreeMap::new();
    for d in &history.deliveries {
        delivered.entry((&d.queue, &d.body)).or_default().insert(&d.message_id);
    }
    report.deliveries = history.deliveries.len();
    for (&(queue, body), attempts) in &sends {
        check_send(
            queue,
            body,
            attempts,
            delivered.get(&(queue, body)),
            &mut report.violations,
        );
    }
    for &(queue, body) in delivered.keys() {
        if !sends.contains_key(&(queue, body)) {
            report.violations.push(Violation::NeverSent {
                queue: queue.to_owned(),
                body: body.to_owned(),
            });
        }
    }
    deleted_then_delivered(history, visibility, &mut report.violations);
    delivered_while_hidden(history, visibility, &mut report.violations);
    fifo_order(history, &sends, &mut report.violations);
    report
}

type Sends<'h> = BTreeMap<(&'h str, &'h str), Vec<&'h Send>>;

fn sends_by_body<'h>(history: &'h History, report: &mut Report) -> Sends<'h> {
    let mut sends: Sends<'h> = BTreeMap::new();
    for s in &history.sends {
        match s.outcome {
            Outcome::Ok => report.acknowledged += 1,
            Outcome::Failed => report.failed += 1,
            Outcome::Unknown => report.unknown += 1,
        }
        sends.entry((&s.queue, &s.body)).or_default().push(s);
    }
    sends
}

/// The promises about one send's (all its attempts') deliveries.
fn check_send(queue: &str, body: &str, attempts: &[&Send], ids: Option<&BTreeSet<&str>>, out: &mut Vec<Violation>) {
    let what = || (queue.to_owned(), body.to_owned());
    let acked: BTreeSet<&str> = attempts
        .iter()
        .filter(|s| s.outcome == Outcome::Ok)
        .filter_map(|s| s.message_id.as_deref())
        .collect();
    let may_have_stored = attempts.iter().filter(|s| s.outcome != Outcome::Failed).count();
    let fifo = attempts.iter().any(|s| s.fifo.is_some());
    let Some(ids) = ids else {
        if !acked.is_empty() {
            let (queue, body) = what();
            out.push(Violation::Lost { queue, body });
        }
        return;
    };
    if may_have_stored == 0 {
        let (queue, body) = what();
        out.push(Violation::FailedButDelivered { queue, body });
    }
    // A FIFO send, however often attempted, is one message; a standard
    // one is a message per attempt that may have been stored.
    let most = if fifo { 1 } else { may_have_stored.max(1) };
    if ids.len() > most || (fifo && acked.len() > 1) {
        let (queue, body) = what();
        out.push(Violation::StoredTwice {
            queue,
            body,
            ids: ids.iter().chain(&acked).map(|id| (*id).to_owned()).collect(),
        });
    }
    let unknown = attempts.iter().filter(|s| s.outcome == Outcome::Unknown).count();
    let strangers: Vec<&&str> = ids.difference(&acked).collect();
    if strangers.len() > if fifo { 0 } else { unknown } && !(fifo && acked.is_empty()) {
        let (queue, body) = what();
        out.push(Violation::OtherId {
            queue,
            body,
            acknowledged: acked.iter().next().copied().unwrap_or_default().to_owned(),
            delivered: strangers[0].to_string(),
        });
    }
}

/// A deletion acknowledged with a receipt that was certainly its
/// message's latest (it completed before the message could be visible
/// again) removed the message: no receive invoked after it gets it.
fn deleted_then_delivered(history: &History, visibility: Duration, out: &mut Vec<Violation>) {
    let by_receipt: BTreeMap<(&str, &str), &Delivery> = history
        .deliveries
        .iter()
        .map(|d| ((d.queue.as_str(), d.receipt.as_str()), d))
        .collect();
    let mut deleted: BTreeMap<(&str, &str), At> = BTreeMap::new();
    for delete in history.deletes.iter().filter(|d| d.outcome == Outcome::Ok) {
        let Some(delivery) = by_receipt.get(&(delete.queue.as_str(), delete.receipt.as_str())) else {
            continue;
        };
        if delete.completed + MARGIN < delivery.invoked + visibility {
            let at = deleted
                .entry((&delivery.queue, &delivery.message_id))
                .or_insert(delete.completed);
            *at = (*at).min(delete.completed);
        }
    }
    for d in &history.deliveries {
        if let Some(&at) = deleted.get(&(d.queue.as_str(), d.message_id.as_str()))
            && d.invoked > at
        {
            out.push(Violation::DeliveredAfterDelete {
                queue: d.queue.clone(),
                body: d.body.clone(),
                deleted: at,
                received: d.invoked,
            });
        }
    }
}

/// A receive invoked at `t` hid what it delivered until at least `t` plus
/// the visibility timeout: another receive that had its answer well
/// before then cannot have got the same message.
fn delivered_while_hidden(history: &History, visibility: Duration, out: &mut Vec<Violation>) {
    let mut by_message: BTreeMap<(&str, &str), Vec<&Delivery>> = BTreeMap::new();
    for d in &history.deliveries {
        by_message.entry((&d.queue, &d.message_id)).or_default().push(d);
    }
    for deliveries in by_message.values_mut() {
        deliveries.sort_by_key(|d| d.invoked);
        for (first, then) in deliveries.iter().zip(deliveries.iter().skip(1)) {
            if then.completed + MARGIN < first.invoked + visibility {
                out.push(Violation::DeliveredWhileHidden {
                    queue: then.queue.clone(),
                    body: then.body.clone(),
                    hidden_at: first.invoked,
                    received: then.invoked,
                });
            }
        }
    }
}

/// Each FIFO group's first deliveries come in the order of its sends,
/// with none left out: the next new number is always one more than the
/// highest so far (a number seen before is a redelivery).
fn fifo_order(history: &History, sends: &Sends<'_>, out: &mut Vec<Violation>) {
    let mut highest: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for d in &history.deliveries {
        let Some(fifo) = sends
            .get(&(d.queue.as_str(), d.body.as_str()))
            .and_then(|attempts| attempts[0].fifo.as_ref())
        else {
            continue;
        };
        let expected = highest
            .get(&(d.queue.as_str(), fifo.group.as_str()))
            .map_or(0, |h| h + 1);
        if fifo.seq > expected {
            out.push(Violation::OutOfOrder {
                queue: d.queue.clone(),
                group: fifo.group.clone(),
                expected,
                delivered: fifo.seq,
            });
        }
        if fifo.seq >= expected {
            highest.insert((&d.queue, &fifo.group), fifo.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> At {
        Duration::from_secs(secs)
    }

    fn send(body: &str, outcome: Outcome, id: Option<&str>) -> Send {
        Send {
            queue: "q".into(),
            body: body.into(),
            fifo: None,
            invoked: s(0),
            completed: s(1),
            outcome,
            message_id: id.map(Into::into),
        }
    }

    fn fifo_send(group: &str, seq: u64, id: &str) -> Send {
        Send {
            fifo: Some(Fifo {
                group: group.into(),
                seq,
            }),
            ..send(&format!("{group}:{seq}"), Outcome::Ok, Some(id))
        }
    }

    fn delivery(body: &str, id: &str, receipt: &str, invoked: u64) -> Delivery {
        Delivery {
            queue: "q".into(),
            body: body.into(),
            message_id: id.into(),
            receipt: receipt.into(),
            invoked: s(invoked),
            completed: s(invoked + 1),
        }
    }

    fn delete(receipt: &str, completed: u64) -> Delete {
        Delete {
            queue: "q".into(),
            receipt: receipt.into(),
            completed: s(completed),
            outcome: Outcome::Ok,
        }
    }

    fn violations(history: &History) -> Vec<Violation> {
        check(history, s(30)).violations
    }

    #[test]
    fn a_clean_history_passes() {
        let history = History {
            sends: vec![
                send("a", Outcome::Ok, Some("1")),
                send("b", Outcome::Unknown, None),
                send("c", Outcome::Failed, None),
            ],
            // "a" delivered twice before its deletion (at-least-once), "b"
            // stored although its answer was lost.
            deliveries: vec![
                delivery("a", "1", "r1", 2),
                delivery("a", "1", "r2", 40),
                delivery("b", "2", "r3", 41),
            ],
            deletes: vec![delete("r2", 42)],
        };
        let report = check(&history, s(30));
        assert_eq!(report.violations, vec![]);
        assert_eq!((report.acknowledged, report.unknown, report.failed), (1, 1, 1));
    }

    #[test]
    fn an_acknowledged_send_never_delivered_is_lost() {
        let history = History {
            sends: vec![send("a", Outcome::Ok, Some("1")), send("b", Outcome::Unknown, None)],
            ..History::default()
        };
        assert_eq!(
            violations(&history),
            vec![Violation::Lost {
                queue: "q".into(),
                body: "a".into()
            }]
        );
    }

    #[test]
    fn deliveries_of_what_was_not_sent_or_was_refused_are_caught() {
        let history = History {
            sends: vec![send("c", Outcome::Failed, None)],
            deliveries: vec![delivery("c", "1", "r1", 2), delivery("x", "2", "r2", 2)],
            ..History::default()
        };
        let v = violations(&history);
        assert!(v.contains(&Violation::FailedButDelivered {
            queue: "q".into(),
            body: "c".into()
        }));
        assert!(v.contains(&Violation::NeverSent {
            queue: "q".into(),
            body: "x".into()
        }));
    }

    #[test]
    fn one_send_stored_twice_or_under_another_id_is_caught() {
        let history = History {
            sends: vec![send("a", Outcome::Ok, Some("1")), send("b", Outcome::Ok, Some("2"))],
            deliveries: vec![
                delivery("a", "1", "r1", 2),
                delivery("a", "9", "r2", 3),
                delivery("b", "8", "r3", 3),
            ],
            ..History::default()
        };
        let v = violations(&history);
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::StoredTwice { body, .. } if body == "a"))
        );
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::OtherId { body, .. } if body == "b"))
        );
    }

    #[test]
    fn a_delivery_after_an_acknowledged_delete_is_caught_unless_the_receipt_may_have_been_stale() {
        let mut history = History {
            sends: vec![send("a", Outcome::Ok, Some("1"))],
            // Received again once r1's visibility timeout (30 s) was over.
            deliveries: vec![delivery("a", "1", "r1", 2), delivery("a", "1", "r2", 40)],
            deletes: vec![delete("r1", 3)],
        };
        assert!(matches!(
            violations(&history)[..],
            [Violation::DeliveredAfterDelete { .. }]
        ));
        // Deleted after the message could have been received again: r1
        // may have been stale, and SQS then need not delete.
        history.deletes = vec![delete("r1", 31)];
        assert_eq!(violations(&history), vec![]);
        // A deletion that was not acknowledged deletes nothing for sure.
        history.deletes = vec![Delete {
            outcome: Outcome::Unknown,
            ..delete("r1", 3)
        }];
        assert_eq!(violations(&history), vec![]);
    }

    #[test]
    fn a_message_received_again_within_its_visibility_timeout_is_caught() {
        let mut history = History {
            sends: vec![send("a", Outcome::Ok, Some("1"))],
            deliveries: vec![delivery("a", "1", "r1", 2), delivery("a", "1", "r2", 10)],
            ..History::default()
        };
        assert!(matches!(
            violations(&history)[..],
            [Violation::DeliveredWhileHidden { .. }]
        ));
        // Once the first receive's visibility timeout (30 s) may be over.
        history.deliveries[1] = delivery("a", "1", "r2", 40);
        assert_eq!(violations(&history), vec![]);
    }

    #[test]
    fn fifo_gaps_reorders_and_second_copies_are_caught() {
        let sends = vec![fifo_send("g", 0, "a"), fifo_send("g", 1, "b"), fifo_send("g", 2, "c")];
        let clean = History {
            sends: sends.clone(),
            deliveries: vec![
                delivery("g:0", "a", "r1", 1),
                delivery("g:1", "b", "r2", 1),
                // Redelivered after its visibility timeout, then on.
                delivery("g:1", "b", "r3", 40),
                delivery("g:2", "c", "r4", 40),
            ],
            ..History::default()
        };
        assert_eq!(violations(&clean), vec![]);
        let gap = History {
            sends: sends.clone(),
            deliveries: vec![
                delivery("g:0", "a", "r1", 1),
                delivery("g:2", "c", "r2", 1),
                delivery("g:1", "b", "r3", 1),
            ],
            ..History::default()
        };
        assert_eq!(
            violations(&gap),
            vec![Violation::OutOfOrder {
                queue: "q".into(),
                group: "g".into(),
                expected: 1,
                delivered: 2
            }]
        );
        // A retried send (one deduplication id) stored twice.
        let mut twice = clean.clone();
        twice.sends.push(Send {
            outcome: Outcome::Unknown,
            message_id: None,
            ..fifo_send("g", 2, "")
        });
        twice.deliveries.push(delivery("g:2", "d", "r5", 41));
        assert!(
            violations(&twice)
                .iter()
                .any(|v| matches!(v, Violation::StoredTwice { body, .. } if body == "g:2"))
        );
    }
}
