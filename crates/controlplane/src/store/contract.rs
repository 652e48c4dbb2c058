//! The contract every [`ControlStore`] must meet; run against the memory and
//! the Redis implementation alike.

use std::future::Future;
use std::time::Duration;

use super::{ControlStore, StoreError};
use crate::model::{
    Acknowledgement, IssuedSnapshot, OutcomeBatch, OutcomeCount, OutcomeKind, ProxyCounters, RuntimeReport, Session,
    SnapshotId, checksum,
};

const TTL: Duration = Duration::from_secs(30);

fn session(worker: &str, sid: &str) -> Session {
    Session {
        worker_id: worker.into(),
        session_id: sid.into(),
        instance_id: "i-1".into(),
        zone: "z1".into(),
        labels: vec![("role".into(), "gateway".into())],
        acked_version: 0,
        acked_epoch: 0,
        nacked_version: 0,
    }
}

fn snap(version: u64, epoch: u64) -> SnapshotId {
    SnapshotId {
        version,
        ownership_epoch: epoch,
        checksum: checksum(format!("payload-{version}").as_bytes()),
    }
}

fn issued(worker: &str, sid: &str, s: SnapshotId) -> IssuedSnapshot {
    IssuedSnapshot {
        worker_id: worker.into(),
        session_id: sid.into(),
        snapshot: s,
        nonce: format!("nonce-{}", s.version),
    }
}

fn ack(worker: &str, sid: &str, s: SnapshotId, applied: bool) -> Acknowledgement {
    Acknowledgement {
        worker_id: worker.into(),
        session_id: sid.into(),
        snapshot: s,
        applied,
        nonce: format!("nonce-{}", s.version),
    }
}

fn report(worker: &str, sid: &str, seq: u64, s: SnapshotId, requests: i64) -> RuntimeReport {
    RuntimeReport {
        worker_id: worker.into(),
        session_id: sid.into(),
        sequence: seq,
        snapshot_version: s.version,
        ownership_epoch: s.ownership_epoch,
        counters: if requests == 0 {
            vec![]
        } else {
            vec![ProxyCounters {
                proxy_id: "tenant-a".into(),
                requests,
                errors: 0,
                in_flight: 1,
                bytes_in: 10,
                bytes_out: 20,
            }]
        },
    }
}

/// Registers `worker` and ACKs snapshot v1 of the current epoch.
async fn acked(store: &impl ControlStore, worker: &str, sid: &str) -> SnapshotId {
    let epoch = store.open_session(&session(worker, sid), TTL).await.unwrap();
    let s = snap(1, epoch);
    store
        .record_issued_snapshot(&issued(worker, sid, s), TTL)
        .await
        .unwrap();
    store
        .acknowledge_snapshot(&ack(worker, sid, s, true), TTL)
        .await
        .unwrap();
    s
}

async fn epoch_starts_at_one_and_claims_fence(store: impl ControlStore) {
    assert_eq!(store.current_ownership_epoch().await.unwrap(), 1);
    assert_eq!(store.current_ownership_epoch().await.unwrap(), 1);
    let epoch = store.open_session(&session("w", "s1"), TTL).await.unwrap();
    assert_eq!(epoch, 1);
    assert_eq!(store.claim_ownership().await.unwrap(), 2);
    // A controller still on epoch 1 cannot issue snapshots any more.
    let stale = store.record_issued_snapshot(&issued("w", "s1", snap(1, 1)), TTL).await;
    assert_eq!(stale, Err(StoreError::StaleEpoch));
    store
        .record_issued_snapshot(&issued("w", "s1", snap(1, 2)), TTL)
        .await
        .unwrap();
    let v1 = store.next_snapshot_version().await.unwrap();
    assert!(store.next_snapshot_version().await.unwrap() > v1);
}

async fn runtime_needs_a_positive_ack(store: impl ControlStore) {
    let epoch = store.open_session(&session("w", "s1"), TTL).await.unwrap();
    let s = snap(1, epoch);
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 1, s, 0), TTL, TTL).await,
        Err(StoreError::NotAcknowledged)
    );
    let got = store.session("w").await.unwrap().unwrap();
    assert_eq!((got.acked_version, got.acked_epoch, got.labels.len()), (0, 0, 1));
    store.record_issued_snapshot(&issued("w", "s1", s), TTL).await.unwrap();
    store.acknowledge_snapshot(&ack("w", "s1", s, true), TTL).await.unwrap();
    // An empty report is a heartbeat.
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 1, s, 0), TTL, TTL).await,
        Ok(epoch)
    );
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 2, s, 5), TTL, TTL).await,
        Ok(epoch)
    );
    let got = store.session("w").await.unwrap().unwrap();
    assert_eq!((got.acked_version, got.acked_epoch), (1, epoch));
}

