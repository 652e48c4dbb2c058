//! The engine's durability contract: a change is visible only once
//! committed; a write that failed (an injected failure) stops the replica,
//! and the next start has nothing of the change; a restart keeps what
//! receives did (in-flight messages, receipts, deduplication); stores of
//! earlier versions are read into the replica once.

use serde_json::{Value, json};

use super::*;

struct Journaled {
    persistence: Persistence,
    engine: Arc<Engine>,
}

fn config() -> EngineConfig {
    EngineConfig {
        account_id: "acme".into(),
        region: "ru-msk-1".into(),
        base_url: "http://engine".into(),
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        if let Some(dir) = self.persistence.journal.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Journaled {
    async fn new() -> Self {
        Self::with(Durability::Disk).await
    }

    async fn with(durability: Durability) -> Self {
        let persistence = Persistence {
            journal: std::env::temp_dir()
                .join(format!("sless-engine-{}-{}", std::process::id(), rand::random::<u64>()))
                .join("queues.journal"),
            durability,
        };
        let engine = Engine::open(config(), Some(&persistence)).await.unwrap();
        Self { persistence, engine }
    }

    fn probe(&self) -> &raft::log_store::Probe {
        &self.engine.replica.as_ref().unwrap().probe
    }

    fn syncs(&self) -> u64 {
        self.probe().syncs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A restart: the engine stops (releasing its store), and a new one
    /// starts from what the store has.
    async fn reopen(&mut self) {
        drop(std::mem::replace(&mut self.engine, Engine::in_memory(config())));
        self.engine = Engine::open(config(), Some(&self.persistence)).await.unwrap();
    }

    /// Makes every write fail from now on: the replica stops at the first.
    fn fail_writes(&self) {
        self.probe().failing.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    async fn call(&self, action: &str, input: Value) -> Result<Value, SqsError> {
        self.engine.handle(action, &input).await
    }

    async fn ok(&self, action: &str, input: Value) -> Value {
        self.call(action, input)
            .await
            .unwrap_or_else(|e| panic!("{action}: {e}"))
    }

    /// Queue `jobs` (at [`Q`]) holding one message `m`, which its second
    /// receive moves to queue `dead`; the URL of `dead`.
    async fn one_message_before_a_dead_letter_queue(&self) -> Value {
        let dlq = self.ok("CreateQueue", json!({"QueueName": "dead"})).await["QueueUrl"].clone();
        let policy = json!({"deadLetterTargetArn": "arn:aws:sqs:ru-msk-1:acme:dead", "maxReceiveCount": 1}).to_string();
        self.ok(
            "CreateQueue",
            json!({"QueueName": "jobs", "Attributes": {"RedrivePolicy": policy}}),
        )
        .await;
        self.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "m"})).await;
        dlq
    }

    async fn queues(&self) -> Value {
        self.ok("ListQueues", json!({})).await["QueueUrls"].clone()
    }

    async fn receive(&self, queue: &str) -> Vec<Value> {
        let out = self
            .ok(
                "ReceiveMessage",
                json!({"QueueUrl": queue, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}),
            )
            .await;
        out["Messages"].as_array().cloned().unwrap_or_default()
    }
}

const Q: &str = "http://engine/acme/jobs";

fn failed(result: Result<Value, SqsError>) -> SqsError {
    let e = result.expect_err("the write was made to fail");
    assert!(e.status >= 500, "{e}");
    e
}

#[tokio::test]
async fn a_message_whose_commit_failed_is_never_received() {
    let mut j = Journaled::new().await;
    j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
    j.fail_writes();
    failed(
        j.call("SendMessage", json!({"QueueUrl": Q, "MessageBody": "lost"}))
            .await,
    );
    failed(
        j.call(
            "SendMessageBatch",
            json!({"QueueUrl": Q, "Entries": [{"Id": "a", "MessageBody": "x"}, {"Id": "b", "MessageBody": "y"}]}),
        )
        .await,
    );
    j.reopen().await;
    assert!(j.receive(Q).await.is_empty(), "nothing uncommitted is received");
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "kept"})).await;
    j.reopen().await;
    let bodies: Vec<_> = j.receive(Q).await.iter().map(|m| m["Body"].clone()).collect();
    assert_eq!(bodies, [json!("kept")]);
}

