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
        let dir = std::env::temp_dir().join(format!("sless-replicas-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
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
        let child = self.command(id).stderr(Stdio::null()).spawn().unwrap();
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
    // Everything is received (sends that failed may have been kept too, as
    // SQS's at-least-once allows) until the queue is empty.
    let mut received = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut empty = false;
    while !(empty && acknowledged.is_subset(&received)) && Instant::now() < deadline {
        let answer = call_any(
            &http,
            &replicas,
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
                &http,
                &replicas,
                &[1, 2, 3],
                "DeleteMessageBatch",
                json!({"QueueUrl": queue, "Entries": receipts}),
            )
            .await;
        }
    }
    let lost: Vec<_> = acknowledged.difference(&received).collect();
    assert!(lost.is_empty(), "{} acknowledged sends were lost: {lost:?}", lost.len());
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