async fn acks_must_match_the_issued_snapshot(store: impl ControlStore) {
    let epoch = store.open_session(&session("w", "s1"), TTL).await.unwrap();
    let s = snap(3, epoch);
    assert_eq!(
        store.acknowledge_snapshot(&ack("w", "s1", s, true), TTL).await,
        Err(StoreError::AckMismatch),
        "nothing issued"
    );
    store.record_issued_snapshot(&issued("w", "s1", s), TTL).await.unwrap();
    let mut wrong_sum = ack("w", "s1", s, true);
    wrong_sum.snapshot.checksum[0] ^= 1;
    let mut wrong_nonce = ack("w", "s1", s, true);
    wrong_nonce.nonce = "other".into();
    let old = ack("w", "s1", snap(2, epoch), true);
    let ahead = ack("w", "s1", snap(4, epoch), true);
    let mut wrong_epoch = ack("w", "s1", s, true);
    wrong_epoch.snapshot.ownership_epoch += 1;
    for bad in [wrong_sum, wrong_nonce, old, ahead, wrong_epoch] {
        assert_eq!(
            store.acknowledge_snapshot(&bad, TTL).await,
            Err(StoreError::AckMismatch),
            "{bad:?}"
        );
    }
    assert_eq!(
        store.session("w").await.unwrap().unwrap().acked_version,
        0,
        "refused ACKs change nothing"
    );
    let mut no_nonce = ack("w", "s1", s, true);
    no_nonce.nonce.clear();
    store.acknowledge_snapshot(&no_nonce, TTL).await.unwrap();
    // An identical replay is idempotent and keeps the runtime report.
    store
        .replace_runtime(&report("w", "s1", 7, s, 1), TTL, TTL)
        .await
        .unwrap();
    store.acknowledge_snapshot(&ack("w", "s1", s, true), TTL).await.unwrap();
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 6, s, 1), TTL, TTL).await,
        Err(StoreError::StaleReport)
    );
}

async fn negative_acks_do_not_advance(store: impl ControlStore) {
    let s1 = acked(&store, "w", "s1").await;
    store
        .replace_runtime(&report("w", "s1", 5, s1, 1), TTL, TTL)
        .await
        .unwrap();
    let s2 = snap(2, s1.ownership_epoch);
    store.record_issued_snapshot(&issued("w", "s1", s2), TTL).await.unwrap();
    store
        .acknowledge_snapshot(&ack("w", "s1", s2, false), TTL)
        .await
        .unwrap();
    let got = store.session("w").await.unwrap().unwrap();
    assert_eq!((got.acked_version, got.nacked_version), (1, 2));
    // The old report was dropped: a lower sequence is no longer stale.
    store
        .replace_runtime(&report("w", "s1", 1, s1, 1), TTL, TTL)
        .await
        .unwrap();
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 2, s2, 1), TTL, TTL).await,
        Err(StoreError::SnapshotMismatch)
    );
}

async fn a_new_registration_replaces_the_session(store: impl ControlStore) {
    let s = acked(&store, "w", "old").await;
    store
        .replace_runtime(&report("w", "old", 9, s, 1), TTL, TTL)
        .await
        .unwrap();
    store.open_session(&session("w", "new"), TTL).await.unwrap();
    assert_eq!(
        store.replace_runtime(&report("w", "old", 10, s, 1), TTL, TTL).await,
        Err(StoreError::StaleSession)
    );
    assert_eq!(
        store.acknowledge_snapshot(&ack("w", "old", s, true), TTL).await,
        Err(StoreError::StaleSession)
    );
    let batch = outcomes("w", "old", "b1");
    assert_eq!(
        store.record_outcomes(&batch, TTL, TTL).await,
        Err(StoreError::StaleSession)
    );
    assert_eq!(
        store.record_issued_snapshot(&issued("w", "old", s), TTL).await,
        Err(StoreError::StaleSession)
    );
    let got = store.session("w").await.unwrap().unwrap();
    assert_eq!((got.session_id.as_str(), got.acked_version), ("new", 0));
    // The new session starts without the old report or issued snapshot.
    assert_eq!(
        store.acknowledge_snapshot(&ack("w", "new", s, true), TTL).await,
        Err(StoreError::AckMismatch)
    );
    store.record_issued_snapshot(&issued("w", "new", s), TTL).await.unwrap();
    store
        .acknowledge_snapshot(&ack("w", "new", s, true), TTL)
        .await
        .unwrap();
    store
        .replace_runtime(&report("w", "new", 1, s, 1), TTL, TTL)
        .await
        .unwrap();
    // Other workers are untouched.
    assert!(store.session("other").await.unwrap().is_none());
}

