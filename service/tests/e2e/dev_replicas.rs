//! `sless dev --replicas 3`: a queue service's engine runs as three
//! `sless queue` processes. Each can be killed with `kill -9` in turn while
//! a tenant sends: the others go on serving and `sless dev` starts it
//! again. The service shrinks to one engine in place and grows back to
//! three without losing a message, and the replicas end with `sless dev`,
//! even when it is killed with `kill -9`; started again, it serves what
//! they held.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::sqs::call;
use crate::common::{Client, DevServer, TOKEN_A, TempDir};

/// The `sless queue` processes whose parent is `parent`.
fn replicas_of(parent: u32) -> BTreeSet<u32> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let queue = cmdline.split(|b| *b == 0).nth(1) == Some(b"queue".as_slice());
        if ppid == Some(parent) && queue {
            found.insert(pid);
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

async fn eventually(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The queue service once Ready with `replicas`.
async fn ready_with(client: &Client, replicas: u64) -> Value {
    let mut view = Value::Null;
    eventually(&format!("Ready with {replicas} replicas"), async || {
        view = client.get("/api/v1/queue-services/jobs").await.1;
        view["phase"] == "Ready" && view["replicas"] == replicas
    })
    .await;
    view
}

/// A tenant's SQS calls, retried while the service answers a retryable
/// error (as the SDKs do); the bodies of sends it acknowledged.
struct Tenant {
    endpoint: String,
    view: Value,
    queue: String,
    acked: BTreeSet<String>,
}

impl Tenant {
    async fn call(&self, action: &str, body: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, text) = call(&self.endpoint, &self.view, action, body.clone()).await;
            if status == 200 {
                return serde_json::from_str(&text).unwrap();
            }
            assert!(status >= 500 && Instant::now() < deadline, "{action}: {status} {text}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn send(&mut self, bodies: std::ops::Range<u32>) {
        for i in bodies {
            let body = format!("m{i}");
            self.call("SendMessage", json!({"QueueUrl": self.queue, "MessageBody": body}))
                .await;
            self.acked.insert(body);
        }
    }

    /// Receives and deletes until the queue is empty: the bodies received.
    async fn drain(&self) -> BTreeSet<String> {
        let mut received = BTreeSet::new();
        loop {
            let answer = self
                .call(
                    "ReceiveMessage",
                    json!({"QueueUrl": self.queue, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
                )
                .await;
            let messages = answer["Messages"].as_array().cloned().unwrap_or_default();
            if messages.is_empty() {
                return received;
            }
            for m in messages {
                received.insert(m["Body"].as_str().unwrap().to_owned());
                self.call(
                    "DeleteMessage",
                    json!({"QueueUrl": self.queue, "ReceiptHandle": m["ReceiptHandle"]}),
                )
                .await;
            }
        }
    }
}

#[tokio::test]
async fn three_replicas_survive_kill_9_in_turn_and_change_in_place() {
    let dir = TempDir::new("dev-replicas");
    let server = DevServer::start_with(&dir.0, "127.0.0.1:0", &["--replicas", "3"]);
    let a = server.client(TOKEN_A);
    let (status, created) = a.post("/api/v1/queue-services", json!({"name": "jobs"})).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["replicas"], 3, "the platform's default: --replicas 3");
    let view = ready_with(&a, 3).await;
    let processes = replicas_of(server.pid());
    assert_eq!(processes.len(), 3, "three sless queue processes: {processes:?}");
    let endpoint = view["endpoint"].as_str().unwrap().to_owned();
    let mut tenant = Tenant {
        endpoint,
        view,
        queue: String::new(),
        acked: BTreeSet::new(),
    };
    let created = tenant.call("CreateQueue", json!({"QueueName": "work"})).await;
    tenant.queue = created["QueueUrl"].as_str().unwrap().to_owned();
    tenant.send(0..20).await;

    // Each replica killed in turn: the service goes on, and the killed one
    // is started again before the next goes.
    for (round, pid) in processes.iter().enumerate() {
        assert!(
            std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        let from = 20 + 20 * round as u32;
        tenant.send(from..from + 20).await;
        eventually("the killed replica to be started again", async || {
            let now = replicas_of(server.pid());
            now.len() == 3 && !now.contains(pid)
        })
        .await;
    }

    // Wrong values are refused with the field named.
    let (status, refused) = a.patch("/api/v1/queue-services/jobs", json!({"replicas": 2})).await;
    assert_eq!(status, 422, "{refused}");
    assert!(refused.to_string().contains("1 or 3"), "{refused}");

    // Three shrink to one in place: the engine is back in this process.
    let (status, changed) = a.patch("/api/v1/queue-services/jobs", json!({"replicas": 1})).await;
    assert_eq!(status, 200, "{changed}");
    ready_with(&a, 1).await;
    eventually("the replicas to end", async || replicas_of(server.pid()).is_empty()).await;
    tenant.send(80..100).await;

    // One grows to three in place, on the same queues.
    let (status, changed) = a.patch("/api/v1/queue-services/jobs", json!({"replicas": 3})).await;
    assert_eq!(status, 200, "{changed}");
    ready_with(&a, 3).await;
    tenant.send(100..120).await;
    let received = tenant.drain().await;
    let lost: Vec<&String> = tenant.acked.difference(&received).collect();
    assert!(lost.is_empty(), "acknowledged but never received: {lost:?}");
    let unknown: Vec<&String> = received.difference(&tenant.acked).collect();
    assert!(unknown.is_empty(), "received but never sent: {unknown:?}");

    // The replicas end with sless dev, even with kill -9, and a new start
    // (on new ports) serves what they held.
    tenant.acked.clear();
    tenant.send(120..140).await;
    let last = replicas_of(server.pid());
    assert_eq!(last.len(), 3);
    server.kill9();
    eventually("the replicas to end with sless dev", async || {
        !last.iter().any(|p| alive(*p))
    })
    .await;
    let server = DevServer::start_with(&dir.0, "127.0.0.1:0", &["--replicas", "3"]);
    let a = server.client(TOKEN_A);
    tenant.view = ready_with(&a, 3).await;
    tenant.endpoint = tenant.view["endpoint"].as_str().unwrap().to_owned();
    tenant.queue = tenant.call("GetQueueUrl", json!({"QueueName": "work"})).await["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        tenant.drain().await,
        tenant.acked,
        "what the replicas held before sless dev was killed"
    );
}