#[tokio::test]
async fn a_restart_keeps_messages_in_flight_their_receipts_and_fifo_deduplication() {
    let mut j = Journaled::new().await;
    j.ok(
        "CreateQueue",
        json!({"QueueName": "jobs.fifo", "Attributes": {"FifoQueue": "true"}}),
    )
    .await;
    let fifo = "http://engine/acme/jobs.fifo";
    for (body, dedup) in [("first", "d1"), ("second", "d2")] {
        let send =
            json!({"QueueUrl": fifo, "MessageBody": body, "MessageGroupId": "g", "MessageDeduplicationId": dedup});
        j.ok("SendMessage", send).await;
    }
    let taken = j
        .ok(
            "ReceiveMessage",
            json!({"QueueUrl": fifo, "MaxNumberOfMessages": 1, "VisibilityTimeout": 60}),
        )
        .await;
    let receipt = taken["Messages"][0]["ReceiptHandle"].clone();
    assert_eq!(taken["Messages"][0]["Body"], "first");
    j.reopen().await;
    // Still in flight, so its group yields nothing, before and after a restart.
    let again = j
        .ok("ReceiveMessage", json!({"QueueUrl": fifo, "MaxNumberOfMessages": 10}))
        .await;
    assert!(
        again.get("Messages").is_none(),
        "received again after a restart: {again}"
    );
    let attributes = j
        .ok(
            "GetQueueAttributes",
            json!({"QueueUrl": fifo, "AttributeNames": ["ApproximateNumberOfMessagesNotVisible"]}),
        )
        .await;
    assert_eq!(attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"], "1");
    // A duplicate of the first is still a duplicate.
    let duplicate =
        json!({"QueueUrl": fifo, "MessageBody": "first", "MessageGroupId": "g", "MessageDeduplicationId": "d1"});
    j.ok("SendMessage", duplicate).await;
    // Its receipt from before the restart still deletes it.
    j.ok("DeleteMessage", json!({"QueueUrl": fifo, "ReceiptHandle": receipt}))
        .await;
    let bodies: Vec<_> = j.receive(fifo).await.iter().map(|m| m["Body"].clone()).collect();
    assert_eq!(bodies, [json!("second")]);
}

#[tokio::test]
async fn a_fifo_retry_after_a_failed_commit_is_not_taken_for_a_duplicate() {
    let mut j = Journaled::new().await;
    j.ok(
        "CreateQueue",
        json!({"QueueName": "jobs.fifo", "Attributes": {"FifoQueue": "true"}}),
    )
    .await;
    let fifo = "http://engine/acme/jobs.fifo";
    let send = json!({"QueueUrl": fifo, "MessageBody": "m", "MessageGroupId": "g", "MessageDeduplicationId": "d1"});
    j.fail_writes();
    failed(j.call("SendMessage", send.clone()).await);
    j.reopen().await;
    j.ok("SendMessage", send).await;
    assert_eq!(j.receive(fifo).await.len(), 1, "the retry was enqueued");
}

#[tokio::test]
async fn queue_changes_whose_commit_failed_leave_the_queue_as_it_was() {
    let mut j = Journaled::new().await;
    j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "m"})).await;
    j.fail_writes();
    failed(j.call("CreateQueue", json!({"QueueName": "other"})).await);
    failed(j.call("DeleteQueue", json!({"QueueUrl": Q})).await);
    failed(j.call("PurgeQueue", json!({"QueueUrl": Q})).await);
    failed(
        j.call(
            "SetQueueAttributes",
            json!({"QueueUrl": Q, "Attributes": {"DelaySeconds": "30"}}),
        )
        .await,
    );
    failed(j.call("TagQueue", json!({"QueueUrl": Q, "Tags": {"team": "a"}})).await);
    j.reopen().await;
    for check in 0..2 {
        assert_eq!(j.queues().await, json!([Q]), "check {check}");
        let attrs = j
            .ok("GetQueueAttributes", json!({"QueueUrl": Q, "AttributeNames": ["All"]}))
            .await;
        assert_eq!(attrs["Attributes"]["DelaySeconds"], "0");
        assert_eq!(j.ok("ListQueueTags", json!({"QueueUrl": Q})).await, json!({}));
        assert_eq!(j.receive(Q).await.len(), 1, "not purged");
        // The deleted queue did not come back after a restart: it was never deleted.
        j.reopen().await;
    }
    j.ok("DeleteQueue", json!({"QueueUrl": Q})).await;
    j.reopen().await;
    assert_eq!(j.queues().await, Value::Null);
}