async fn report_sequences_fence(store: impl ControlStore) {
    let s = acked(&store, "w", "s1").await;
    store
        .replace_runtime(&report("w", "s1", 5, s, 10), TTL, TTL)
        .await
        .unwrap();
    assert!(
        store
            .replace_runtime(&report("w", "s1", 5, s, 10), TTL, TTL)
            .await
            .is_ok(),
        "replay"
    );
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 5, s, 11), TTL, TTL).await,
        Err(StoreError::ConflictingReport)
    );
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 4, s, 10), TTL, TTL).await,
        Err(StoreError::StaleReport)
    );
    assert!(
        store
            .replace_runtime(&report("w", "s1", 5, s, 10), TTL, TTL)
            .await
            .is_ok(),
        "refusals wrote nothing"
    );
    store
        .replace_runtime(&report("w", "s1", 6, s, 11), TTL, TTL)
        .await
        .unwrap();
    let mut other_epoch = report("w", "s1", 7, s, 11);
    other_epoch.ownership_epoch += 1;
    assert_eq!(
        store.replace_runtime(&other_epoch, TTL, TTL).await,
        Err(StoreError::SnapshotMismatch)
    );
}

fn outcomes(worker: &str, sid: &str, batch: &str) -> OutcomeBatch {
    OutcomeBatch {
        worker_id: worker.into(),
        session_id: sid.into(),
        batch_id: batch.into(),
        outcomes: vec![
            OutcomeCount {
                proxy_id: "tenant-a".into(),
                kind: OutcomeKind::Ok,
                count: 3,
            },
            OutcomeCount {
                proxy_id: "tenant-a".into(),
                kind: OutcomeKind::AuthFailed,
                count: 1,
            },
        ],
    }
}

async fn outcome_batches_count_once(store: impl ControlStore) {
    store.open_session(&session("w", "s1"), TTL).await.unwrap();
    assert_eq!(
        store.record_outcomes(&outcomes("w", "s1", "b1"), TTL, TTL).await,
        Ok(true)
    );
    assert_eq!(
        store.record_outcomes(&outcomes("w", "s1", "b1"), TTL, TTL).await,
        Ok(false)
    );
    assert_eq!(
        store.record_outcomes(&outcomes("w", "s1", "b2"), TTL, TTL).await,
        Ok(true)
    );
    let totals = store.outcome_totals("tenant-a").await.unwrap();
    assert_eq!(totals, vec![("auth_failed".to_string(), 2), ("ok".to_string(), 6)]);
    assert_eq!(store.outcome_totals("tenant-b").await.unwrap(), vec![]);
}

async fn sessions_expire(store: impl ControlStore) {
    // Margins of 250 ms around each expiry, for loaded CI machines.
    let short = Duration::from_millis(600);
    let epoch = store.open_session(&session("w", "s1"), short).await.unwrap();
    let s = snap(1, epoch);
    store.record_issued_snapshot(&issued("w", "s1", s), TTL).await.unwrap();
    // Renewal by ACK, then by a report, keeps the session past its first TTL.
    tokio::time::sleep(Duration::from_millis(350)).await;
    store
        .acknowledge_snapshot(&ack("w", "s1", s, true), short)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    store
        .replace_runtime(&report("w", "s1", 1, s, 0), short, short)
        .await
        .unwrap();
    assert!(store.session("w").await.unwrap().is_some());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(store.session("w").await.unwrap().is_none(), "expired");
    assert_eq!(
        store.replace_runtime(&report("w", "s1", 2, s, 0), short, short).await,
        Err(StoreError::StaleSession)
    );
}

/// Calls every method once (for tests that inspect the backend afterwards).
pub async fn exercise_every_method(store: &impl ControlStore) {
    store.claim_ownership().await.unwrap();
    store.next_snapshot_version().await.unwrap();
    let s = acked(store, "w", "s1").await;
    store
        .replace_runtime(&report("w", "s1", 1, s, 1), TTL, TTL)
        .await
        .unwrap();
    store
        .record_outcomes(&outcomes("w", "s1", "b1"), TTL, TTL)
        .await
        .unwrap();
    store.outcome_totals("tenant-a").await.unwrap();
    store.session("w").await.unwrap();
    store.ping().await.unwrap();
}

/// Runs every case, each on a fresh store from `make`.
pub async fn run_all<S, F, Fut>(make: F)
where
    S: ControlStore,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    epoch_starts_at_one_and_claims_fence(make().await).await;
    runtime_needs_a_positive_ack(make().await).await;
    acks_must_match_the_issued_snapshot(make().await).await;
    negative_acks_do_not_advance(make().await).await;
    a_new_registration_replaces_the_session(make().await).await;
    report_sequences_fence(make().await).await;
    outcome_batches_count_once(make().await).await;
    sessions_expire(make().await).await;
}
