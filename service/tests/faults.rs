//! The Jepsen-style fault test of a replicated queue service: three
//! `sless queue` replicas, each a process in a network namespace of its
//! own with its own address. Clients in the test send, receive and delete
//! on a standard and a FIFO queue through every replica in turn while a
//! nemesis kills (-9) the leader or a follower, or cuts the leader or a
//! follower off from the other two (silently: its packets go nowhere), and
//! heals. Each operation's invocation and outcome (ok, failed, unknown) is
//! recorded; after the faults the queues are drained, and
//! `sless_testkit::history::check` reads the history and decides.
//!
//! Prints the counts and the failover times (a leader killed or cut off
//! → the first acknowledged send invoked after). `SLESS_FAULTS` sets the
//! number of faults (default 24: six of each kind), `SLESS_FAULTS_LOG` the replicas'
//! `SLESS_LOG` (default warn), and `SLESS_FAULTS_KEEP` a directory to keep
//! their logs in. Needs root (network namespaces).

use std::io::Write;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sless_testkit::TempDir;
use sless_testkit::history::{self, At, Delete, Delivery, Fifo, History, Outcome, Send};
use sless_testkit::netns::Network;

const SQS_PORT: u16 = 9324;
const PEER_PORT: u16 = 9325;
const TOKEN: &str = "the-fault-test-replicas-token";
/// The visibility timeout of every receive.
const VISIBILITY: Duration = Duration::from_secs(20);
/// A client gives up on a request after this long: its outcome is unknown.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a fault lasts before it is healed, and how long the replicas
/// then have before the next.
const HOLD: Duration = Duration::from_secs(5);
const RECOVER: Duration = Duration::from_secs(3);
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 6;
const FIFO_GROUPS: usize = 4;

struct Replicas {
    net: Network,
    dir: TempDir,
    peers: String,
    children: Vec<Option<Child>>,
}

impl Replicas {
    fn start() -> Self {
        let net = Network::new(3);
        let dir = TempDir::new("faults");
        let peers = (1..=3)
            .map(|i| format!("{i}={}:{PEER_PORT}", net.addr(i)))
            .collect::<Vec<_>>()
            .join(",");
        let mut replicas = Self {
            net,
            dir,
            peers,
            children: (0..3).map(|_| None).collect(),
        };
        for i in 1..=3 {
            replicas.spawn(i);
        }
        replicas
    }

    /// Starts replica `i` from its files, in its namespace.
    fn spawn(&mut self, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join(format!("{i}.log")))
            .unwrap();
        let child = self
            .net
            .command(i, env!("CARGO_BIN_EXE_sless"))
            .args(["queue", "--listen", &format!("{}:{SQS_PORT}", self.net.addr(i))])
            .arg("--data-dir")
            .arg(self.dir.0.join(i.to_string()))
            .args(["--peers", &self.peers, "--replica-id", &i.to_string()])
            .env("SLESS_PEER_TOKEN", TOKEN)
            .env(
                "SLESS_LOG",
                std::env::var("SLESS_FAULTS_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children[i - 1] = Some(child);
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut child) = self.children[i - 1].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self, i: usize) -> String {
        format!("http://{}:{SQS_PORT}/", self.net.addr(i))
    }

