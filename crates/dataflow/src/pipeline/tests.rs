//! The pipeline's stages with a source and a sink made for the test: what
//! overlaps and what stays in order.

use std::collections::VecDeque;
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::json;
use tokio::sync::{Notify, Semaphore};
use tokio::time::timeout;

use super::*;

const WAIT: Duration = Duration::from_secs(5);

/// Gives its batches, then waits for ever (or, with `lost`, fails as a
/// dropped connection does); each commit waits for a permit of `gate`.
/// `log` tells what happened in what order.
struct Batches {
    batches: Mutex<VecDeque<Vec<u64>>>,
    lost: bool,
    reads: Notify,
    gate: Semaphore,
    log: Arc<Mutex<Vec<String>>>,
}

impl Batches {
    fn new(batches: &[&[u64]], log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
        Self::ending(batches, false, log)
    }

    /// Its batches, then a lost connection.
    fn then_lost(batches: &[&[u64]], log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
        Self::ending(batches, true, log)
    }

    fn ending(batches: &[&[u64]], lost: bool, log: &Arc<Mutex<Vec<String>>>) -> Arc<Self> {
        Arc::new(Self {
            batches: Mutex::new(batches.iter().map(|b| b.to_vec()).collect()),
            lost,
            reads: Notify::new(),
            gate: Semaphore::new(0),
            log: log.clone(),
        })
    }
}

fn note(log: &Mutex<Vec<String>>, line: String) {
    log.lock().unwrap().push(line);
}

#[async_trait]
impl Source for Batches {
    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        self.reads.notify_one();
        let Some(batch) = self.batches.lock().unwrap().pop_front() else {
            if self.lost {
                return Err(ConnectorError::Closed("the server dropped it".into()));
            }
            return std::future::pending().await;
        };
        Ok(batch
            .into_iter()
            .map(|n| Record {
                message: Message::new(json!({ "n": n })),
                position: Position::Column(n.to_string()),
            })
            .collect())
    }

    async fn commit(&self, done: &[Position]) -> Result<(), ConnectorError> {
        let last = match done.last() {
            Some(Position::Column(n)) => n.clone(),
            other => panic!("{other:?}"),
        };
        note(&self.log, format!("commit {last} starts"));
        self.gate.acquire().await.unwrap().forget();
        note(&self.log, format!("commit {last} ends"));
        Ok(())
    }

    fn resume_text(&self, done: &[Position]) -> Option<String> {
        match done.last() {
            Some(Position::Column(n)) => Some(format!("after {n}")),
            _ => None,
        }
    }
}

/// Notes each write by its last message, or does what `writes` says.
struct Written {
    log: Arc<Mutex<Vec<String>>>,
    writes: Writes,
}

enum Writes {
    Done,
    /// Never finishes.
    Stuck,
    /// Its connection is gone.
    Lost,
    /// Busy (a transient failure) this many more times.
    Busy(std::sync::atomic::AtomicUsize),
}

#[async_trait]
impl Sink for Written {
    fn target(&self) -> &str {
        "the test"
    }

    async fn write(&self, batch: &[Message]) -> Result<(), ConnectorError> {
        match self.writes {
            Writes::Done => {}
            Writes::Stuck => return std::future::pending().await,
            Writes::Lost => return Err(ConnectorError::Closed("the server dropped it".into())),
            Writes::Busy(ref left) => {
                let busy = left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok();
                if busy {
                    return Err(ConnectorError::Transient("the server is busy".into()));
                }
            }
        }
        let last = batch.last().map(|m| m.data["n"].to_string()).unwrap_or_default();
        note(&self.log, format!("write {last}"));
        Ok(())
    }

    async fn write_at(&self, batch: &[Message], position: Option<&str>) -> Result<(), ConnectorError> {
        self.write(batch).await?;
        if let Some(position) = position {
            note(&self.log, format!("stored {position}"));
        }
        Ok(())
    }
}

/// A pipeline from `source` to a [`Written`] sink noting into `log`.
fn pipeline(
    source: Arc<Batches>,
    log: &Arc<Mutex<Vec<String>>>,
    writes: Writes,
    buffer: usize,
    batch: usize,
) -> Pipeline {
    Pipeline {
        source,
        exactly_once: None,
        transforms: Arc::from(Vec::new()),
        main: Box::new(Written {
            log: log.clone(),
            writes,
        }),
        routes: Vec::new(),
        errors: None,
        buffer,
        batch,
        stats: Arc::default(),
    }
}

