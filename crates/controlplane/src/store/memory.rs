//! In-process reference implementation of [`ControlStore`], for `sless dev`
//! (one controller). Each method holds one lock for its whole check-and-write.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{ControlStore, Result, StoreError};
use crate::model::{Acknowledgement, IssuedSnapshot, OutcomeBatch, RuntimeReport, Session};
use sless_runtime::sync::Unpoisoned;

struct Expiring<T> {
    value: T,
    expires: Instant,
}

impl<T> Expiring<T> {
    fn new(value: T, ttl: Duration) -> Self {
        Self {
            value,
            expires: Instant::now() + ttl,
        }
    }
}

struct StoredRuntime {
    sequence: u64,
    digest: String,
}

#[derive(Default)]
struct State {
    epoch: u64,
    snapshot_version: u64,
    sessions: HashMap<String, Expiring<Session>>,
    issued: HashMap<String, Expiring<IssuedSnapshot>>,
    runtime: HashMap<String, Expiring<StoredRuntime>>,
    batches: HashMap<(String, String, String), Instant>,
    totals: HashMap<(String, &'static str), i64>,
}

fn live<'a, T>(map: &'a mut HashMap<String, Expiring<T>>, key: &str) -> Option<&'a mut T> {
    if map.get(key).is_some_and(|e| e.expires <= Instant::now()) {
        map.remove(key);
    }
    map.get_mut(key).map(|e| &mut e.value)
}

impl State {
    fn ensure_epoch(&mut self) -> u64 {
        self.epoch = self.epoch.max(1);
        self.epoch
    }

    /// The live session `session_id` of `worker_id`, renewed for `ttl`.
    fn renew(&mut self, worker_id: &str, session_id: &str, ttl: Duration) -> Result<&mut Session> {
        let now = Instant::now();
        match self.sessions.get_mut(worker_id) {
            Some(e) if e.expires > now && e.value.session_id == session_id => {
                e.expires = now + ttl;
                Ok(&mut e.value)
            }
            _ => Err(StoreError::StaleSession),
        }
    }
}

#[derive(Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Each method validates before it writes, so a panic cannot leave a
        // half-applied change behind: a poisoned lock is still consistent.
        self.state.lock_unpoisoned()
    }
}

#[async_trait]
impl ControlStore for MemoryStore {
    async fn current_ownership_epoch(&self) -> Result<u64> {
        Ok(self.lock().ensure_epoch())
    }

    async fn claim_ownership(&self) -> Result<u64> {
        let mut s = self.lock();
        s.epoch += 1;
        Ok(s.epoch)
    }

    async fn next_snapshot_version(&self) -> Result<u64> {
        let mut s = self.lock();
        s.snapshot_version += 1;
        Ok(s.snapshot_version)
    }

    async fn open_session(&self, session: &Session, ttl: Duration) -> Result<u64> {
        let mut s = self.lock();
        let epoch = s.ensure_epoch();
        let id = &session.worker_id;
        s.runtime.remove(id);
        s.issued.remove(id);
        s.sessions.insert(id.clone(), Expiring::new(session.clone(), ttl));
        Ok(epoch)
    }

    async fn session(&self, worker_id: &str) -> Result<Option<Session>> {
        Ok(live(&mut self.lock().sessions, worker_id).cloned())
    }

    async fn record_issued_snapshot(&self, issued: &IssuedSnapshot, ttl: Duration) -> Result<()> {
        let mut s = self.lock();
        if issued.snapshot.ownership_epoch != s.ensure_epoch() {
            return Err(StoreError::StaleEpoch);
        }
        match live(&mut s.sessions, &issued.worker_id) {
            Some(session) if session.session_id == issued.session_id => {}
            _ => return Err(StoreError::StaleSession),
        }
        s.issued
            .insert(issued.worker_id.clone(), Expiring::new(issued.clone(), ttl));
        Ok(())
    }

