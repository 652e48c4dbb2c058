//! The log's file format against crashes at the worst moments: a torn last
//! record, a tail of zeros, damage in the middle, an interrupted
//! compaction; replay ending in the state the commands made, compaction
//! keeping exactly that state, and journals of the format before migrated.

use std::io::Write;

use super::*;
use crate::engine::command::{Op, Reply};
use crate::engine::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;

struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("sless-log-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn journal(&self) -> PathBuf {
        self.0.join("queues.journal")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn identity() -> Identity {
    Identity {
        account_id: "000000000000".into(),
        region: "r".into(),
    }
}

fn command(op: Op) -> Command {
    Command { now_ms: 1_000, op }
}

fn create_queue(name: &str) -> Command {
    command(Op::CreateQueue {
        queue: StoredQueue::named(name),
        given: Vec::new(),
    })
}

fn put(queue: &str, body: &str) -> Command {
    command(Op::Send {
        queue: queue.into(),
        messages: vec![StoredMessage::with_body(&format!("id-{body}"), body, 1)],
    })
}

/// A log beside the machine it journals, as the journal's writer keeps them.
struct Journaled {
    log: Log,
    machine: Machine,
}

impl Journaled {
    fn new(path: &Path) -> Self {
        create(path, &Machine::new(identity())).unwrap();
        Self::open(path)
    }

    fn open(path: &Path) -> Self {
        let Opened { log, machine, .. } = Log::open(path, identity()).unwrap();
        Self { log, machine }
    }

    /// Commits `commands` as one group, then applies them.
    fn commit(&mut self, commands: Vec<Command>) -> Vec<Result<Reply, SqsError>> {
        self.log.commit(commands.iter()).unwrap();
        commands.into_iter().map(|c| self.machine.apply(c)).collect()
    }

    fn end(&self) -> u64 {
        self.log.end
    }
}

/// A new journal holding queue `a` with message 1 of `body`.
fn open_with_one(path: &Path, body: &str) -> Journaled {
    let mut j = Journaled::new(path);
    j.commit(vec![create_queue("a"), put("a", body)]);
    j
}

/// Everything a snapshot keeps of `machine`, as JSON.
fn image(machine: &Machine) -> Vec<String> {
    let mut image = vec![serde_json::to_string(&machine.header()).unwrap()];
    for q in machine.queues.values() {
        image.push(serde_json::to_string(&q.image()).unwrap());
        image.extend(
            q.messages
                .iter()
                .map(|(seq, m)| format!("{seq} {}", serde_json::to_string(&m.image()).unwrap())),
        );
    }
    image
}

/// The bodies the journal holds, by queue and sequence.
fn held(path: &Path) -> Vec<(String, u64, String)> {
    let machine = Log::open(path, identity()).unwrap().machine;
    machine
        .queues
        .iter()
        .flat_map(|(name, q)| {
            q.messages
                .iter()
                .map(|(seq, m)| (name.clone(), *seq, m.stored.body.clone()))
        })
        .collect()
}

fn row(queue: &str, seq: u64, body: &str) -> (String, u64, String) {
    (queue.into(), seq, body.into())
}

/// The receipt handle of the message a receive of `queue` took.
fn receive(j: &mut Journaled, queue: &str, nonce: &str) -> String {
    let op = Op::Receive {
        queue: queue.into(),
        max: 1,
        visibility_ms: 30_000,
        attempt: None,
        nonce: nonce.into(),
    };
    match j.commit(vec![command(op)]).remove(0) {
        Ok(Reply::Received(taken)) => taken[0].1.clone(),
        other => panic!("a receive took nothing: {other:?}"),
    }
}

#[test]
fn a_replay_ends_in_the_state_the_commands_made() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = Journaled::new(&path);
    j.commit(vec![create_queue("a"), create_queue("b"), create_queue("c")]);
    j.commit(vec![
        put("a", "one"),
        put("a", "two"),
        put("b", "three"),
        put("c", "four"),
    ]);
    let receipt = receive(&mut j, "a", "n1");
    receive(&mut j, "a", "n2");
    j.commit(vec![
        command(Op::Delete {
            queue: "a".into(),
            receipts: vec![receipt],
        }),
        command(Op::PurgeQueue { name: "b".into() }),
    ]);
    j.commit(vec![put("b", "five"), command(Op::DeleteQueue { name: "c".into() })]);
    // A command that fails fails again, alike, when replayed.
    let again = j.commit(vec![command(Op::PurgeQueue { name: "b".into() })]);
    assert!(again[0].is_err());
    let before = image(&j.machine);
    drop(j);
    let reopened = Journaled::open(&path);
    assert_eq!(image(&reopened.machine), before);
    assert_eq!(held(&path), [row("a", 2, "two"), row("b", 5, "five")]);
    assert_eq!(
        reopened.machine.queues["a"].counts(1_000).in_flight,
        1,
        "a receive's in-flight state is journaled"
    );
}

