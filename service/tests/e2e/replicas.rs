//! Three `sless queue` replicas of one queue service, as separate processes
//! on loopback: any replica serves a request (a follower passes it to the
//! leader); `kill -9` of the leader under a producer loses no acknowledged
//! message, another replica leads within seconds, and the killed one
//! rejoins from its files and serves again.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::common::terminate;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Replicas {
    dir: std::path::PathBuf,
    sqs: Vec<u16>,
    peers: String,
    children: Vec<Option<Child>>,
}

impl Replicas {
    fn start() -> Self {
        // One directory for each set: the tests of this file run at once.
        static SETS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sless-replicas-{}-{set}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sqs: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let peers = (1..=3)
            .map(|id| format!("{id}=127.0.0.1:{}", free_port()))
            .collect::<Vec<_>>()
            .join(",");
        let mut replicas = Self {
            dir,
            sqs,
            peers,
            children: vec![None, None, None],
        };
        for id in 1..=3 {
            replicas.spawn(id);
        }
        replicas
    }

    /// Starts replica `id` (1-based) from its files.
    fn spawn(&mut self, id: usize) {
        // Its warnings, for a test to read.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{id}.stderr")))
            .unwrap();
        let child = self.command(id).stderr(log).spawn().unwrap();
        self.children[id - 1] = Some(child);
    }

