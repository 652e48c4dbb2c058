//! The dataflows of `sless dev`: one pipeline task each, restarted when its
//! spec changes, its state reported as the dataflow's status.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sless_dataflow::checkpoint::CheckpointStore;
use sless_dataflow::context::{PipelineContext, PositionsKey, QueueAccess, QueueServices};
use sless_model::dataflow::ConnectorSpec;
use sless_model::dataflow::DataFlowPhase;
use sless_model::dataflow::{DataFlowEvent, DataFlowStatus, DataFlowView, EventKind, MAX_EVENTS};
use sless_model::queue_service::QueueServicePhase;

use super::checkpoint::EmbeddedCheckpoint;
use super::db::StoreError;
use super::{DATAFLOW, DataFlowRecord, LocalPlatform, dataflow_view, now_rfc3339};
use sless_runtime::sync::Unpoisoned;

/// A dataflow's processor task, and what it last reported.
pub(super) struct RunningFlow {
    generation: i64,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    status: Arc<Mutex<DataFlowStatus>>,
    /// Kept across restarts for a new spec, dropped with the dataflow.
    pub(super) events: Arc<Mutex<EventLog>>,
    pub(super) stats: Arc<sless_dataflow::pipeline::Stats>,
    /// The source and context, to release the source's server-side state
    /// (a replication slot) when the dataflow is deleted.
    source: ConnectorSpec,
    sink: ConnectorSpec,
    ctx: PipelineContext,
}

/// A dataflow's recent events, oldest first.
#[derive(Default)]
pub(super) struct EventLog(VecDeque<DataFlowEvent>);

impl EventLog {
    /// Records what the processor reported. A report in the phase of the
    /// last event counts that one up and takes its message (a retry loop,
    /// a refusal counting up), instead of pushing out older events.
    fn record(&mut self, phase: DataFlowPhase, message: &str) {
        let reason = format!("{phase:?}");
        let at = now_rfc3339();
        if let Some(last) = self.0.back_mut()
            && last.reason == reason
        {
            last.count = last.count.saturating_add(1);
            last.message = message.to_owned();
            last.at = at;
            return;
        }
        if self.0.len() == MAX_EVENTS {
            self.0.pop_front();
        }
        self.0.push_back(DataFlowEvent {
            at,
            kind: if phase == DataFlowPhase::Error {
                EventKind::Warning
            } else {
                EventKind::Normal
            },
            reason,
            message: message.to_owned(),
            count: 1,
        });
    }

    pub(super) fn newest_first(&self) -> Vec<DataFlowEvent> {
        self.0.iter().rev().cloned().collect()
    }
}

/// How long a stopping processor may take to write and commit the batch in
/// hand before it is aborted (which loses nothing: the batch is read again).
const FLOW_STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl RunningFlow {
    /// Waits until the stopped processor has committed what it wrote, so
    /// that no later commit of it can overwrite a newer position.
    pub(super) async fn finished(mut self) {
        self.stop.send_replace(true);
        if tokio::time::timeout(FLOW_STOP_TIMEOUT, &mut self.task).await.is_err() {
            tracing::warn!("dataflow processor did not stop in time; aborting it");
            self.task.abort();
            let _ = self.task.await;
        }
    }

    /// [`Self::finished`], for a deleted dataflow: then removes what its
    /// connectors made on their servers (a replication slot, which cannot
    /// be dropped while the processor uses it; a positions row) and its
    /// spill directory, waiting [`RELEASE_WAIT`] at most: a server that
    /// answers is done by then, and a crash after it cannot leak the slot.
    pub(super) async fn deleted(self, key: (String, String), releases: &Releases) {
        let (source, sink, ctx) = (self.source.clone(), self.sink.clone(), self.ctx.clone());
        self.finished().await;
        let released = releases.spawn(key, source, sink, ctx);
        let _ = tokio::time::timeout(RELEASE_WAIT, released).await;
    }

    /// [`Self::finished`] for several: all are signalled first, so they
    /// finish their batches side by side.
    pub(super) async fn all_finished(flows: Vec<RunningFlow>) {
        for flow in &flows {
            flow.stop.send_replace(true);
        }
        for flow in flows {
            flow.finished().await;
        }
    }
}

/// How long a DELETE waits for the deleted dataflow's servers.
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// Deleted dataflows' server state, removed by tasks of their own: a
/// server that cannot be reached takes the whole egress connect window to
/// say so (and then nothing can be removed there anyway), which neither a
/// DELETE nor the reconcile loop waits out. A new dataflow of the same
/// name waits for its predecessor's release, which would otherwise drop
/// the slot or position the new one just made.
#[derive(Default)]
pub(super) struct Releases(Mutex<HashMap<(String, String), tokio::task::JoinHandle<()>>>);