#[test]
fn a_torn_last_record_is_cut_off_and_the_log_goes_on() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = open_with_one(&path, "kept");
    let good = j.end();
    j.commit(vec![put("a", "torn")]);
    drop(j);
    // A crash during the second write left part of it.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(good + 20).unwrap();
    drop(file);

    let opened = Log::open(&path, identity()).unwrap();
    assert!(opened.torn, "a torn write is reported");
    let mut j = Journaled {
        log: opened.log,
        machine: opened.machine,
    };
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        good,
        "the torn record is cut off"
    );
    j.commit(vec![put("a", "after")]);
    drop(j);
    assert_eq!(held(&path), [row("a", 1, "kept"), row("a", 2, "after")]);
}

#[test]
fn a_tail_of_zeros_is_a_write_the_crash_lost() {
    let dir = Dir::new();
    let path = dir.journal();
    drop(open_with_one(&path, "kept"));
    // The size reached the disk, the data did not.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&[0; 5000])
        .unwrap();
    assert_eq!(held(&path), [row("a", 1, "kept")]);
}

#[test]
fn a_torn_record_whose_first_page_was_lost_is_cut_off_too() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = open_with_one(&path, "kept");
    let good = j.end();
    let big = "y".repeat(10_000);
    j.commit(vec![put("a", &big)]);
    drop(j);
    // The record's later pages reached the disk, its first did not: its
    // header reads as zeros, with its payload's bytes after them.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0; 4096], good).unwrap();
    drop(file);
    assert_eq!(held(&path), [row("a", 1, "kept")]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
}

#[test]
fn commits_go_into_preallocated_zeros_that_opening_gives_back() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = open_with_one(&path, "one");
    let end = j.end();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), PREALLOCATE);
    j.commit(vec![put("a", "two")]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), PREALLOCATE, "written in place");
    drop(j);
    // A clean close leaves only zeros after the last record: no torn write.
    assert!(
        !Log::open(&path, identity()).unwrap().torn,
        "the preallocated zeros read as a torn write"
    );
    assert_eq!(held(&path), [row("a", 1, "one"), row("a", 2, "two")]);
    assert!(std::fs::metadata(&path).unwrap().len() > end);
    assert!(
        std::fs::metadata(&path).unwrap().len() < PREALLOCATE,
        "the zeros are cut off"
    );
}

#[test]
fn damage_before_the_last_record_is_refused_not_skipped() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = open_with_one(&path, "first");
    j.commit(vec![put("a", "second")]);
    drop(j);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(5).position(|w| w == b"first").unwrap();
    bytes[at] = b'F';
    std::fs::write(&path, &bytes).unwrap();
    match Log::open(&path, identity()) {
        Err(LogError::Damaged { what, .. }) => assert!(what.contains("a valid one after it"), "{what}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a damaged journal opened"),
    }
    // And the file is left as it was, for whoever repairs it.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_file_of_another_kind_is_not_taken_for_a_journal() {
    let dir = Dir::new();
    let path = dir.journal();
    std::fs::write(&path, b"SQLite format 3\0").unwrap();
    assert!(matches!(Log::open(&path, identity()), Err(LogError::NotAJournal(_))));
}