#[tokio::test]
async fn a_delete_whose_commit_failed_keeps_the_message() {
    let mut j = Journaled::new().await;
    j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "m"})).await;
    let receipt = j.receive(Q).await[0]["ReceiptHandle"].clone();
    j.fail_writes();
    failed(
        j.call("DeleteMessage", json!({"QueueUrl": Q, "ReceiptHandle": receipt}))
            .await,
    );
    failed(
        j.call(
            "DeleteMessageBatch",
            json!({"QueueUrl": Q, "Entries": [{"Id": "a", "ReceiptHandle": receipt}]}),
        )
        .await,
    );
    j.reopen().await;
    assert_eq!(j.receive(Q).await.len(), 1);
    j.reopen().await;
    let again = j.receive(Q).await;
    assert_eq!(again.len(), 1);
    j.ok(
        "DeleteMessage",
        json!({"QueueUrl": Q, "ReceiptHandle": again[0]["ReceiptHandle"]}),
    )
    .await;
    j.reopen().await;
    assert!(j.receive(Q).await.is_empty());
}

#[tokio::test]
async fn a_dead_letter_move_whose_commit_failed_is_undone() {
    let mut j = Journaled::new().await;
    let dlq = j.one_message_before_a_dead_letter_queue().await;
    assert_eq!(j.receive(Q).await.len(), 1);
    // The second receive moves it to the dead-letter queue: make that fail.
    j.fail_writes();
    let taken = j
        .call(
            "ReceiveMessage",
            json!({"QueueUrl": Q, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}),
        )
        .await;
    failed(taken);
    j.reopen().await;
    assert!(j.receive(dlq.as_str().unwrap()).await.is_empty(), "not moved");
    // Still in its queue; the next receive moves it.
    assert!(j.receive(Q).await.is_empty());
    assert_eq!(j.receive(dlq.as_str().unwrap()).await.len(), 1);
}

#[tokio::test]
async fn a_second_engine_cannot_open_a_journal_in_use() {
    let mut j = Journaled::new().await;
    j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
    // Two engines on one journal would number their messages alike and
    // overwrite each other's: the second waits LOCK_WAIT, then refuses.
    let persistence = j.persistence.clone();
    let second = Engine::open(config(), Some(&persistence)).await;
    let Err(e) = second else {
        panic!("a second engine opened the journal")
    };
    assert!(e.message.contains("in use by another queue engine"), "{e}");
    // The first still writes, and once it stops the journal opens.
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "m"})).await;
    j.reopen().await;
    assert_eq!(j.receive(Q).await.len(), 1);
}