    /// The leader, once the replicas have settled: all three answer, name
    /// it at one term, are past any change of the voters, and have applied the log to within a few entries
    /// of each other (a restarted replica has caught up).
    async fn settled_leader(&self, http: &reqwest::Client) -> Option<usize> {
        let mut named = Vec::new();
        for i in 1..=3 {
            let status: Value = http
                .get(format!("http://{}:{PEER_PORT}/raft/status", self.net.addr(i)))
                .header("x-sless-peer-token", TOKEN)
                .timeout(Duration::from_millis(500))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let number = |field: &str| status[field].as_u64();
            if status["joint"] != false {
                return None;
            }
            named.push((number("term")?, number("leader")?, number("last_applied")?));
        }
        let (term, leader, _) = named[0];
        let applied = named.iter().map(|n| n.2);
        let behind = applied.clone().max()? - applied.min()?;
        (named.iter().all(|n| (n.0, n.1) == (term, leader)) && behind <= 50).then_some(leader as usize)
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for i in 1..=3 {
            self.kill9(i);
        }
        if let Ok(keep) = std::env::var("SLESS_FAULTS_KEEP") {
            for i in 1..=3 {
                let _ = std::fs::copy(self.dir.0.join(format!("{i}.log")), format!("{keep}/{i}.log"));
            }
        }
        if std::thread::panicking() {
            for i in 1..=3 {
                let log = std::fs::read_to_string(self.dir.0.join(format!("{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                eprintln!("--- replica {i}'s last log lines:");
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// What a client learnt of one request.
enum Answer {
    Ok(Value),
    Failed,
    Unknown,
}

impl Answer {
    fn outcome(&self) -> Outcome {
        match self {
            Answer::Ok(_) => Outcome::Ok,
            Answer::Failed => Outcome::Failed,
            Answer::Unknown => Outcome::Unknown,
        }
    }
}

/// A refusal that certainly took no effect: no connection, a request the
/// service rejected, or a replica that proposed nothing because it does
/// not lead or lost touch with the majority. A leader whose proposal was
/// cut from its log says "not the leader" too: with three voters such an
/// entry can never be committed (with five it could, Raft's figure 8).
fn refused_for_sure(status: reqwest::StatusCode, text: &str) -> bool {
    status.is_client_error()
        || [
            "not the queue service's leader",
            "electing a leader",
            "too many changes are waiting",
            "has not heard from most replicas",
        ]
        .iter()
        .any(|m| text.contains(m))
}

/// One SQS call (JSON protocol) to replica `url`.
async fn call(http: &reqwest::Client, url: &str, action: &str, body: &Value) -> Answer {
    let sent = http
        .post(url)
        .header("x-amz-target", format!("AmazonSQS.{action}"))
        .header("content-type", "application/x-amz-json-1.0")
        .body(body.to_string())
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    let response = match sent {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Answer::Failed,
        Err(_) => return Answer::Unknown,
    };
    let status = response.status();
    let Ok(text) = response.text().await else {
        return Answer::Unknown;
    };
    match serde_json::from_str(&text) {
        Ok(value) if status.is_success() => Answer::Ok(value),
        _ if refused_for_sure(status, &text) => Answer::Failed,
        _ => Answer::Unknown,
    }
}

/// What every client shares: the history, the clock, where the queues are.
struct Run {
    history: Mutex<History>,
    started: Instant,
    urls: Vec<String>,
    standard: String,
    fifo: String,
    stop: AtomicBool,
    http: reqwest::Client,
    /// The entries of acknowledged deletions that the service refused.
    refused_receipts: Mutex<Vec<Value>>,
}

impl Run {
    fn now(&self) -> At {
        self.started.elapsed()
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn record(&self, f: impl FnOnce(&mut History)) {
        f(&mut self.history.lock().unwrap());
    }

    /// Sends batches of ten unique bodies, each once, through the replicas
    /// in turn.
    async fn produce(&self, producer: usize) {
        let mut n = 0usize;
        let mut turn = producer;
        while !self.stopping() {
            let bodies: Vec<String> = (0..10).map(|k| format!("p{producer}-{}", n + k)).collect();
            n += 10;
            let entries: Vec<Value> = bodies
                .iter()
                .enumerate()
                .map(|(k, body)| json!({"Id": k.to_string(), "MessageBody": body}))
                .collect();
            let request = json!({"QueueUrl": self.standard, "Entries": entries});
            turn += 1;
            let invoked = self.now();
            let answer = call(&self.http, &self.urls[turn % 3], "SendMessageBatch", &request).await;
            let completed = self.now();
            let sends = bodies.into_iter().enumerate().map(|(k, body)| {
                let (outcome, message_id) = batch_entry(&answer, k);
                Send {
                    queue: self.standard.clone(),
                    body,
                    fifo: None,
                    invoked,
                    completed,
                    outcome,
                    message_id,
                }
            });
            self.record(|h| h.sends.extend(sends));
            if !matches!(answer, Answer::Ok(_)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Sends group `group`'s messages 0, 1, 2… in order, each retried
    /// with its deduplication id until acknowledged.
    async fn produce_fifo(&self, group: usize) {
        let group = format!("g{group}");
        let mut turn = 0usize;
        for seq in 0.. {
            if self.stopping() {
                return;
            }
            let body = format!("{group}:{seq}");
            let request = json!({
                "QueueUrl": self.fifo, "MessageBody": body, "MessageGroupId": group,
                "MessageDeduplicationId": format!("{group}-{seq}"),
            });
            loop {
                turn += 1;
                let invoked = self.now();
                let answer = call(&self.http, &self.urls[turn % 3], "SendMessage", &request).await;
                let message_id = match &answer {
                    Answer::Ok(v) => v["MessageId"].as_str().map(str::to_owned),
                    _ => None,
                };
                let send = Send {
                    queue: self.fifo.clone(),
                    body: body.clone(),
                    fifo: Some(Fifo {
                        group: group.clone(),
                        seq,
                    }),
                    invoked,
                    completed: self.now(),
                    outcome: answer.outcome(),
                    message_id,
                };
                self.record(|h| h.sends.push(send));
                if matches!(answer, Answer::Ok(_)) {
                    break;
                }
                if self.stopping() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Receives from `queue` and deletes what it got until stopped.
    async fn consume(&self, queue: &str, mut turn: usize) {
        while !self.stopping() {
            turn += 1;
            if self.receive_and_delete(queue, &self.urls[turn % 3]).await.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// One receive and the deletion of what it got: how many it got
    /// (none when the receive was not acknowledged).
    async fn receive_and_delete(&self, queue: &str, url: &str) -> Option<usize> {
        let request = json!({
            "QueueUrl": queue, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1,
            "VisibilityTimeout": VISIBILITY.as_secs(),
        });
        let invoked = self.now();
        let Answer::Ok(answer) = call(&self.http, url, "ReceiveMessage", &request).await else {
            return None;
        };
        let completed = self.now();
        let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
        let deliveries: Vec<Delivery> = messages
            .iter()
            .map(|m| Delivery {
                queue: queue.to_owned(),
                body: m["Body"].as_str().unwrap_or_default().to_owned(),
                message_id: m["MessageId"].as_str().unwrap_or_default().to_owned(),
                receipt: m["ReceiptHandle"].as_str().unwrap_or_default().to_owned(),
                invoked,
                completed,
            })
            .collect();
        if deliveries.is_empty() {
            return Some(0);
        }
        let entries: Vec<Value> = deliveries
            .iter()
            .enumerate()
            .map(|(k, d)| json!({"Id": k.to_string(), "ReceiptHandle": d.receipt}))
            .collect();
        let receipts: Vec<String> = deliveries.iter().map(|d| d.receipt.clone()).collect();
        self.record(|h| h.deliveries.extend(deliveries));
        let request = json!({"QueueUrl": queue, "Entries": entries});
        let answer = call(&self.http, url, "DeleteMessageBatch", &request).await;
        let completed = self.now();
        // A receipt handle stays valid across failovers: the service
        // never refuses one it gave (SQS deletes or ignores a stale one).
        if let Answer::Ok(value) = &answer
            && let Some(refused) = value["Failed"].as_array().filter(|f| !f.is_empty())
        {
            self.refused_receipts.lock().unwrap().extend(refused.iter().cloned());
        }
        let deletes = receipts.into_iter().enumerate().map(|(k, receipt)| Delete {
            queue: queue.to_owned(),
            receipt,
            completed,
            outcome: batch_entry(&answer, k).0,
        });
        self.record(|h| h.deletes.extend(deletes));
        Some(entries.len())
    }

    /// How many messages `queue` holds, visible, in flight or delayed.
    async fn held(&self, queue: &str) -> Option<u64> {
        let request = json!({"QueueUrl": queue, "AttributeNames": ["All"]});
        for url in &self.urls {
            if let Answer::Ok(answer) = call(&self.http, url, "GetQueueAttributes", &request).await {
                let count = |name: &str| {
                    answer["Attributes"][name]
                        .as_str()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(u64::MAX / 4)
                };
                return Some(
                    count("ApproximateNumberOfMessages")
                        + count("ApproximateNumberOfMessagesNotVisible")
                        + count("ApproximateNumberOfMessagesDelayed"),
                );
            }
        }
        None
    }

    /// Receives and deletes until `queue` holds nothing (messages whose
    /// receive was lost come back after their visibility timeout); fails
    /// when nothing was received for three visibility timeouts.
    async fn drain(&self, queue: &str, mut turn: usize) {
        let mut progress = Instant::now();
        loop {
            assert!(progress.elapsed() < VISIBILITY * 3, "{queue} was not drained");
            turn += 1;
            match self.receive_and_delete(queue, &self.urls[turn % 3]).await {
                Some(0) if self.held(queue).await == Some(0) => return,
                Some(n) if n > 0 => progress = Instant::now(),
                _ => {}
            }
        }
    }
}

/// The outcome of entry `k` of a batch call, and its message id.
fn batch_entry(answer: &Answer, k: usize) -> (Outcome, Option<String>) {
    let Answer::Ok(value) = answer else {
        return (answer.outcome(), None);
    };
    let id = k.to_string();
    let find = |list: &str| {
        value[list]
            .as_array()
            .and_then(|entries| entries.iter().find(|e| e["Id"] == id.as_str()).cloned())
    };
    match (find("Successful"), find("Failed")) {
        (Some(ok), _) => (Outcome::Ok, ok["MessageId"].as_str().map(str::to_owned)),
        (None, Some(_)) => (Outcome::Failed, None),
        (None, None) => (Outcome::Unknown, None),
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    KillLeader,
    CutLeader,
    KillFollower,
    CutFollower,
}

impl Fault {
    const ALL: [Fault; 4] = [
        Fault::KillLeader,
        Fault::CutFollower,
        Fault::CutLeader,
        Fault::KillFollower,
    ];

    fn of_leader(self) -> bool {
        matches!(self, Fault::KillLeader | Fault::CutLeader)
    }
}

/// Waits for a settled leader, the same twice half a second apart (a
/// replica cut off and healed disrupts its leader as it rejoins: openraft
/// 0.9 has no pre-vote).
async fn settled_leader(replicas: &Replicas, http: &reqwest::Client) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    loop {
        let leader = replicas.settled_leader(http).await;
        if leader.is_some() && leader == last {
            return leader.unwrap_or_default();
        }
        last = leader;
        assert!(
            Instant::now() < deadline,
            "the replicas did not settle on a leader in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Injects `faults` faults one after another, each healed before the
/// next: the kind of each and when it began.
async fn nemesis(replicas: &mut Replicas, run: &Run, faults: usize) -> Vec<(Fault, At)> {
    let mut done = Vec::new();
    for n in 0..faults {
        let fault = Fault::ALL[n % Fault::ALL.len()];
        let leader = settled_leader(replicas, &run.http).await;
        let target = if fault.of_leader() {
            leader
        } else {
            // Each follower in turn.
            [1, 2, 3].into_iter().filter(|i| *i != leader).nth(n / 4 % 2).unwrap()
        };
        match fault {
            Fault::KillLeader | Fault::KillFollower => replicas.kill9(target),
            Fault::CutLeader | Fault::CutFollower => replicas.net.isolate(target),
        }
        // From when the fault is whole (a cut takes a few `ip` calls).
        let at = run.now();
        let _ = writeln!(
            std::io::stderr(),
            "{at:?} {fault:?} of replica {target} (leader {leader})"
        );
        tokio::time::sleep(HOLD).await;
        match fault {
            Fault::KillLeader | Fault::KillFollower => replicas.spawn(target),
            Fault::CutLeader | Fault::CutFollower => replicas.net.heal(),
        }
        done.push((fault, at));
        tokio::time::sleep(RECOVER).await;
    }
    done
}

/// For each fault of the leader: from its start to the first acknowledged
/// send invoked after it.
fn failovers(history: &History, faults: &[(Fault, At)]) -> Vec<(Fault, Duration)> {
    faults
        .iter()
        .filter(|(fault, _)| fault.of_leader())
        .filter_map(|(fault, at)| {
            let first = history
                .sends
                .iter()
                .filter(|s| s.outcome == Outcome::Ok && s.invoked >= *at)
                .map(|s| s.completed - *at)
                .min()?;
            Some((*fault, first))
        })
        .collect()
}

async fn create_queue(run: &Run, body: Value) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut turn = 0;
    loop {
        turn += 1;
        if let Answer::Ok(answer) = call(&run.http, &run.urls[turn % 3], "CreateQueue", &body).await {
            return answer["QueueUrl"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no replica created a queue");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_message_is_lost_and_no_deleted_one_returns_across_kills_and_partitions() {
    let faults: usize = std::env::var("SLESS_FAULTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut replicas = Replicas::start();
    let mut run = Run {
        history: Mutex::new(History::default()),
        started: Instant::now(),
        urls: (1..=3).map(|i| replicas.url(i)).collect(),
        standard: String::new(),
        fifo: String::new(),
        stop: AtomicBool::new(false),
        refused_receipts: Mutex::new(Vec::new()),
        http: reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    };
    run.standard = create_queue(&run, json!({"QueueName": "jobs"})).await;
    run.fifo = create_queue(
        &run,
        json!({"QueueName": "orders.fifo", "Attributes": {"FifoQueue": "true"}}),
    )
    .await;
    let run = Arc::new(run);
    let mut clients = Vec::new();
    for p in 0..PRODUCERS {
        let run = run.clone();
        clients.push(tokio::spawn(async move { run.produce(p).await }));
    }
    for g in 0..FIFO_GROUPS {
        let run = run.clone();
        clients.push(tokio::spawn(async move { run.produce_fifo(g).await }));
    }
    for c in 0..CONSUMERS {
        let run = run.clone();
        let queue = run.standard.clone();
        clients.push(tokio::spawn(async move { run.consume(&queue, c).await }));
    }
    {
        let run = run.clone();
        let queue = run.fifo.clone();
        clients.push(tokio::spawn(async move { run.consume(&queue, 0).await }));
    }

    let done = nemesis(&mut replicas, &run, faults).await;
    run.stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    settled_leader(&replicas, &run.http).await;
    let backlog = run.held(&run.standard).await;
    let mut drains = Vec::new();
    for (c, queue) in [&run.standard, &run.standard, &run.standard, &run.fifo]
        .into_iter()
        .enumerate()
    {
        let run = run.clone();
        let queue = queue.clone();
        drains.push(tokio::spawn(async move { run.drain(&queue, c).await }));
    }
    for drain in drains {
        drain.await.unwrap();
    }

    let history = run.history.lock().unwrap();
    let report = history::check(&history, VISIBILITY);
    let each = failovers(&history, &done);
    let mut failover: Vec<Duration> = each.iter().map(|(_, d)| *d).collect();
    failover.sort();
    let leader_faults = done.iter().filter(|(f, _)| f.of_leader()).count();
    let summary = format!(
        "fault test: {} faults ({leader_faults} of the leader) in {:.0?}; sends {} acknowledged, {} unknown, {} \
         failed; {} deliveries ({backlog:?} left at the end); {} violations; failover p50 {:?}, max {:?} (all: {:?})",
        done.len(),
        run.now(),
        report.acknowledged,
        report.unknown,
        report.failed,
        report.deliveries,
        report.violations.len(),
        failover.get(failover.len() / 2),
        failover.last(),
        each,
    );
    // Past the harness's capture: CI's log shows the figures.
    let _ = writeln!(std::io::stderr(), "{summary}");
    for violation in report.violations.iter().take(20) {
        let _ = writeln!(std::io::stderr(), "violation: {violation:?}");
    }
    assert!(report.is_valid(), "{summary}");
    let refused = run.refused_receipts.lock().unwrap();
    assert!(
        refused.is_empty(),
        "receipt handles refused: {:?}",
        &refused[..refused.len().min(5)]
    );
    assert!(done.len() >= faults);
    assert_eq!(
        failover.len(),
        leader_faults,
        "a leader fault had no acknowledged send after it"
    );
    assert!(
        failover.last().is_some_and(|max| *max < Duration::from_secs(10)),
        "{summary}"
    );
    // A run that acknowledged little proves little.
    assert!(report.acknowledged >= 10_000, "{summary}");
}