#[test]
fn compaction_keeps_exactly_the_state_and_bounds_the_file() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut j = Journaled::new(&path);
    j.log.compact_above(64 << 10);
    j.commit(vec![create_queue("a"), create_queue("b"), create_queue("k")]);
    let body = "x".repeat(500);
    let mut largest = 0;
    // Each hundredth message is kept in k; the others are received from a
    // and deleted again.
    for n in 1..=2000u64 {
        let queue = if n % 100 == 0 { "k" } else { "a" };
        j.commit(vec![put(queue, &format!("{n}{body}"))]);
        if queue == "a" {
            let receipt = receive(&mut j, "a", &format!("n{n}"));
            j.commit(vec![command(Op::Delete {
                queue: "a".into(),
                receipts: vec![receipt],
            })]);
        }
        j.log.compact_if_due(&j.machine);
        largest = largest.max(j.end());
    }
    j.commit(vec![command(Op::DeleteQueue { name: "b".into() })]);
    let before = image(&j.machine);
    drop(j);
    assert!(largest < 400 << 10, "the journal grew to {largest} bytes");
    let reopened = Journaled::open(&path);
    assert_eq!(image(&reopened.machine), before);
    assert_eq!(reopened.machine.queues.keys().collect::<Vec<_>>(), ["a", "k"]);
    let bodies: Vec<String> = held(&path).into_iter().map(|(_, _, b)| b).collect();
    let kept: Vec<String> = (1..=20).map(|i| format!("{}{body}", i * 100)).collect();
    assert_eq!(bodies, kept);
}

#[test]
fn a_journal_of_the_format_before_is_read_as_it_was() {
    let dir = Dir::new();
    let path = dir.journal();
    // SLESSQJ1: put queue a and b, three messages, delete one, purge b.
    let mut payload = vec![0; HEADER];
    let queue = serde_json::to_vec(&StoredQueue::named("a")).unwrap();
    push_entry(&mut payload, 1, "a", 0, &queue).unwrap();
    push_entry(
        &mut payload,
        1,
        "b",
        0,
        &serde_json::to_vec(&StoredQueue::named("b")).unwrap(),
    )
    .unwrap();
    for (queue, seq, body) in [("a", 1, "one"), ("a", 2, "two"), ("b", 3, "three")] {
        let m = serde_json::to_vec(&StoredMessage::with_body(body, body, 1)).unwrap();
        push_entry(&mut payload, 4, queue, seq, &m).unwrap();
    }
    push_entry(&mut payload, 5, "a", 1, &[]).unwrap();
    push_entry(&mut payload, 3, "b", 0, &[]).unwrap();
    seal(&mut payload).unwrap();
    let mut file = V1_MAGIC.to_vec();
    file.extend_from_slice(&payload);
    std::fs::write(&path, &file).unwrap();
    let (queues, messages) = super::super::v1::read(&path).unwrap();
    let mut names: Vec<String> = queues.into_iter().map(|q| q.name).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    let bodies: Vec<(String, u64, String)> = messages.into_iter().map(|(q, seq, m)| (q, seq, m.body)).collect();
    assert_eq!(bodies, [row("a", 2, "two")]);
}

#[test]
fn a_compaction_a_crash_interrupted_leaves_the_journal_as_it_was() {
    let dir = Dir::new();
    let path = dir.journal();
    drop(open_with_one(&path, "kept"));
    std::fs::write(sibling(&path, "-compact"), b"SLESSQJ1 half written").unwrap();
    assert_eq!(held(&path), [row("a", 1, "kept")]);
    assert!(!sibling(&path, "-compact").exists());
}
