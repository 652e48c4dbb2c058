//! `WatchSnapshots`: full snapshots to one worker, at most one delivery
//! un-acknowledged at a time. A NACKed version is not sent again until a
//! newer one exists; an un-acknowledged one is re-sent (new nonce) after the
//! ACK timeout.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::model::{IssuedSnapshot, Session};
use super::store::StoreError;
use super::validate;
use super::worker::{Delivery, Service, ServiceError};
use sless_runtime::sync::Unpoisoned;

static STREAM_TOKENS: AtomicU64 = AtomicU64::new(1);

struct Outstanding {
    version: u64,
    sent: Instant,
}

impl Service {
    /// Opens a stream for a registered worker session. A newer stream of
    /// the same worker ends this one.
    pub fn watch(
        self: &Arc<Self>,
        worker_id: String,
        session_id: String,
    ) -> Result<ReceiverStream<Result<Delivery, ServiceError>>, ServiceError> {
        validate::id(&worker_id, "worker_id")?;
        validate::id(&session_id, "session_id")?;
        let (tx, rx) = mpsc::channel(1);
        let token = STREAM_TOKENS.fetch_add(1, Ordering::Relaxed);
        self.streams.lock_unpoisoned().insert(worker_id.clone(), token);
        self.ack_signal(&worker_id).notify_waiters();
        let service = self.clone();
        tokio::spawn(async move {
            if let Err(e) = service.stream(&worker_id, &session_id, token, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
            let mut streams = service.streams.lock_unpoisoned();
            if streams.get(&worker_id) == Some(&token) {
                streams.remove(&worker_id);
            }
        });
        Ok(ReceiverStream::new(rx))
    }

    fn is_current_stream(&self, worker_id: &str, token: u64) -> bool {
        self.streams.lock_unpoisoned().get(worker_id) == Some(&token)
    }

    async fn live_session(&self, worker_id: &str, session_id: &str) -> Result<Session, ServiceError> {
        match self.store.session(worker_id).await? {
            Some(s) if s.session_id == session_id => Ok(s),
            _ => Err(StoreError::StaleSession.into()),
        }
    }

    /// Runs until the client goes, the session ends or the service stops.
    async fn stream(
        &self,
        worker_id: &str,
        session_id: &str,
        token: u64,
        tx: &mpsc::Sender<Result<Delivery, ServiceError>>,
    ) -> Result<(), ServiceError> {
        let mut snapshots = self.snapshots.clone();
        let mut shutdown = self.shutdown.subscribe();
        let signal = self.ack_signal(worker_id);
        let mut outstanding: Option<Outstanding> = None;
        loop {
            // Arm the wake-up before reading state, so no ACK slips between.
            let woken = signal.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();

            if *shutdown.borrow() {
                return Err(ServiceError::Unavailable);
            }
            if !self.is_current_stream(worker_id, token) {
                return Err(ServiceError::Aborted(
                    "a newer WatchSnapshots stream of this worker replaced this one",
                ));
            }
            let session = self.live_session(worker_id, session_id).await?;
            if let Some(o) = &outstanding {
                let answered = session.acked_version >= o.version || session.nacked_version >= o.version;
                if answered || o.sent.elapsed() >= self.config.ack_timeout {
                    outstanding = None;
                }
            }
            let latest = snapshots.borrow_and_update().clone();
            if let (None, Some(latest)) = (&outstanding, latest) {
                let version = latest.id.version;
                if version > session.acked_version && version != session.nacked_version {
                    let _permit = self
                        .full_snapshot_permits
                        .acquire()
                        .await
                        .map_err(|_| ServiceError::Unavailable)?;
                    let nonce = sless_runtime::random::id();
                    let issued = IssuedSnapshot {
                        worker_id: worker_id.to_owned(),
                        session_id: session_id.to_owned(),
                        snapshot: latest.id,
                        nonce: nonce.clone(),
                    };
                    self.store
                        .record_issued_snapshot(&issued, self.config.session_ttl)
                        .await?;
                    if tx
                        .send(Ok(Delivery {
                            nonce,
                            snapshot: latest,
                        }))
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                    outstanding = Some(Outstanding {
                        version,
                        sent: Instant::now(),
                    });
                }
            }
            tokio::select! {
                () = &mut woken => {}
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return Err(ServiceError::Unavailable);
                    }
                }
                _ = shutdown.changed() => {}
                () = tokio::time::sleep(self.config.stream_poll_interval) => {}
                () = tx.closed() => return Ok(()),
            }
        }
    }
}
