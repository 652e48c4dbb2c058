//! Three replicas in one process over the in-memory network: commands
//! replicate to every replica alike, a leader's loss elects another that
//! keeps every acknowledged change (receipts included), a restarted
//! replica catches up from its own files, and a new one from a snapshot.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use openraft::{BasicNode, Raft, ServerState};
use sless_model::queue_service::Durability;

use super::log_store::LogStore;
use super::memory_network::{Factory, Router};
use super::state_machine::StateMachine;
use super::*;
use crate::engine::command::Op;
use crate::engine::machine::Identity;
use crate::engine::records::{StoredMessage, StoredQueue};

struct Replica {
    raft: Raft<TypeConfig>,
    state: StateMachine,
}

struct Cluster {
    root: PathBuf,
    router: Router,
    replicas: BTreeMap<NodeId, Replica>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Cluster {
    /// Replicas `1..=n`, one cluster, each with its files in a directory of its own.
    async fn new(n: NodeId) -> Self {
        let root = std::env::temp_dir().join(format!("sless-raft-{}-{}", std::process::id(), rand::random::<u64>()));
        let mut cluster = Self {
            root,
            router: Router::default(),
            replicas: BTreeMap::new(),
        };
        for id in 1..=n {
            cluster.start(id).await;
        }
        let members: BTreeMap<NodeId, BasicNode> = (1..=n).map(|id| (id, BasicNode::new(id))).collect();
        cluster.replicas[&1].raft.initialize(members).await.unwrap();
        cluster
    }

    /// Starts replica `id` from its files (a new one has none).
    async fn start(&mut self, id: NodeId) {
        let dir = self.root.join(id.to_string());
        std::fs::create_dir_all(&dir).unwrap();
        let lock = crate::engine::journal::lock(&dir.join("raft")).unwrap();
        let log = LogStore::open(&dir, Durability::Disk, lock, Default::default()).unwrap();
        let state = StateMachine::open(&dir, Identity::for_tests()).unwrap();
        let network = Factory {
            router: self.router.clone(),
            from: id,
        };
        let raft = Raft::new(id, config().unwrap(), network, log, state.clone())
            .await
            .unwrap();
        self.router.add(id, raft.clone());
        self.replicas.insert(id, Replica { raft, state });
    }

    /// Stops replica `id` as a crash would: it answers nothing from now on.
    async fn stop(&mut self, id: NodeId) {
        self.router.remove(id);
        if let Some(r) = self.replicas.remove(&id) {
            r.raft.shutdown().await.unwrap();
        }
    }

    /// The leader of the latest term among the replicas other than `except`
    /// (a partitioned old leader may still think it leads an older term).
    async fn leader(&self, except: Option<NodeId>) -> NodeId {
        for _ in 0..200 {
            let leader = self
                .replicas
                .iter()
                .filter(|(id, _)| Some(**id) != except)
                .map(|(id, r)| (*id, r.raft.metrics().borrow().clone()))
                .filter(|(id, m)| m.state == ServerState::Leader && m.current_leader == Some(*id))
                .max_by_key(|(_, m)| m.current_term);
            if let Some((id, _)) = leader {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no leader elected");
    }

    async fn propose(&self, op: Op) -> Result<Reply, SqsError> {
        let leader = self.leader(None).await;
        let command = Command {
            now_ms: crate::now_ms(),
            op,
        };
        propose(&self.replicas[&leader].raft, command).await
    }

    /// Waits until every replica applied what the leader applied, then
    /// returns each one's state.
    async fn converged(&self) -> Vec<String> {
        let leader = self.leader(None).await;
        let last = self.replicas[&leader].raft.metrics().borrow().last_applied;
        for r in self.replicas.values() {
            r.raft
                .wait(Some(Duration::from_secs(10)))
                .applied_index_at_least(last.map(|l| l.index), "catch up")
                .await
                .unwrap();
        }
        self.replicas.values().map(|r| r.state.lock().machine.image()).collect()
    }
}

fn create(name: &str) -> Op {
    Op::CreateQueue {
        queue: StoredQueue::named(name),
        given: Vec::new(),
    }
}

fn send(queue: &str, body: &str) -> Op {
    Op::Send {
        queue: queue.into(),
        messages: vec![StoredMessage::with_body(&format!("id-{body}"), body, crate::now_ms())],
    }
}

fn receive(queue: &str, max: usize, nonce: &str) -> Op {
    Op::Receive {
        queue: queue.into(),
        max,
        visibility_ms: 60_000,
        attempt: None,
        nonce: nonce.into(),
    }
}

/// The receipts and bodies a receive took.
fn taken(reply: Result<Reply, SqsError>) -> Vec<(String, String)> {
    match reply {
        Ok(Reply::Received(taken)) => taken.into_iter().map(|(m, r)| (r, m.stored.body)).collect(),
        other => panic!("not a receive's reply: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_every_replica_alike() {
    let cluster = Cluster::new(3).await;
    cluster.propose(create("q")).await.unwrap();
    for n in 0..30 {
        cluster.propose(send("q", &format!("m{n}"))).await.unwrap();
    }
    let receipts: Vec<String> = taken(cluster.propose(receive("q", 10, "n1")).await)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    cluster
        .propose(Op::Delete {
            queue: "q".into(),
            receipts: receipts[..5].to_vec(),
        })
        .await
        .unwrap();
    let states = cluster.converged().await;
    assert!(states[0].contains("m29"), "{}", states[0]);
    assert!(states.iter().all(|s| *s == states[0]), "the replicas differ");
    let q = &cluster.replicas[&1].state.lock().machine.queues["q"];
    assert_eq!(q.messages.len(), 25);
    assert_eq!(q.counts(crate::now_ms()).in_flight, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_keeps_what_was_acknowledged_and_its_receipts() {
    let mut cluster = Cluster::new(3).await;
    cluster.propose(create("q")).await.unwrap();
    cluster.propose(send("q", "a")).await.unwrap();
    cluster.propose(send("q", "b")).await.unwrap();
    let (receipt, body) = taken(cluster.propose(receive("q", 1, "n1")).await).remove(0);
    assert_eq!(body, "a");
    let old = cluster.leader(None).await;
    cluster.stop(old).await;
    let new = cluster.leader(Some(old)).await;
    assert_ne!(new, old);
    // The message in flight stays in flight; its receipt deletes it.
    let again = taken(cluster.propose(receive("q", 10, "n2")).await);
    assert_eq!(again.iter().map(|(_, b)| b.as_str()).collect::<Vec<_>>(), ["b"]);
    let deleted = cluster
        .propose(Op::Delete {
            queue: "q".into(),
            receipts: vec![receipt],
        })
        .await
        .unwrap();
    assert!(matches!(deleted, Reply::Each(ref each) if each.iter().all(Result::is_ok)));
    let q_len = cluster.replicas[&new].state.lock().machine.queues["q"].messages.len();
    assert_eq!(q_len, 1, "only b is left, in flight");
    // Two of three still commit.
    cluster.propose(send("q", "c")).await.unwrap();
    let states = cluster.converged().await;
    assert!(states.iter().all(|s| *s == states[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_catches_up_from_its_files_and_the_leader() {
    let mut cluster = Cluster::new(3).await;
    cluster.propose(create("q")).await.unwrap();
    cluster.propose(send("q", "before")).await.unwrap();
    let leader = cluster.leader(None).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.converged().await;
    cluster.stop(follower).await;
    cluster.propose(send("q", "while it was down")).await.unwrap();
    cluster.start(follower).await;
    let states = cluster.converged().await;
    assert!(states.iter().all(|s| *s == states[0]));
    assert!(states[0].contains("while it was down"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_leader_is_replaced_and_rejoins_as_a_follower() {
    let cluster = Cluster::new(3).await;
    cluster.propose(create("q")).await.unwrap();
    let old = cluster.leader(None).await;
    cluster.router.isolate(old, true);
    let new = cluster.leader(Some(old)).await;
    assert_ne!(new, old);
    let command = Command {
        now_ms: crate::now_ms(),
        op: send("q", "on the new side"),
    };
    propose(&cluster.replicas[&new].raft, command).await.unwrap();
    // The old leader cannot commit alone.
    let lonely = Command {
        now_ms: crate::now_ms(),
        op: send("q", "on the lonely side"),
    };
    let alone = tokio::time::timeout(Duration::from_secs(3), propose(&cluster.replicas[&old].raft, lonely)).await;
    assert!(!matches!(alone, Ok(Ok(_))), "a leader without a majority committed");
    cluster.router.isolate(old, false);
    let states = cluster.converged().await;
    assert!(
        states.iter().all(|s| *s == states[0]),
        "the replicas differ after healing"
    );
    assert!(states[0].contains("on the new side") && !states[0].contains("on the lonely side"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_starts_from_a_snapshot_of_a_purged_log() {
    let mut cluster = Cluster::new(3).await;
    cluster.propose(create("q")).await.unwrap();
    for n in 0..20 {
        cluster.propose(send("q", &format!("m{n}"))).await.unwrap();
    }
    taken(cluster.propose(receive("q", 3, "n1")).await);
    let leader = cluster.leader(None).await;
    let raft = cluster.replicas[&leader].raft.clone();
    let applied = raft.metrics().borrow().last_applied;
    raft.trigger().snapshot().await.unwrap();
    let built = raft
        .wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.snapshot.is_some() && m.snapshot >= applied, "snapshot built")
        .await
        .unwrap()
        .snapshot
        .unwrap();
    raft.trigger().purge_log(built.index).await.unwrap();
    raft.wait(Some(Duration::from_secs(10)))
        .metrics(|m| m.purged == Some(built), "log purged")
        .await
        .unwrap();
    cluster.start(4).await;
    raft.add_learner(4, BasicNode::new(4), true).await.unwrap();
    let states = cluster.converged().await;
    assert!(states.iter().all(|s| *s == states[0]), "the new replica differs");
    assert!(states[0].contains("m19"));
}

/// A leader serves once it applied its log as it stood when it was first
/// seen leading in its term (a leader restored at its start has entries of
/// its term it has not applied), and then for the rest of that term.
#[test]
fn a_leader_serves_once_it_applied_its_log_of_when_it_began_leading() {
    let mut leading = Leading::default();
    // Restored leading term 4 with entries up to 120, applied up to 100.
    assert!(!leading.serves(4, 120, Some(100)));
    assert!(
        !leading.serves(4, 130, Some(119)),
        "the goal does not move with new entries"
    );
    assert!(leading.serves(4, 140, Some(120)));
    assert!(
        leading.serves(4, 200, Some(150)),
        "caught up once, it serves for the term"
    );
    // A new term catches up again.
    assert!(!leading.serves(5, 201, Some(150)));
    assert!(!leading.serves(5, 201, None));
    assert!(leading.serves(5, 201, Some(201)));
}
