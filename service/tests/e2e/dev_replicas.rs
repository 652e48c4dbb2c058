//! `sless dev --replicas 3`: a queue service's engine runs as three
//! `sless queue` processes, Ready once the three are its voters. Each can
//! be killed with `kill -9` in turn (the leader first) while a tenant
//! sends: the others go on serving and `sless dev` starts it again. A
//! shrink cancelled at once leaves three voters; the service shrinks to
//! one engine in place (replica 1 killed as it begins) and grows back to
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

/// A replica process as its arguments and environment say: its id, its
/// peer address and the replicas' token.
struct Replica {
    pid: u32,
    id: u64,
    peer: String,
    token: String,
}

fn replica(pid: u32) -> Replica {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let after = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].clone();
    let id: u64 = after("--replica-id").parse().unwrap();
    let peer = after("--peers")
        .split(',')
        .find_map(|p| p.strip_prefix(&format!("{id}=")).map(str::to_owned))
        .unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let token = environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(b"SLESS_PEER_TOKEN=".as_slice()))
        .map(|t| String::from_utf8_lossy(t).into_owned())
        .unwrap();
    Replica { pid, id, peer, token }
}

/// What a replica says of its queue service (`/raft/status`).
async fn raft_status(r: &Replica) -> Value {
    reqwest::Client::new()
        .get(format!("http://{}/raft/status", r.peer))
        .header("x-sless-peer-token", &r.token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Replica 1's view: its voters and whether a change is under way.
async fn voters(replicas: &[Replica]) -> (Value, Value) {
    let first = replicas.iter().find(|r| r.id == 1).unwrap();
    let s = raft_status(first).await;
    (s["voters"].clone(), s["joint"].clone())
}

fn kill9(pid: u32) {
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
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
    let mut replicas: Vec<Replica> = processes.iter().map(|p| replica(*p)).collect();
    // Ready means the three are the voters: any one can be lost.
    assert_eq!(voters(&replicas).await, (json!([1, 2, 3]), json!(false)));
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

    // Each replica killed in turn, the leader first: the service goes on,
    // and the killed one is started again before the next goes.
    let leader = raft_status(&replicas[0]).await["leader"].as_u64().unwrap();
    replicas.sort_by_key(|r| r.id != leader);
    for (round, killed) in replicas.iter().enumerate() {
        kill9(killed.pid);
        let from = 20 + 20 * round as u32;
        tenant.send(from..from + 20).await;
        eventually("the killed replica to be started again", async || {
            let now = replicas_of(server.pid());
            now.len() == 3 && !now.contains(&killed.pid)
        })
        .await;
    }

    // Wrong values are refused with the field named.
    let (status, refused) = a.patch("/api/v1/queue-services/jobs", json!({"replicas": 2})).await;
    assert_eq!(status, 422, "{refused}");
    assert!(refused.to_string().contains("1 or 3"), "{refused}");

    // Asked for one and at once for three again: three voters, not one.
    let patch = async |replicas: u8| {
        let (status, changed) = a
            .patch("/api/v1/queue-services/jobs", json!({"replicas": replicas}))
            .await;
        assert_eq!(status, 200, "{changed}");
    };
    patch(1).await;
    patch(3).await;
    ready_with(&a, 3).await;
    let replicas: Vec<Replica> = replicas_of(server.pid()).into_iter().map(replica).collect();
    assert_eq!(voters(&replicas).await, (json!([1, 2, 3]), json!(false)));

    // Three shrink to one in place, also when replica 1 is killed as the
    // shrink begins: the engine is back in this process.
    patch(1).await;
    kill9(replicas.iter().find(|r| r.id == 1).unwrap().pid);
    ready_with(&a, 1).await;
    eventually("the replicas to end", async || replicas_of(server.pid()).is_empty()).await;
    tenant.send(80..100).await;

    // One grows to three in place, on the same queues.
    patch(3).await;
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
