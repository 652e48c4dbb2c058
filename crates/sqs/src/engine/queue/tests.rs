//! The queue state machine's rules, with the time given by hand.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::engine::attributes::QueueAttributes;
use crate::engine::requests::SendEntry;

const SECOND: u64 = 1000;

fn queue(fifo: bool, attributes: &[(&str, &str)]) -> Queue {
    let given: BTreeMap<String, String> = attributes
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let mut attrs = QueueAttributes::default();
    attrs.apply(&given, true, fifo).expect("valid attributes");
    let meta = StoredQueue {
        name: if fifo { "q.fifo" } else { "q" }.into(),
        fifo,
        attributes: attrs,
        tags: BTreeMap::new(),
        created_s: 0,
        modified_s: 0,
    };
    Queue::new(meta)
}

fn entry(fields: serde_json::Value) -> SendEntry {
    serde_json::from_value(fields).expect("a send entry")
}

/// Prepares a message of `fields` at `now` and sends it as sequence `seq`,
/// as a command would.
fn send(q: &mut Queue, seq: u64, fields: serde_json::Value, now: u64) -> Result<Accepted, SqsError> {
    let prepared = q.prepare(&entry(fields), format!("id-{seq}"), now)?;
    Ok(q.accept(prepared.message, seq, now))
}

fn bodies(q: &Queue, taken: &Taken) -> Vec<String> {
    taken
        .received
        .iter()
        .map(|(seq, ..)| q.messages[seq].stored.body.clone())
        .collect()
}

fn receive(q: &mut Queue, max: usize, visibility_s: u64, now: u64) -> (Vec<String>, Vec<String>) {
    let taken = q.receive(max, visibility_s * SECOND, None, now, &format!("nonce{now}"));
    let receipts = taken.received.iter().map(|(_, r)| r.clone()).collect();
    (bodies(q, &taken), receipts)
}

#[test]
fn a_received_message_is_hidden_for_its_visibility_timeout() {
    let mut q = queue(false, &[]);
    send(&mut q, 1, json!({"MessageBody": "a"}), 0).unwrap();
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["a"]);
    assert!(receive(&mut q, 10, 30, 29_999).0.is_empty());
    assert_eq!(
        q.counts(29_999),
        Counts {
            visible: 0,
            in_flight: 1,
            delayed: 0
        }
    );
    let (again, _) = receive(&mut q, 10, 30, 30 * SECOND);
    assert_eq!(again, ["a"]);
    assert_eq!(q.messages[&1].receive_count, 2);
}

#[test]
fn changing_visibility_needs_the_current_receipt_and_stays_within_12_hours() {
    let mut q = queue(false, &[]);
    send(&mut q, 1, json!({"MessageBody": "a"}), 0).unwrap();
    let (_, first) = receive(&mut q, 1, 30, 0);
    q.change_visibility(&first[0], 0, SECOND).unwrap();
    assert_eq!(q.counts(SECOND).visible, 1);
    // Visible again: no longer in flight, so its receipt changes nothing.
    let e = q.change_visibility(&first[0], 60, SECOND).unwrap_err();
    assert_eq!(e.shape, "MessageNotInflight");
    let (_, second) = receive(&mut q, 1, 30, SECOND);
    let e = q.change_visibility(&first[0], 60, 2 * SECOND).unwrap_err();
    assert_eq!(e.shape, "MessageNotInflight", "a superseded receipt");
    q.change_visibility(&second[0], 43_200, SECOND).unwrap();
    let e = q.change_visibility(&second[0], 43_200, 3 * SECOND).unwrap_err();
    assert!(e.message.contains("43200"), "{}", e.message);
    assert_eq!(
        q.change_visibility("garbage", 1, 0).unwrap_err().shape,
        "ReceiptHandleIsInvalid"
    );
    assert_eq!(
        q.change_visibility(&second[0], 43_201, 0).unwrap_err().shape,
        "InvalidParameterValueException"
    );
}

#[test]
fn a_delayed_message_is_receivable_only_after_its_delay() {
    let mut q = queue(false, &[("DelaySeconds", "2")]);
    send(&mut q, 1, json!({"MessageBody": "queue delay"}), 0).unwrap();
    send(&mut q, 2, json!({"MessageBody": "own delay", "DelaySeconds": 5}), 0).unwrap();
    send(&mut q, 3, json!({"MessageBody": "no delay", "DelaySeconds": 0}), 0).unwrap();
    assert_eq!(
        q.counts(0),
        Counts {
            visible: 1,
            in_flight: 0,
            delayed: 2
        }
    );
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["no delay"]);
    assert!(receive(&mut q, 10, 30, 2 * SECOND - 1).0.is_empty());
    assert_eq!(receive(&mut q, 10, 30, 2 * SECOND).0, ["queue delay"]);
    assert!(receive(&mut q, 10, 30, 5 * SECOND - 1).0.is_empty());
    assert_eq!(receive(&mut q, 10, 30, 5 * SECOND).0, ["own delay"]);
    let e = send(&mut q, 4, json!({"MessageBody": "x", "DelaySeconds": 901}), 0)
        .err()
        .unwrap();
    assert!(e.message.contains("DelaySeconds"), "{}", e.message);
}