/// Waits until `log` holds `line`.
async fn logged(log: &Mutex<Vec<String>>, line: &str) {
    timeout(WAIT, async {
        while !log.lock().unwrap().iter().any(|l| l == line) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{line:?} never happened: {:?}", log.lock().unwrap()));
}

/// Runs `flow` until it ends by itself.
async fn run_to_end(flow: Pipeline) -> Result<(), ConnectorError> {
    let (_stop, shutdown) = watch::channel(false);
    timeout(WAIT, flow.run(shutdown)).await.expect("the run ended")
}

#[tokio::test]
async fn the_next_read_starts_while_a_batch_is_still_being_handed_on() {
    let log = Arc::default();
    let source = Batches::new(&[&[1, 2, 3, 4, 5]], &log);
    // The sink never finishes and the channel holds one record, so the
    // first batch can never be handed on whole.
    let flow = pipeline(source.clone(), &log, Writes::Stuck, 1, 5);
    let (_stop, shutdown) = watch::channel(false);
    let run = tokio::spawn(flow.run(shutdown));
    source.reads.notified().await;
    timeout(WAIT, source.reads.notified())
        .await
        .expect("the second read started before the first batch was handed on");
    run.abort();
}

#[tokio::test]
async fn a_batch_is_written_while_the_one_before_commits_and_commits_keep_their_order() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let source = Batches::new(&[&[1], &[2], &[3]], &log);
    let flow = pipeline(source.clone(), &log, Writes::Done, 8, 1);
    let (stop, shutdown) = watch::channel(false);
    let run = tokio::spawn(flow.run(shutdown));
    // Batch 2 is written while batch 1's commit cannot end.
    logged(&log, "commit 1 starts").await;
    logged(&log, "write 2").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !log.lock().unwrap().iter().any(|l| l == "commit 2 starts"),
        "a commit began before the one before it ended: {:?}",
        log.lock().unwrap()
    );
    source.gate.add_permits(1);
    logged(&log, "commit 2 starts").await;
    logged(&log, "write 3").await;
    // Stopped while a commit waits: the run ends only once the last
    // written batch is committed.
    stop.send_replace(true);
    source.gate.add_permits(1);
    logged(&log, "commit 3 starts").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!run.is_finished(), "the run ended before its last commit");
    source.gate.add_permits(1);
    timeout(WAIT, run).await.unwrap().unwrap().unwrap();
    let commits: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("commit"))
        .cloned()
        .collect();
    assert_eq!(
        commits,
        [
            "commit 1 starts",
            "commit 1 ends",
            "commit 2 starts",
            "commit 2 ends",
            "commit 3 starts",
            "commit 3 ends"
        ]
    );
}

