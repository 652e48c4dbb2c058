//! The log's file format against crashes at the worst moments: a torn last
//! record, a tail of zeros, damage in the middle, an interrupted
//! compaction; and compaction keeping exactly the live entries.

use std::io::Write;

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

fn queue(name: &str) -> StoredQueue {
    StoredQueue::named(name)
}

fn put(queue: &str, seq: u64, body: &str) -> Change {
    Change::PutMessage {
        queue: queue.into(),
        seq,
        message: StoredMessage::with_body(&format!("id-{body}"), body, 1),
    }
}

fn delete(queue: &str, seq: u64) -> Change {
    Change::DeleteMessage {
        queue: queue.into(),
        seq,
    }
}

fn open_new(path: &Path) -> Log {
    create(path, &[], &[]).unwrap();
    Log::open(path).unwrap().log
}

/// A new journal holding queue `a` with message 1 of `body`.
fn open_with_one(path: &Path, body: &str) -> Log {
    let mut log = open_new(path);
    log.commit([Change::PutQueue(queue("a")), put("a", 1, body)].iter())
        .unwrap();
    log
}

/// The bodies the journal holds, by queue, and its queues' names.
fn held(path: &Path) -> (Vec<String>, Vec<(String, u64, String)>) {
    let opened = Log::open(path).unwrap();
    let mut queues: Vec<_> = opened.queues.into_iter().map(|q| q.name).collect();
    queues.sort();
    let messages = opened
        .messages
        .into_iter()
        .map(|(q, seq, m)| (q, seq, m.body))
        .collect();
    (queues, messages)
}

fn row(queue: &str, seq: u64, body: &str) -> (String, u64, String) {
    (queue.into(), seq, body.into())
}

#[test]
fn changes_replay_as_the_engine_made_them() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut log = open_new(&path);
    let groups = [
        vec![
            Change::PutQueue(queue("a")),
            Change::PutQueue(queue("b")),
            Change::PutQueue(queue("c")),
        ],
        vec![
            put("a", 1, "one"),
            put("a", 2, "two"),
            put("b", 3, "three"),
            put("c", 4, "four"),
        ],
        vec![delete("a", 1), put("a", 2, "two again"), Change::PurgeQueue("b".into())],
        vec![put("b", 5, "five"), Change::DeleteQueue("c".into())],
    ];
    for group in &groups {
        log.commit(group.iter()).unwrap();
    }
    drop(log);
    let (queues, messages) = held(&path);
    assert_eq!(queues, ["a", "b"]);
    assert_eq!(messages, [row("a", 2, "two again"), row("b", 5, "five")]);
}

#[test]
fn a_torn_last_record_is_cut_off_and_the_log_goes_on() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut log = open_with_one(&path, "kept");
    let good = log.end;
    log.commit([put("a", 2, "torn")].iter()).unwrap();
    drop(log);
    // A crash during the second write left part of it.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(good + 20).unwrap();
    drop(file);

    let opened = Log::open(&path).unwrap();
    assert!(opened.torn, "a torn write is reported");
    let mut log = opened.log;
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        good,
        "the torn record is cut off"
    );
    log.commit([put("a", 3, "after")].iter()).unwrap();
    drop(log);
    assert_eq!(held(&path).1, [row("a", 1, "kept"), row("a", 3, "after")]);
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
    assert_eq!(held(&path).1, [row("a", 1, "kept")]);
}

#[test]
fn a_torn_record_whose_first_page_was_lost_is_cut_off_too() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut log = open_with_one(&path, "kept");
    let good = log.end;
    let big = "y".repeat(10_000);
    log.commit([put("a", 2, &big)].iter()).unwrap();
    drop(log);
    // The record's later pages reached the disk, its first did not: its
    // header reads as zeros, with its payload's bytes after them.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0; 4096], good).unwrap();
    drop(file);
    assert_eq!(held(&path).1, [row("a", 1, "kept")]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
}

#[test]
fn commits_go_into_preallocated_zeros_that_opening_gives_back() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut log = open_with_one(&path, "one");
    let end = log.end;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), PREALLOCATE);
    log.commit([put("a", 2, "two")].iter()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), PREALLOCATE, "written in place");
    drop(log);
    // A clean close leaves only zeros after the last record: no torn write.
    assert!(
        !Log::open(&path).unwrap().torn,
        "the preallocated zeros read as a torn write"
    );
    assert_eq!(held(&path).1, [row("a", 1, "one"), row("a", 2, "two")]);
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
    let mut log = open_with_one(&path, "first");
    log.commit([put("a", 2, "second")].iter()).unwrap();
    drop(log);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.windows(5).position(|w| w == b"first").unwrap();
    bytes[at] = b'F';
    std::fs::write(&path, &bytes).unwrap();
    match Log::open(&path) {
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
    assert!(matches!(Log::open(&path), Err(LogError::NotAJournal(_))));
}

#[test]
fn compaction_keeps_exactly_the_live_entries_and_bounds_the_file() {
    let dir = Dir::new();
    let path = dir.journal();
    let mut log = open_new(&path);
    log.compact_above(64 << 10);
    log.commit([Change::PutQueue(queue("a")), Change::PutQueue(queue("b"))].iter())
        .unwrap();
    let body = "x".repeat(500);
    let mut largest = 0;
    // Every message but each hundredth is deleted again.
    for seq in 1..=2000u64 {
        log.commit([put("a", seq, &format!("{seq}{body}"))].iter()).unwrap();
        if seq % 100 != 0 {
            log.commit([delete("a", seq)].iter()).unwrap();
        }
        log.compact_if_due();
        largest = largest.max(log.end);
    }
    log.commit([Change::DeleteQueue("b".into())].iter()).unwrap();
    drop(log);
    assert!(largest < 200 << 10, "the journal grew to {largest} bytes");
    let (queues, messages) = held(&path);
    assert_eq!(queues, ["a"]);
    let seqs: Vec<u64> = messages.iter().map(|(_, seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=20).map(|i| i * 100).collect::<Vec<_>>());
    assert!(messages.iter().all(|(_, seq, b)| *b == format!("{seq}{body}")));
}

#[test]
fn a_compaction_a_crash_interrupted_leaves_the_journal_as_it_was() {
    let dir = Dir::new();
    let path = dir.journal();
    drop(open_with_one(&path, "kept"));
    std::fs::write(sibling(&path, "-compact"), b"SLESSQJ1 half written").unwrap();
    assert_eq!(held(&path).1, [row("a", 1, "kept")]);
    assert!(!sibling(&path, "-compact").exists());
}