#[test]
fn a_fifo_group_yields_nothing_behind_a_message_in_flight() {
    let mut q = queue(true, &[]);
    for (seq, (group, body)) in [("g1", "a"), ("g1", "b"), ("g2", "c")].into_iter().enumerate() {
        let fields = json!({"MessageBody": body, "MessageGroupId": group, "MessageDeduplicationId": body});
        send(&mut q, seq as u64 + 1, fields, 0).unwrap();
    }
    let (first, receipts) = receive(&mut q, 1, 30, 0);
    assert_eq!(first, ["a"]);
    // g1 is blocked behind "a"; g2 is not.
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["c"]);
    assert!(receive(&mut q, 10, 30, 0).0.is_empty());
    let seq = q.held_by_receipt(&receipts[0]).unwrap().unwrap();
    q.messages.remove(&seq);
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["b"]);
}

#[test]
fn a_fifo_receive_takes_a_group_in_order() {
    let mut q = queue(true, &[("ContentBasedDeduplication", "true")]);
    for (seq, body) in ["1", "2", "3"].into_iter().enumerate() {
        send(
            &mut q,
            seq as u64 + 1,
            json!({"MessageBody": body, "MessageGroupId": "g"}),
            0,
        )
        .unwrap();
    }
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["1", "2", "3"]);
}

#[test]
fn fifo_rules_for_sends() {
    let mut q = queue(true, &[]);
    let e = send(&mut q, 1, json!({"MessageBody": "a", "MessageDeduplicationId": "d"}), 0)
        .err()
        .unwrap();
    assert_eq!(e.shape, "MissingParameter");
    let e = send(&mut q, 1, json!({"MessageBody": "a", "MessageGroupId": "g"}), 0)
        .err()
        .unwrap();
    assert!(e.message.contains("ContentBasedDeduplication"), "{}", e.message);
    let fields = json!({"MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d", "DelaySeconds": 1});
    assert!(
        send(&mut q, 1, fields, 0).is_err(),
        "no per-message delay in a FIFO queue"
    );
    let mut standard = queue(false, &[]);
    let e = send(
        &mut standard,
        1,
        json!({"MessageBody": "a", "MessageDeduplicationId": "d"}),
        0,
    )
    .err()
    .unwrap();
    assert!(e.message.contains("MessageDeduplicationId"), "{}", e.message);
}

#[test]
fn a_duplicate_within_five_minutes_is_acknowledged_not_enqueued() {
    let mut q = queue(true, &[]);
    let fields = json!({"MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d"});
    let first = send(&mut q, 1, fields.clone(), 0).unwrap();
    assert_eq!(first.sequence_number.as_deref(), Some("00000000000000000001"));
    let again = send(&mut q, 2, fields.clone(), 5 * 60 * SECOND - 1).unwrap();
    assert!(!again.enqueued);
    assert_eq!(again.message_id, first.message_id);
    assert_eq!(again.sequence_number, first.sequence_number);
    assert_eq!(q.messages.len(), 1);
    q.expire(5 * 60 * SECOND);
    let later = send(&mut q, 3, fields, 5 * 60 * SECOND).unwrap();
    assert!(later.enqueued, "the window has passed");
    assert_ne!(later.message_id, first.message_id);
}

#[test]
fn two_sends_prepared_alike_before_either_was_applied_enqueue_once() {
    let mut q = queue(true, &[]);
    let fields = json!({"MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d"});
    let one = q.prepare(&entry(fields.clone()), "one".into(), 0).unwrap();
    let two = q.prepare(&entry(fields), "two".into(), 0).unwrap();
    let first = q.accept(one.message, 1, 0);
    let second = q.accept(two.message, 2, 0);
    assert!(first.enqueued && !second.enqueued);
    assert_eq!(second.message_id, "one");
}

#[test]
fn a_message_received_too_often_is_taken_out_for_the_dead_letter_queue() {
    let mut q = queue(false, &[]);
    send(&mut q, 1, json!({"MessageBody": "poison"}), 0).unwrap();
    send(&mut q, 2, json!({"MessageBody": "fine"}), 0).unwrap();
    for round in 0..2 {
        let taken = q.receive(1, 0, Some(2), round, "n");
        assert_eq!(bodies(&q, &taken), ["poison"]);
        assert!(taken.dead_letters.is_empty());
    }
    let taken = q.receive(1, 0, Some(2), 5, "n");
    assert_eq!(bodies(&q, &taken), ["fine"]);
    let moved: Vec<u64> = taken.dead_letters.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(moved, [1]);
    assert_eq!(taken.dead_letters[0].1.receive_count, 2);
    assert!(!q.messages.contains_key(&1));
}