#[tokio::test]
async fn a_lost_connection_ends_the_run_for_its_supervisor_to_connect_again() {
    // The sink's connection is gone: the run ends instead of retrying on it.
    let log = Arc::default();
    let flow = pipeline(Batches::new(&[&[1]], &log), &log, Writes::Lost, 8, 1);
    let outcome = run_to_end(flow).await;
    assert!(matches!(outcome, Err(ConnectorError::Closed(_))), "{outcome:?}");

    // The source's: the batch read before is written and committed, then
    // the run ends with the reader's error.
    let source = Batches::then_lost(&[&[1, 2]], &log);
    // Whether the reader's batch is written as one or two.
    source.gate.add_permits(2);
    let flow = pipeline(source, &log, Writes::Done, 8, 2);
    let outcome = run_to_end(flow).await;
    assert!(matches!(outcome, Err(ConnectorError::Closed(_))), "{outcome:?}");
    let log = log.lock().unwrap();
    assert!(
        ["write 2", "commit 2 ends"]
            .iter()
            .all(|l| log.iter().any(|got| got == l)),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_write_being_retried_is_reported_until_it_succeeds() {
    let log = Arc::default();
    let source = Batches::new(&[&[1]], &log);
    source.gate.add_permits(1);
    let busy = Writes::Busy(std::sync::atomic::AtomicUsize::new(2));
    let flow = pipeline(source, &log, busy, 8, 1);
    let stats = flow.stats.clone();
    let (_stop, shutdown) = watch::channel(false);
    let run = tokio::spawn(flow.run(shutdown));
    // What the supervisor shows in the dataflow's status, while retried.
    timeout(WAIT, async {
        while stats.write_failure().is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the failing write reported");
    assert_eq!(
        stats.write_failure().as_deref(),
        Some("writing to the test fails: the server is busy")
    );
    logged(&log, "write 1").await;
    assert_eq!(stats.write_failure(), None, "cleared once the write succeeds");
    run.abort();
}

/// A transformation with a bug.
struct Panics;

impl Transform for Panics {
    fn apply(&self, _: Message) -> Vec<Message> {
        panic!("a bug in a transformation")
    }
}

#[tokio::test]
async fn a_reader_that_panics_fails_the_run_instead_of_ending_it_quietly() {
    let log = Arc::default();
    let mut flow = pipeline(Batches::new(&[&[1]], &log), &log, Writes::Done, 8, 1);
    flow.transforms = Arc::from(vec![Box::new(Panics) as Box<dyn Transform>]);
    let outcome = run_to_end(flow).await;
    assert!(
        matches!(&outcome, Err(ConnectorError::Transient(m)) if m.contains("the reader stopped")),
        "{outcome:?}"
    );
}

/// Gives batches of ten 256 KiB messages, up to `left` of them, counting
/// what it handed out.
struct Large {
    left: Mutex<usize>,
    handed: std::sync::atomic::AtomicUsize,
}

const LARGE: usize = 256 << 10;

#[async_trait]
impl Source for Large {
    async fn read(&self) -> Result<Vec<Record>, ConnectorError> {
        let n = {
            let mut left = self.left.lock().unwrap();
            let n = (*left).min(10);
            *left -= n;
            n
        };
        if n == 0 {
            return std::future::pending().await;
        }
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                message: Message::new(json!({ "blob": "x".repeat(LARGE) })),
                position: Position::Column(i.to_string()),
            })
            .collect();
        self.handed
            .fetch_add(records.iter().map(|r| r.message.approx_size()).sum(), Ordering::SeqCst);
        Ok(records)
    }

    async fn commit(&self, _: &[Position]) -> Result<(), ConnectorError> {
        Ok(())
    }
}

#[tokio::test]
async fn large_messages_stop_the_reader_at_the_memory_budget_not_at_the_channels_count() {
    // 2,000 messages of 256 KiB (500 MiB) fit a channel of 4,000 messages;
    // the sink never finishes, so nothing is ever given back.
    let source = Arc::new(Large {
        left: Mutex::new(2_000),
        handed: Default::default(),
    });
    let log = Arc::default();
    let mut flow = pipeline(Batches::new(&[], &log), &log, Writes::Stuck, 4_000, 1_000);
    flow.source = source.clone();
    let (_stop, shutdown) = watch::channel(false);
    let run = tokio::spawn(flow.run(shutdown));
    // Until the reader stops reading.
    let mut before = usize::MAX;
    while source.handed.load(Ordering::SeqCst) != before {
        before = source.handed.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    run.abort();
    // The budget, the batch the reader waits with and the one read ahead.
    let batch = 10 * (LARGE + 200);
    assert!(
        before <= MEMORY_BUDGET + 2 * batch,
        "{before} bytes read while the sink took nothing"
    );
    assert!(before >= MEMORY_BUDGET, "the reader stopped early: {before}");
}

/// Exactly once: each batch's write carries the source's position after
/// it, with the source's digest before it, and the write comes before the
/// batch's commit to the source.
#[tokio::test]
async fn an_exactly_once_sink_stores_each_batchs_position_with_it() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let source = Batches::new(&[&[1, 2], &[3]], &log);
    source.gate.add_permits(8);
    let mut flow = pipeline(source, &log, Writes::Done, 8, 2);
    flow.exactly_once = Some("digest ".into());
    let (stop, shutdown) = watch::channel(false);
    let run = tokio::spawn(flow.run(shutdown));
    logged(&log, "commit 3 ends").await;
    stop.send_replace(true);
    let _ = run.await;
    let log = log.lock().unwrap().clone();
    let at = |line: &str| {
        log.iter()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line}: {log:?}"))
    };
    assert!(at("write 2") < at("stored digest after 2"));
    assert!(at("stored digest after 2") < at("commit 2 starts"));
    assert!(at("stored digest after 3") < at("commit 3 starts"));
}