impl Releases {
    /// Starts the release; the receiver hears when it is done.
    fn spawn(
        &self,
        key: (String, String),
        source: ConnectorSpec,
        sink: ConnectorSpec,
        ctx: PipelineContext,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (done, released) = tokio::sync::oneshot::channel();
        let mut pending = self.0.lock_unpoisoned();
        let earlier = pending.remove(&key);
        let task = tokio::spawn(async move {
            if let Some(earlier) = earlier {
                let _ = earlier.await;
            }
            release(&source, &sink, &ctx).await;
            let _ = done.send(());
        });
        pending.insert(key, task);
        released
    }

    /// Waits for the release of a deleted dataflow of this name, if any.
    pub(super) async fn settled(&self, key: &(String, String)) {
        let pending = self.0.lock_unpoisoned().remove(key);
        if let Some(task) = pending {
            let _ = task.await;
        }
    }

    /// Waits for every release still running (at shutdown).
    pub(super) async fn all_settled(&self) {
        let pending: Vec<_> = self.0.lock_unpoisoned().drain().map(|(_, task)| task).collect();
        for task in pending {
            let _ = task.await;
        }
    }
}

async fn release(source: &ConnectorSpec, sink: &ConnectorSpec, ctx: &PipelineContext) {
    if let Err(error) = sless_dataflow::registry::release(source, sink, ctx).await {
        tracing::warn!(dataflow = %ctx.id, %error, "cannot remove the deleted dataflow's state on its servers");
    }
    if let Err(error) = ctx.budget.remove_spill().await {
        tracing::warn!(dataflow = %ctx.id, %error, "the deleted dataflow's spill directory stays");
    }
}

/// One tenant's queue services, as its dataflows' SQS connectors see them.
struct TenantQueueServices {
    store: super::db::Store,
    tenant: String,
}

#[async_trait::async_trait]
impl QueueServices for TenantQueueServices {
    async fn access(&self, name: &str) -> Result<QueueAccess, String> {
        let record: Option<super::QueueRecord> = self
            .store
            .get(super::QUEUE_SERVICE, &self.tenant, name)
            .await
            .map_err(|e| format!("queue service {name}: {e}"))?;
        let record = record.ok_or_else(|| format!("queue service {name} does not exist"))?;
        let status = &record.status.status;
        match (&status.phase, &status.endpoint) {
            (QueueServicePhase::Ready, Some(endpoint)) => Ok(QueueAccess {
                endpoint: endpoint.clone(),
                account_id: sless_sqs::credentials::account_id(&self.tenant),
                access_key: record.status.credentials.access_key.clone(),
                secret_key: record.status.credentials.secret_key.clone(),
            }),
            (phase, _) => Err(format!("queue service {name} is {phase:?}, not Ready yet")),
        }
    }
}

