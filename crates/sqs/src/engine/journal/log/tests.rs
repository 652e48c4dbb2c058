//! The record files against crashes at the worst moments (a torn last
//! record, damage in the middle, a snapshot cut short), a journal of the
//! version before replaying to the state its commands made, and one of the
//! version before that read as it was.

use crate::engine::command::{Command, Op, Reply};
use crate::engine::records::{StoredMessage, StoredQueue};
use crate::error::SqsError;

use super::*;

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

fn row(queue: &str, seq: u64, body: &str) -> (String, u64, String) {
    (queue.into(), seq, body.into())
}

/// Writes a journal of the version before at `path`, as its writer did: a
/// snapshot of an empty machine, then each group of commands as a record,
/// applied to `machine` as they were.
fn journal(path: &Path, machine: &mut Machine, groups: Vec<Vec<Command>>) -> Vec<u64> {
    let mut out = RecordWriter::create(path, MAGIC).unwrap();
    write_snapshot(&mut out, machine).unwrap();
    out.flush().unwrap();
    let mut ends = Vec::new();
    for group in groups {
        let mut entry = Vec::new();
        for c in group {
            push_entry(&mut entry, COMMAND, "", 0, &serde_json::to_vec(&c).unwrap()).unwrap();
            let _: Result<Reply, SqsError> = machine.apply(c);
        }
        out.push(&entry).unwrap();
        out.flush().unwrap();
        ends.push(out.end);
    }
    out.finish().unwrap();
    ends
}

fn receipt(machine: &mut Machine, queue: &str) -> String {
    let op = Op::Receive {
        queue: queue.into(),
        max: 1,
        visibility_ms: 30_000,
        attempt: None,
        nonce: "n".into(),
    };
    match machine.apply(command(op)) {
        Ok(Reply::Received(taken)) => taken[0].1.clone(),
        other => panic!("a receive took nothing: {other:?}"),
    }
}

#[test]
fn a_journal_replays_to_the_state_its_commands_made() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut scratch = Machine::new(Identity::for_tests());
    scratch.apply(create_queue("a")).unwrap();
    scratch.apply(put("a", "one")).unwrap();
    let handle = receipt(&mut scratch, "a");
    let mut machine = Machine::new(Identity::for_tests());
    let groups = vec![
        vec![create_queue("a"), create_queue("b"), create_queue("c")],
        vec![put("a", "one"), put("a", "two"), put("b", "three")],
        vec![command(Op::Receive {
            queue: "a".into(),
            max: 1,
            visibility_ms: 30_000,
            attempt: None,
            nonce: "n".into(),
        })],
        vec![
            command(Op::Delete {
                queue: "a".into(),
                receipts: vec![handle],
            }),
            command(Op::PurgeQueue { name: "b".into() }),
            command(Op::DeleteQueue { name: "c".into() }),
        ],
        // It fails now, and fails again alike when replayed.
        vec![command(Op::PurgeQueue { name: "b".into() })],
    ];
    journal(&path, &mut machine, groups);
    let (read, torn) = read_journal(&path, Identity::for_tests()).unwrap();
    assert!(!torn);
    assert_eq!(read.image(), machine.image());
    let held: Vec<_> = read
        .queues
        .iter()
        .flat_map(|(n, q)| q.messages.iter().map(|(seq, m)| row(n, *seq, &m.stored.body)))
        .collect();
    assert_eq!(held, [row("a", 2, "two")], "one was received and deleted");
}

#[test]
fn a_torn_last_record_is_left_out_and_damage_before_it_refused() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut machine = Machine::new(Identity::for_tests());
    let ends = journal(
        &path,
        &mut machine,
        vec![vec![create_queue("a"), put("a", "kept")], vec![put("a", "torn")]],
    );
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() - 5]).unwrap();
    let (read, torn) = read_journal(&path, Identity::for_tests()).unwrap();
    assert!(torn, "a torn write is reported");
    let bodies: Vec<_> = read.queues["a"]
        .messages
        .values()
        .map(|m| m.stored.body.clone())
        .collect();
    assert_eq!(bodies, ["kept"]);
    // A byte changed in the first group, with a whole record after it: damage.
    let mut damaged = whole.clone();
    let at = damaged.windows(4).position(|w| w == b"kept").unwrap();
    damaged[at] = b'K';
    assert!(at < ends[0] as usize);
    std::fs::write(&path, &damaged).unwrap();
    match read_journal(&path, Identity::for_tests()) {
        Err(LogError::Damaged { what, .. }) => assert!(what.contains("a valid one after it"), "{what}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a damaged journal was read"),
    }
    std::fs::write(&path, b"SQLite format 3\0").unwrap();
    assert!(matches!(
        read_journal(&path, Identity::for_tests()),
        Err(LogError::NotAJournal(_))
    ));
}

#[test]
fn a_snapshot_file_reads_back_whole_or_not_at_all() {
    let dir = Dir::new();
    let path = dir.0.join("raft.snapshot");
    let mut machine = Machine::new(Identity::for_tests());
    machine.apply(create_queue("a")).unwrap();
    machine.apply(put("a", "m")).unwrap();
    receipt(&mut machine, "a");
    write_snapshot_file(&path, b"{\"meta\":1}", &machine).unwrap();
    let file = File::open(&path).unwrap();
    assert_eq!(read_snapshot_meta(&file, &path).unwrap(), b"{\"meta\":1}");
    let (meta, read) = read_snapshot_file(&path, Identity::for_tests()).unwrap();
    assert_eq!(meta, b"{\"meta\":1}");
    assert_eq!(read.image(), machine.image(), "receive state included");
    let whole = std::fs::read(&path).unwrap();
    std::fs::write(&path, &whole[..whole.len() - 3]).unwrap();
    assert!(
        read_snapshot_file(&path, Identity::for_tests()).is_err(),
        "a snapshot cut short was read"
    );
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
