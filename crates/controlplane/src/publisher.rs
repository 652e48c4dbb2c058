//! Publishes routing snapshots to the watch streams. Publishes are debounced
//! (a quiet period, bounded by a maximum delay) and an unchanged payload makes
//! no new version.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use sless_runtime::backoff::Backoff;
use tokio::sync::watch;
use tokio::time::Instant;

use super::model::{SnapshotId, checksum};
use super::proto::RoutingSnapshot;
use super::store::ControlStore;

/// Asking the store again for a snapshot version: 500 ms, doubling to 10 s.
const STORE_RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));

/// A published snapshot: its id and its encoded `RoutingSnapshot`.
#[derive(Debug, PartialEq)]
pub struct PublishedSnapshot {
    pub id: SnapshotId,
    /// Shared by every delivery of this version (a reference, not a copy).
    pub payload: bytes::Bytes,
    /// What `payload` encodes, for readers in this process.
    pub snapshot: RoutingSnapshot,
}

#[derive(Debug, Clone, Copy)]
pub struct Debounce {
    /// Publish once no change came for this long…
    pub quiet: Duration,
    /// …or this long after the first unpublished change.
    pub max_delay: Duration,
}

impl Default for Debounce {
    fn default() -> Self {
        Self {
            quiet: Duration::from_millis(100),
            max_delay: Duration::from_millis(1500),
        }
    }
}

/// The platform's handle: hand it the desired routing table at any rate.
#[derive(Clone)]
pub struct SnapshotPublisher {
    desired: Arc<watch::Sender<Option<RoutingSnapshot>>>,
}

impl SnapshotPublisher {
    pub fn publish(&self, snapshot: RoutingSnapshot) {
        let snapshot = canonical(snapshot);
        self.desired.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&snapshot);
            *current = Some(snapshot);
            changed
        });
    }
}

/// A table in canonical order (routes by tenant, keys by id), so that
/// equal tables encode to equal bytes: the form in which it is published.
pub fn canonical(mut snapshot: RoutingSnapshot) -> RoutingSnapshot {
    snapshot.routes.sort_by(|a, b| a.tenant.cmp(&b.tenant));
    for route in &mut snapshot.routes {
        route.keys.sort_by(|a, b| a.access_key_id.cmp(&b.access_key_id));
    }
    snapshot
}

/// Starts the publishing task for a controller that owns `ownership_epoch`.
/// The receiver yields each published snapshot.
pub fn spawn(
    store: Arc<dyn ControlStore>,
    ownership_epoch: u64,
    debounce: Debounce,
) -> (SnapshotPublisher, watch::Receiver<Option<Arc<PublishedSnapshot>>>) {
    let (desired_tx, mut desired_rx) = watch::channel::<Option<RoutingSnapshot>>(None);
    let (published_tx, published_rx) = watch::channel::<Option<Arc<PublishedSnapshot>>>(None);
    tokio::spawn(async move {
        let mut last_checksum = None;
        while desired_rx.changed().await.is_ok() {
            let first = Instant::now();
            let mut deadline = first + debounce.quiet;
            loop {
                tokio::select! {
                    () = tokio::time::sleep_until(deadline) => break,
                    changed = desired_rx.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        deadline = (Instant::now() + debounce.quiet).min(first + debounce.max_delay);
                    }
                }
            }
            let Some(snapshot) = desired_rx.borrow_and_update().clone() else {
                continue;
            };
            let payload = bytes::Bytes::from(snapshot.encode_to_vec());
            let sum = checksum(&payload);
            if last_checksum == Some(sum) {
                continue;
            }
            let mut retries = STORE_RETRY.start();
            let version = loop {
                match store.next_snapshot_version().await {
                    Ok(v) => break v,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot allocate a snapshot version; retrying");
                        tokio::time::sleep(retries.failed()).await;
                    }
                }
            };
            last_checksum = Some(sum);
            tracing::info!(version, routes = snapshot.routes.len(), "routing snapshot published");
            published_tx.send_replace(Some(Arc::new(PublishedSnapshot {
                id: SnapshotId {
                    version,
                    ownership_epoch,
                    checksum: sum,
                },
                payload,
                snapshot,
            })));
        }
    });
    (
        SnapshotPublisher {
            desired: Arc::new(desired_tx),
        },
        published_rx,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TenantRoute;
    use crate::store::memory::MemoryStore;

    fn table(tenants: &[&str]) -> RoutingSnapshot {
        RoutingSnapshot {
            routes: tenants
                .iter()
                .map(|t| TenantRoute {
                    tenant: t.to_string(),
                    backend_address: format!("127.0.0.1:1{}", t.len()),
                    keys: vec![],
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bursts_coalesce_and_unchanged_tables_publish_nothing() {
        let debounce = Debounce::default();
        let (publisher, mut rx) = spawn(Arc::new(MemoryStore::new()), 1, debounce);
        // A burst of changes 50 ms apart keeps the quiet period from
        // elapsing; the maximum delay still publishes within 1.5 s.
        for i in 0..40 {
            publisher.publish(table(&[if i % 2 == 0 { "x" } else { "y" }]));
            tokio::time::sleep(Duration::from_millis(50)).await;
            if i == 31 {
                let first = rx.borrow().clone().expect("published by the max delay");
                assert_eq!(first.id.version, 1);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let last = rx.borrow_and_update().clone().unwrap();
        assert_eq!(last.id.version, 2, "one more publish after the burst went quiet");
        assert_eq!(RoutingSnapshot::decode(&last.payload[..]).unwrap(), table(&["y"]));
        assert_eq!(last.id.checksum, checksum(&last.payload));

        // Publishing the same table (in another order) makes no new version.
        publisher.publish(table(&["y"]));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!rx.has_changed().unwrap());
        let mut two = table(&["b", "a"]);
        publisher.publish(two.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        two.routes.reverse();
        publisher.publish(two);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rx.borrow_and_update().clone().unwrap().id.version, 3);
    }
}