/// A dataflow's pipeline id: its checkpoint key and default consumer group.
pub(super) fn flow_id(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

impl LocalPlatform {
    pub(super) async fn stop_deleted_flows(&self, flows: &[DataFlowRecord]) {
        let deleted: Vec<((String, String), RunningFlow)> = self
            .flows
            .lock_unpoisoned()
            .extract_if(|(tenant, name), _| !flows.iter().any(|f| &f.tenant == tenant && &f.name == name))
            .collect();
        for (_, flow) in &deleted {
            flow.stop.send_replace(true);
        }
        for (key, flow) in deleted {
            flow.deleted(key, &self.releases).await;
        }
    }

    /// Runs each dataflow's processor as a task (restarted when its spec
    /// changes) and reports the task's state as the dataflow's status.
    pub(super) async fn reconcile_dataflow(&self, f: DataFlowRecord) -> Result<(), StoreError> {
        let key = (f.tenant.clone(), f.name.clone());
        let (current, replaced) = {
            let mut running = self.flows.lock_unpoisoned();
            match running.get(&key) {
                Some(r) if r.generation == f.generation => (Some(r.status.clone()), None),
                _ => (None, running.remove(&key)),
            }
        };
        let status = match current {
            Some(status) => status,
            None => {
                // The old processor commits its last batch before the new
                // one reads the position.
                let events = replaced.as_ref().map(|old| old.events.clone()).unwrap_or_default();
                if let Some(old) = replaced {
                    old.finished().await;
                }
                self.releases.settled(&key).await;
                let positions_key = self.positions_key(&f.tenant).await?;
                let flow = self.start_flow(&f, events, positions_key);
                let status = flow.status.clone();
                self.flows.lock_unpoisoned().insert(key, flow);
                status
            }
        };
        let desired = status.lock_unpoisoned().clone();
        if f.status != desired {
            self.store
                .update_status(DATAFLOW, &f.tenant, &f.name, f.generation, &desired)
                .await?;
            tracing::info!(tenant = %f.tenant, name = %f.name, phase = ?desired.phase, "dataflow reconciled");
        }
        Ok(())
    }

    /// The tenant's key for its exactly-once positions: made on first use
    /// and kept in the store.
    async fn positions_key(&self, tenant: &str) -> Result<PositionsKey, StoreError> {
        let text = self
            .store
            .setting_or_insert(format!("positions-key/{tenant}"), PositionsKey::generate().to_text())
            .await?;
        PositionsKey::from_text(&text).ok_or_else(|| StoreError::CorruptSetting(format!("positions-key/{tenant}")))
    }

    fn start_flow(&self, f: &DataFlowRecord, events: Arc<Mutex<EventLog>>, positions_key: PositionsKey) -> RunningFlow {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let starting = "connecting the source and sinks";
        events.lock_unpoisoned().record(DataFlowPhase::Pending, starting);
        let status = Arc::new(Mutex::new(DataFlowStatus {
            phase: DataFlowPhase::Pending,
            message: Some(starting.into()),
        }));
        let id = flow_id(&f.tenant, &f.name);
        let ctx = PipelineContext {
            egress: self.egress.clone(),
            checkpoint: f
                .spec
                .checkpoint_persistence
                .then(|| Arc::new(EmbeddedCheckpoint::new(self.store.clone(), &id)) as Arc<dyn CheckpointStore>),
            queue_services: Some(Arc::new(TenantQueueServices {
                store: self.store.clone(),
                tenant: f.tenant.clone(),
            })),
            resume: None,
            snapshots: Vec::new(),
            positions_key: Some(positions_key),
            budget: self.budgets.for_flow(&f.tenant, &id),
            id,
        };
        let stats = Arc::new(sless_dataflow::pipeline::Stats::default());
        let (spec, report, log, wake) = (f.spec.clone(), status.clone(), events.clone(), self.wake.clone());
        let task = tokio::spawn(sless_dataflow::supervisor::supervise(
            spec,
            ctx.clone(),
            stats.clone(),
            stopped,
            move |phase, message| {
                log.lock_unpoisoned().record(phase, &message);
                *report.lock_unpoisoned() = DataFlowStatus {
                    phase,
                    message: Some(message),
                };
                wake.notify_one();
            },
        ));
        RunningFlow {
            generation: f.generation,
            stop,
            task,
            status,
            events,
            stats,
            source: f.spec.source.clone(),
            sink: f.spec.sink.clone(),
            ctx,
        }
    }

    /// The view of a dataflow, with its processor's live counters.
    pub(super) fn flow_view(&self, r: DataFlowRecord) -> DataFlowView {
        let counters = self
            .flows
            .lock_unpoisoned()
            .get(&(r.tenant.clone(), r.name.clone()))
            .map(|f| f.stats.snapshot());
        dataflow_view(r, counters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_event_log_counts_repeats_and_keeps_the_newest_twenty() {
        let mut log = EventLog::default();
        log.record(DataFlowPhase::Pending, "connecting");
        for attempt in 1..=3 {
            log.record(DataFlowPhase::Error, &format!("refused; attempt {attempt}"));
        }
        log.record(DataFlowPhase::Running, "running");
        let seen: Vec<_> = log
            .newest_first()
            .into_iter()
            .map(|e| (e.reason, e.kind, e.message, e.count))
            .collect();
        assert_eq!(
            seen,
            [
                ("Running".into(), EventKind::Normal, "running".into(), 1),
                ("Error".into(), EventKind::Warning, "refused; attempt 3".into(), 3),
                ("Pending".into(), EventKind::Normal, "connecting".into(), 1),
            ]
        );
        for _ in 0..30 {
            log.record(DataFlowPhase::Error, "down");
            log.record(DataFlowPhase::Running, "running");
        }
        let kept = log.newest_first();
        assert_eq!(kept.len(), MAX_EVENTS);
        assert_eq!(kept[0].reason, "Running");
    }
}