    async fn acknowledge_snapshot(&self, ack: &Acknowledgement, session_ttl: Duration) -> Result<()> {
        let mut s = self.lock();
        let (acked_version, acked_epoch) = match live(&mut s.sessions, &ack.worker_id) {
            Some(session) if session.session_id == ack.session_id => (session.acked_version, session.acked_epoch),
            _ => return Err(StoreError::StaleSession),
        };
        match live(&mut s.issued, &ack.worker_id) {
            Some(i) if i.snapshot == ack.snapshot && (ack.nonce.is_empty() || ack.nonce == i.nonce) => {}
            _ => return Err(StoreError::AckMismatch),
        }
        let v = ack.snapshot.version;
        let advance = ack.applied && v > acked_version;
        if ack.applied && v < acked_version {
            return Err(StoreError::AckMismatch);
        }
        if ack.applied && v == acked_version && ack.snapshot.ownership_epoch != acked_epoch {
            return Err(StoreError::AckMismatch);
        }
        let session = s.renew(&ack.worker_id, &ack.session_id, session_ttl)?;
        if advance {
            session.acked_version = v;
            session.acked_epoch = ack.snapshot.ownership_epoch;
        } else if !ack.applied {
            session.nacked_version = v;
        }
        if advance || !ack.applied {
            s.runtime.remove(&ack.worker_id);
        }
        Ok(())
    }

    async fn replace_runtime(
        &self,
        report: &RuntimeReport,
        session_ttl: Duration,
        report_ttl: Duration,
    ) -> Result<u64> {
        let mut s = self.lock();
        let epoch = s.ensure_epoch();
        let session = match live(&mut s.sessions, &report.worker_id) {
            Some(session) if session.session_id == report.session_id => session.clone(),
            _ => return Err(StoreError::StaleSession),
        };
        if session.acked_version == 0 {
            return Err(StoreError::NotAcknowledged);
        }
        if report.snapshot_version != session.acked_version || report.ownership_epoch != session.acked_epoch {
            return Err(StoreError::SnapshotMismatch);
        }
        let digest = report.digest();
        if let Some(stored) = live(&mut s.runtime, &report.worker_id) {
            if report.sequence < stored.sequence {
                return Err(StoreError::StaleReport);
            }
            if report.sequence == stored.sequence && digest != stored.digest {
                return Err(StoreError::ConflictingReport);
            }
        }
        s.renew(&report.worker_id, &report.session_id, session_ttl)?;
        s.runtime.insert(
            report.worker_id.clone(),
            Expiring::new(
                StoredRuntime {
                    sequence: report.sequence,
                    digest,
                },
                report_ttl,
            ),
        );
        Ok(epoch)
    }

    async fn record_outcomes(&self, batch: &OutcomeBatch, session_ttl: Duration, dedup_ttl: Duration) -> Result<bool> {
        let mut s = self.lock();
        s.renew(&batch.worker_id, &batch.session_id, session_ttl)?;
        let now = Instant::now();
        s.batches.retain(|_, expires| *expires > now);
        let key = (
            batch.worker_id.clone(),
            batch.session_id.clone(),
            batch.batch_id.clone(),
        );
        if s.batches.contains_key(&key) {
            return Ok(false);
        }
        s.batches.insert(key, now + dedup_ttl);
        for o in &batch.outcomes {
            *s.totals.entry((o.proxy_id.clone(), o.kind.as_str())).or_default() += o.count;
        }
        Ok(true)
    }

    async fn outcome_totals(&self, proxy_id: &str) -> Result<Vec<(String, i64)>> {
        let s = self.lock();
        let mut totals: Vec<_> = s
            .totals
            .iter()
            .filter(|((p, _), _)| p == proxy_id)
            .map(|((_, kind), n)| (kind.to_string(), *n))
            .collect();
        totals.sort();
        Ok(totals)
    }

    async fn ping(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn contract() {
        super::super::contract::run_all(|| async { super::MemoryStore::new() }).await;
    }
}