#[tokio::test]
async fn a_journal_of_the_sqlite_format_is_migrated_with_what_its_wal_held() {
    let mut j = Journaled::new().await;
    j.engine = Engine::in_memory(config());
    std::fs::remove_dir_all(j.persistence.journal.with_extension("raft")).unwrap();
    // An engine of the earlier version, killed: its last commits are still
    // in the WAL, not yet checkpointed into the database.
    let legacy = j.persistence.journal.with_extension("db");
    let conn = rusqlite::Connection::open(&legacy).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.execute_batch(
        "CREATE TABLE queues (name TEXT PRIMARY KEY, meta TEXT NOT NULL) WITHOUT ROWID;
         CREATE TABLE messages (queue TEXT NOT NULL, seq INTEGER NOT NULL, message TEXT NOT NULL,
             PRIMARY KEY (queue, seq)) WITHOUT ROWID;",
    )
    .unwrap();
    let meta = records::StoredQueue {
        tags: [("team".to_owned(), "a".to_owned())].into(),
        ..records::StoredQueue::named("jobs")
    };
    conn.execute(
        "INSERT INTO queues VALUES ('jobs', ?1)",
        [serde_json::to_string(&meta).unwrap()],
    )
    .unwrap();
    for (seq, body) in [(7, "old one"), (9, "old two")] {
        // Sent within the retention period, or the engine drops them.
        let message = records::StoredMessage::with_body(&format!("m{seq}"), body, now_ms());
        conn.execute(
            "INSERT INTO messages VALUES ('jobs', ?1, ?2)",
            rusqlite::params![seq, serde_json::to_string(&message).unwrap()],
        )
        .unwrap();
    }
    // What a kill -9 leaves: the files as they are now, before closing
    // checkpoints the WAL and removes it.
    let wal = super::journal::sibling(&legacy, "-wal");
    let left = [std::fs::read(&legacy).unwrap(), std::fs::read(&wal).unwrap()];
    assert!(!left[1].is_empty(), "the WAL holds the commits");
    drop(conn);
    std::fs::write(&legacy, &left[0]).unwrap();
    std::fs::write(&wal, &left[1]).unwrap();

    j.reopen().await;
    for suffix in ["", "-wal", "-shm"] {
        assert!(
            !super::journal::sibling(&legacy, suffix).exists(),
            "the SQLite journal{suffix} is removed"
        );
    }
    let tags = j.ok("ListQueueTags", json!({"QueueUrl": Q})).await;
    assert_eq!(tags["Tags"], json!({"team": "a"}));
    // Numbering goes on after the migrated messages, and all survive a restart.
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "new"})).await;
    j.reopen().await;
    let mut bodies: Vec<_> = j.receive(Q).await.iter().map(|m| m["Body"].clone()).collect();
    bodies.sort_by_key(|b| b.to_string());
    assert_eq!(bodies, [json!("new"), json!("old one"), json!("old two")]);
}

/// The console's peek shows what a receive would take and changes
/// nothing: two peeks of a queue whose dead-letter policy allows one
/// receive move nothing and count no receive.
#[tokio::test]
async fn a_peek_counts_no_receive_and_moves_nothing() {
    let j = Journaled::new().await;
    let dlq = j.one_message_before_a_dead_letter_queue().await;
    let peek = json!({"QueueUrl": Q, "MaxNumberOfMessages": 10});
    for _ in 0..3 {
        let peeked = j.ok(requests::PEEK_ACTION, peek.clone()).await;
        assert_eq!(peeked["Messages"][0]["Body"], "m", "{peeked}");
        assert_eq!(peeked["Messages"][0]["ApproximateReceiveCount"], 0, "{peeked}");
        assert!(peeked["Messages"][0].get("ReceiptHandle").is_none());
    }
    assert!(j.receive(dlq.as_str().unwrap()).await.is_empty(), "a peek moved it");
    // A receive still gets it, first time; while it is in flight a peek shows nothing.
    let got = j
        .ok(
            "ReceiveMessage",
            json!({"QueueUrl": Q, "VisibilityTimeout": 30, "AttributeNames": ["ApproximateReceiveCount"]}),
        )
        .await;
    assert_eq!(
        got["Messages"][0]["Attributes"]["ApproximateReceiveCount"], "1",
        "{got}"
    );
    let peeked = j.ok(requests::PEEK_ACTION, peek.clone()).await;
    assert_eq!(peeked["Messages"], json!([]), "{peeked}");
    let e = j
        .call(requests::PEEK_ACTION, json!({"QueueUrl": Q, "MaxNumberOfMessages": 11}))
        .await
        .unwrap_err();
    assert_eq!(e.code, "InvalidParameterValue");
}