    fn command(&self, id: usize) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sless"));
        command
            .args(["queue", "--listen", &format!("127.0.0.1:{}", self.sqs[id - 1])])
            .arg("--data-dir")
            .arg(self.dir.join(id.to_string()))
            .args(["--peers", &self.peers, "--replica-id", &id.to_string()])
            .env("SLESS_PEER_TOKEN", "the-replicas-token")
            .env("SLESS_LOG", "warn")
            .stdout(Stdio::null());
        command
    }

    fn kill9(&mut self, id: usize) {
        if let Some(mut child) = self.children[id - 1].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn url(&self, id: usize) -> String {
        format!("http://127.0.0.1:{}/", self.sqs[id - 1])
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            terminate(child);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One SQS call (JSON protocol) to `url`: the answer, or its status and body.
async fn call(http: &reqwest::Client, url: &str, action: &str, body: Value) -> Result<Value, String> {
    let response = http
        .post(url)
        .header("x-amz-target", format!("AmazonSQS.{action}"))
        .header("content-type", "application/x-amz-json-1.0")
        .body(body.to_string())
        .timeout(Duration::from_secs(25))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        Err(format!("{status} {text}"))
    }
}

/// Calls `action` on each replica of `ids` in turn until one answers.
async fn call_any(http: &reqwest::Client, replicas: &Replicas, ids: &[usize], action: &str, body: Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for id in ids {
            if let Ok(answer) = call(http, &replicas.url(*id), action, body.clone()).await {
                return answer;
            }
        }
        assert!(Instant::now() < deadline, "no replica answered {action}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_keep_every_acknowledged_message_across_a_killed_leader() {
    let mut replicas = Replicas::start();
    let http = reqwest::Client::new();
    let created = call_any(
        &http,
        &replicas,
        &[2, 3, 1],
        "CreateQueue",
        json!({"QueueName": "jobs"}),
    )
    .await;
    let queue = created["QueueUrl"].as_str().unwrap().to_owned();
    // The peer port takes nothing without the replicas' token.
    let peer = replicas
        .peers
        .split(',')
        .nth(1)
        .unwrap()
        .split_once('=')
        .unwrap()
        .1
        .to_owned();
    for token in [None, Some("the-wrong-token-entirely")] {
        let mut request = http.post(format!("http://{peer}/request")).json(&json!({
            "action": "DeleteQueue", "input": {"QueueUrl": queue}
        }));
        if let Some(token) = token {
            request = request.header("x-sless-peer-token", token);
        }
        assert_eq!(request.send().await.unwrap().status(), 403, "token {token:?}");
    }
    // Replica 1 started the queue service and leads it; the producer sends
    // through the followers, so every send is passed on.
    let mut acknowledged = BTreeSet::new();
    let mut failed = 0;
    let mut killed_at = None;
    let mut failover = None;
    let started = Instant::now();
    for n in 0..600 {
        if n == 200 {
            replicas.kill9(1);
            killed_at = Some(Instant::now());
        }
        let url = replicas.url(2 + n % 2);
        let body = json!({"QueueUrl": queue, "MessageBody": format!("m{n}")});
        match call(&http, &url, "SendMessage", body).await {
            Ok(_) => {
                acknowledged.insert(format!("m{n}"));
                if let (Some(at), None) = (killed_at, failover) {
                    failover = Some(at.elapsed());
                }
            }
            Err(_) => {
                failed += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let failover = failover.expect("no send was acknowledged after the leader was killed");
    eprintln!(
        "{} sends acknowledged, {failed} failed, in {:?}; failover (leader killed -> first acknowledged send): {failover:?}",
        acknowledged.len(),
        started.elapsed()
    );
    assert!(failover < Duration::from_secs(10), "failover took {failover:?}");
    // The killed replica rejoins from its files and serves again.
    replicas.spawn(1);
    assert_received(&http, &replicas, &queue, &acknowledged).await;
    // The rejoined replica answers from the same queues.
    let attributes = call(
        &http,
        &replicas.url(1),
        "GetQueueAttributes",
        json!({"QueueUrl": queue, "AttributeNames": ["ApproximateNumberOfMessages"]}),
    )
    .await
    .unwrap();
    assert_eq!(attributes["Attributes"]["ApproximateNumberOfMessages"], "0");

    // Replica 1 loses its files: it must not start the queue service anew
    // beside the replicas that hold it.
    replicas.kill9(1);
    std::fs::remove_dir_all(replicas.dir.join("1")).unwrap();
    let mut again = replicas.command(1).stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = again.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            again.kill().unwrap();
            panic!("replica 1 without files started beside the replicas that hold the queue service");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut again.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("holds the queue service"), "{stderr}");
}

/// Receives and deletes until the queue is empty, then checks that every
/// `acknowledged` send was received (sends that failed may have been kept
/// too, as SQS's at-least-once allows).
async fn assert_received(http: &reqwest::Client, replicas: &Replicas, queue: &str, acknowledged: &BTreeSet<String>) {
    let mut received = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut empty = false;
    while !(empty && acknowledged.is_subset(&received)) && Instant::now() < deadline {
        let answer = call_any(
            http,
            replicas,
            &[1, 2, 3],
            "ReceiveMessage",
            json!({"QueueUrl": queue, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
        )
        .await;
        let mut receipts = Vec::new();
        empty = answer["Messages"].as_array().is_none_or(Vec::is_empty);
        for m in answer["Messages"].as_array().into_iter().flatten() {
            received.insert(m["Body"].as_str().unwrap().to_owned());
            receipts.push(json!({"Id": receipts.len().to_string(), "ReceiptHandle": m["ReceiptHandle"]}));
        }
        if !receipts.is_empty() {
            call_any(
                http,
                replicas,
                &[1, 2, 3],
                "DeleteMessageBatch",
                json!({"QueueUrl": queue, "Entries": receipts}),
            )
            .await;
        }
    }
    let lost: Vec<_> = acknowledged.difference(&received).collect();
    assert!(lost.is_empty(), "{} acknowledged sends were lost: {lost:?}", lost.len());
}

/// What replica `id` says of the queue service on its peer port.
async fn raft_status(http: &reqwest::Client, replicas: &Replicas, id: usize) -> Option<Value> {
    let addr = replicas.peers.split(',').nth(id - 1)?.split_once('=')?.1.to_owned();
    let response = http
        .get(format!("http://{addr}/raft/status"))
        .header("x-sless-peer-token", "the-replicas-token")
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    response.json().await.ok()
}

/// SIGTERM to the leader while four producers send through the followers:
/// the leader hands its leadership over before it stops, the requests it
/// held or was passed meanwhile go to its successor, and no call fails.
/// The longest pause in acknowledgements is printed: a leader that stopped
/// without handing over would leave 1.5-2 s of election timeout (the test
/// fails on a failed call, not on the pause, which depends on the machine).
/// Then a leader no request reached in its term, stopped a moment after
/// its election, hands over as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_and_no_call_fails() {
    let mut replicas = Replicas::start();
    let http = reqwest::Client::new();
    let created = call_any(
        &http,
        &replicas,
        &[1, 2, 3],
        "CreateQueue",
        json!({"QueueName": "handover"}),
    )
    .await;
    let queue = created["QueueUrl"].as_str().unwrap().to_owned();
    let settled = Instant::now() + Duration::from_secs(30);
    let (leader, term) = loop {
        if let Some(status) = raft_status(&http, &replicas, 1).await
            && let Some(leader) = status["leader"].as_u64()
            && status["voters"].as_array().is_some_and(|v| v.len() == 3)
        {
            break (leader as usize, status["term"].as_u64().unwrap());
        }
        assert!(Instant::now() < settled, "the replicas settled on no leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let followers: Vec<usize> = (1..=3).filter(|id| *id != leader).collect();
    // A follower's answers say so, for the gateways to learn the leader.
    for id in 1..=3 {
        let answered = http
            .post(replicas.url(id))
            .header("x-amz-target", "AmazonSQS.ListQueues")
            .header("content-type", "application/x-amz-json-1.0")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(answered.status(), 200);
        assert_eq!(
            answered.headers().contains_key("x-sless-follower"),
            id != leader,
            "replica {id}"
        );
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let (http, stop, queue) = (http.clone(), stop.clone(), queue.clone());
            let url = replicas.url(followers[p % 2]);
            tokio::spawn(async move {
                let (mut acked, mut failed) = (Vec::new(), Vec::new());
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let body = format!("p{p}-{n}");
                    let sent = json!({"QueueUrl": queue, "MessageBody": body});
                    match call(&http, &url, "SendMessage", sent).await {
                        Ok(_) => acked.push((body, Instant::now())),
                        Err(e) => failed.push(format!("{body}: {e}")),
                    }
                    n += 1;
                }
                (acked, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stopped_at = Instant::now();
    let mut child = replicas.children[leader - 1].take().unwrap();
    let status = tokio::task::spawn_blocking(move || terminate(&mut child))
        .await
        .unwrap();
    let stopped_in = stopped_at.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut acked, mut failed) = (Vec::new(), Vec::new());
    for producer in producers {
        let (a, f) = producer.await.unwrap();
        acked.extend(a);
        failed.extend(f);
    }
    acked.sort_by_key(|(_, at)| *at);
    let pause = acked
        .iter()
        .map(|(_, at)| *at)
        .filter(|at| *at >= stopped_at)
        .fold((stopped_at, Duration::ZERO), |(last, longest), at| {
            (at, longest.max(at - last))
        })
        .1;
    let now = raft_status(&http, &replicas, followers[0]).await.unwrap();
    eprintln!(
        "leader {leader} (term {term}) stopped in {stopped_in:?}; replica {} leads in term {}; {} sends acknowledged, \
         {} failed; longest pause in acknowledgements after SIGTERM: {pause:?}",
        now["leader"],
        now["term"],
        acked.len(),
        failed.len()
    );
    assert!(status.success(), "the leader did not stop cleanly: {status:?}");
    assert!(
        failed.is_empty(),
        "{} calls failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(followers.contains(&(now["leader"].as_u64().unwrap() as usize)), "{now}");
    replicas.spawn(leader);
    let acknowledged = acked.into_iter().map(|(body, _)| body).collect();
    assert_received(&http, &replicas, &queue, &acknowledged).await;

    // A leader no request reached in its term hands over too (it counts
    // its lease from its stop): stop the leader, then at once its
    // successor, elected a moment ago and sent nothing since.
    let now = now["leader"].as_u64().unwrap() as usize;
    let settled = Instant::now() + Duration::from_secs(30);
    while raft_status(&http, &replicas, leader)
        .await
        .is_none_or(|s| s["leader"].as_u64() != Some(now as u64))
    {
        assert!(Instant::now() < settled, "replica {leader} did not rejoin");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut child = replicas.children[now - 1].take().unwrap();
    assert!(
        tokio::task::spawn_blocking(move || terminate(&mut child))
            .await
            .unwrap()
            .success()
    );
    let successor = raft_status(&http, &replicas, leader).await.unwrap()["leader"]
        .as_u64()
        .unwrap() as usize;
    assert_ne!(successor, now);
    let mut child = replicas.children[successor - 1].take().unwrap();
    assert!(
        tokio::task::spawn_blocking(move || terminate(&mut child))
            .await
            .unwrap()
            .success()
    );
    let log = std::fs::read_to_string(replicas.dir.join(format!("{successor}.stderr"))).unwrap();
    assert!(
        !log.contains("took the leadership over"),
        "the idle leader did not hand over:\n{log}"
    );
}