#[test]
fn messages_past_retention_expire() {
    let mut q = queue(false, &[("MessageRetentionPeriod", "60")]);
    send(&mut q, 1, json!({"MessageBody": "old"}), 0).unwrap();
    send(&mut q, 2, json!({"MessageBody": "new"}), 30 * SECOND).unwrap();
    assert!(q.expire(60 * SECOND - 1).is_empty());
    assert_eq!(q.expire(60 * SECOND), [1]);
    assert_eq!(receive(&mut q, 10, 30, 60 * SECOND).0, ["new"]);
}

#[test]
fn a_purge_drops_every_message_in_flight_or_not() {
    let mut q = queue(false, &[]);
    send(&mut q, 1, json!({"MessageBody": "in flight"}), 0).unwrap();
    send(&mut q, 2, json!({"MessageBody": "waiting"}), 0).unwrap();
    receive(&mut q, 1, 30, 0);
    q.purge();
    send(&mut q, 3, json!({"MessageBody": "after"}), 0).unwrap();
    assert_eq!(receive(&mut q, 10, 30, 0).0, ["after"]);
}

#[test]
fn size_and_body_rules() {
    let mut q = queue(false, &[("MaximumMessageSize", "1024")]);
    assert!(send(&mut q, 1, json!({"MessageBody": "x".repeat(1024)}), 0).is_ok());
    let e = send(&mut q, 2, json!({"MessageBody": "x".repeat(1025)}), 0)
        .err()
        .unwrap();
    assert!(e.message.contains("1024"), "{}", e.message);
    let attrs = json!({"a": {"DataType": "String", "StringValue": "x".repeat(1000)}});
    let e = send(
        &mut q,
        2,
        json!({"MessageBody": "x".repeat(100), "MessageAttributes": attrs}),
        0,
    )
    .err()
    .unwrap();
    assert!(
        e.message.contains("1024"),
        "attributes count against the size: {}",
        e.message
    );
    assert_eq!(send(&mut q, 2, json!({}), 0).err().unwrap().shape, "MissingParameter");
    assert_eq!(
        send(&mut q, 2, json!({"MessageBody": "\u{1}"}), 0).err().unwrap().shape,
        "InvalidMessageContents"
    );
}

#[test]
fn a_stale_receipt_deletes_nothing() {
    let mut q = queue(false, &[]);
    send(&mut q, 1, json!({"MessageBody": "a"}), 0).unwrap();
    let (_, first) = receive(&mut q, 1, 0, 0);
    let (_, second) = receive(&mut q, 1, 30, 1);
    assert_eq!(q.held_by_receipt(&first[0]).unwrap(), None);
    assert_eq!(q.held_by_receipt(&second[0]).unwrap(), Some(1));
    assert_eq!(q.held_by_receipt("%%%").unwrap_err().shape, "ReceiptHandleIsInvalid");
}

#[test]
fn a_fifo_receive_retried_with_its_attempt_id_gets_the_same_messages_until_one_changes() {
    let mut q = queue(true, &[("ContentBasedDeduplication", "true")]);
    for (seq, body) in ["1", "2"].into_iter().enumerate() {
        send(
            &mut q,
            seq as u64 + 1,
            json!({"MessageBody": body, "MessageGroupId": "g"}),
            0,
        )
        .unwrap();
    }
    let taken = q.receive(10, 30 * SECOND, None, 0, "n1");
    q.record_attempt("try-1", &taken, 0);
    let first = taken.received.clone();
    assert_eq!(q.replay_attempt("try-1", SECOND), Some(first.clone()));
    assert_eq!(q.replay_attempt("other", SECOND), None);
    // One of them made visible again: the attempt no longer replays.
    q.change_visibility(&first[0].1, 0, 2 * SECOND).unwrap();
    assert_eq!(q.replay_attempt("try-1", 2 * SECOND), None);
    // And an attempt is forgotten after five minutes.
    let taken = q.receive(10, 600 * SECOND, None, 3 * SECOND, "n2");
    q.record_attempt("try-2", &taken, 3 * SECOND);
    assert!(q.replay_attempt("try-2", 3 * SECOND + 5 * 60 * SECOND).is_none());
}

#[test]
fn the_oldest_message_age_counts_in_flight_and_delayed_messages_until_deleted() {
    let mut q = queue(false, &[]);
    assert_eq!(q.oldest_age_s(90 * SECOND), 0, "an empty queue");
    send(&mut q, 1, json!({"MessageBody": "a"}), SECOND).unwrap();
    send(&mut q, 2, json!({"MessageBody": "b", "DelaySeconds": 60}), 5 * SECOND).unwrap();
    receive(&mut q, 10, 30, 6 * SECOND);
    assert_eq!(q.counts(6 * SECOND).in_flight, 1);
    assert_eq!(
        q.oldest_age_s(11 * SECOND + 999),
        10,
        "whole seconds of the in-flight one"
    );
    q.messages.remove(&1);
    assert_eq!(q.oldest_age_s(11 * SECOND), 6, "then the delayed one");
}