/// 1,000 queues in 3 s were accepted before, with no end: an engine holds
/// at most MAX_QUEUES, and then refuses with OverLimit.
#[tokio::test]
async fn a_queue_service_holds_at_most_a_thousand_queues() {
    let engine = Engine::in_memory(config());
    for i in 0..queue_actions::MAX_QUEUES {
        engine
            .handle("CreateQueue", &json!({"QueueName": format!("q{i}")}))
            .await
            .unwrap();
    }
    let e = engine
        .handle("CreateQueue", &json!({"QueueName": "one-more"}))
        .await
        .unwrap_err();
    assert_eq!((e.code, e.status), ("OverLimit", 403), "{e}");
    // Creating one it has is still idempotent; after a delete there is room.
    engine.handle("CreateQueue", &json!({"QueueName": "q0"})).await.unwrap();
    engine
        .handle("DeleteQueue", &json!({"QueueUrl": "http://engine/acme/q1"}))
        .await
        .unwrap();
    engine
        .handle("CreateQueue", &json!({"QueueName": "one-more"}))
        .await
        .unwrap();
}

/// `disk` answers each send after its own sync; `process` answers once the
/// write is in the page cache and syncs within `PROCESS_SYNC_MS`, also when
/// no more writes come.
#[tokio::test]
async fn process_durability_syncs_on_a_timer_not_per_send() {
    async fn send_many(j: &Journaled, n: usize) -> (u64, std::time::Duration) {
        j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
        let before = j.syncs();
        let started = std::time::Instant::now();
        for i in 0..n {
            j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": format!("m{i}")}))
                .await;
        }
        (j.syncs() - before, started.elapsed())
    }

    let disk = Journaled::new().await;
    let (synced, _) = send_many(&disk, 50).await;
    assert!(synced >= 50, "disk synced {synced} times for 50 sends");

    let mut process = Journaled::with(Durability::Process).await;
    let (synced, took) = send_many(&process, 300).await;
    let periods = took.as_millis() as u64 / sless_model::queue_service::PROCESS_SYNC_MS;
    assert!(
        synced <= periods + 2,
        "process synced {synced} times for 300 sends in {took:?}"
    );
    // Idle now: the last writes are synced within the period.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let before = process.syncs();
    while process.syncs() == before {
        assert!(std::time::Instant::now() < deadline, "an idle journal never synced");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    process.reopen().await;
    let attributes = process
        .ok(
            "GetQueueAttributes",
            json!({"QueueUrl": Q, "AttributeNames": ["ApproximateNumberOfMessages"]}),
        )
        .await;
    assert_eq!(attributes["Attributes"]["ApproximateNumberOfMessages"], "300");
}

/// Once the log outweighs the last snapshot (and 16 MiB), the replica
/// snapshots its state and the log before it is purged and rewritten; a
/// restart starts from the snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_compacted_into_a_snapshot_that_a_restart_starts_from() {
    let mut j = Journaled::new().await;
    j.ok("CreateQueue", json!({"QueueName": "jobs"})).await;
    // 40 MB of sends, received and deleted: more than twice the log's floor.
    let body = "x".repeat(200_000);
    for _ in 0..200 {
        j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": body})).await;
        let taken = j.receive(Q).await;
        let receipt = taken[0]["ReceiptHandle"].clone();
        j.ok("DeleteMessage", json!({"QueueUrl": Q, "ReceiptHandle": receipt}))
            .await;
    }
    j.ok("SendMessage", json!({"QueueUrl": Q, "MessageBody": "kept"})).await;
    let log = j.persistence.journal.with_extension("raft").join("raft.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::fs::metadata(&log).unwrap().len() > 20 << 20 {
        assert!(std::time::Instant::now() < deadline, "the log was never compacted");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    j.reopen().await;
    let bodies: Vec<_> = j.receive(Q).await.iter().map(|m| m["Body"].clone()).collect();
    assert_eq!(bodies, [json!("kept")]);
}
