//! What every reconcile shares.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sless_runtime::backoff::{Backoff, Retries};

use super::config::{FIELD_MANAGER, OperatorConfig};
use super::crd::Conditioned;
use super::dataflow::processor::Processors;
use super::error::Error;
use super::queue_service::voters::Voters;
use sless_runtime::sync::Unpoisoned;

pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub backoff: ObjectRetries,
    /// Reads what DataFlow processors say of themselves.
    pub processors: Processors,
    /// Reaches a queue service's replicas (to lower three to one).
    pub voters: Voters,
    recorder: Recorder,
}

/// The most an Event's note may hold (the API's limit is 1 kB).
const EVENT_NOTE_BYTES: usize = 1024;

impl Context {
    /// `instance` names this replica in the Events it publishes (its pod).
    pub fn new(client: Client, config: OperatorConfig, instance: Option<String>) -> Self {
        Self {
            recorder: recorder(client.clone(), instance),
            client,
            config,
            backoff: ObjectRetries::default(),
            processors: Processors::default(),
            voters: Voters::default(),
        }
    }

    /// With processors reached elsewhere than their pods' port (a test's).
    pub fn with_processors(mut self, processors: Processors) -> Self {
        self.processors = processors;
        self
    }

    /// Publishes a phase change of `obj` as an Event (what `kubectl describe`
    /// shows), from its new `Ready` condition. A Warning unless `healthy`.
    /// An Event is a courtesy: failing to publish it is logged, not retried.
    pub async fn publish_phase<K: Resource<DynamicType = ()>>(&self, obj: &K, healthy: bool, ready: &Condition) {
        let event = event(healthy, &ready.reason, "Reconcile", ready.message.clone());
        publish(&self.recorder, obj, &event).await;
    }
}

/// What publishes this operator's Events; `instance` names the replica
/// (its pod; the host's name when `None`).
pub fn recorder(client: Client, instance: Option<String>) -> Recorder {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance,
    };
    Recorder::new(client, reporter)
}

/// An Event of `action`, a Warning unless `healthy`, its note clipped to
/// what the API takes.
pub fn event(healthy: bool, reason: &str, action: &str, mut note: String) -> KubeEvent {
    if note.len() > EVENT_NOTE_BYTES {
        let cut = (0..=EVENT_NOTE_BYTES)
            .rev()
            .find(|&i| note.is_char_boundary(i))
            .unwrap_or(0);
        note.truncate(cut);
    }
    KubeEvent {
        type_: if healthy { EventType::Normal } else { EventType::Warning },
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    }
}

/// Publishes `event` on `obj`. An Event is a courtesy: failing to publish
/// it is logged, not retried.
pub async fn publish<K: Resource<DynamicType = ()>>(recorder: &Recorder, obj: &K, event: &KubeEvent) {
    if let Err(error) = recorder.publish(event, &obj.object_ref(&())).await {
        tracing::warn!(kind = %K::kind(&()), name = %obj.meta().name.as_deref().unwrap_or_default(), %error, "cannot publish an event");
    }
}

impl Context {
    /// Shows a failed reconcile of `obj` on it: a Warning Event and its
    /// `Reconciled` condition False, both with the error.
    async fn report_failure<K>(&self, api: &Api<K>, obj: &K, error: &Error)
    where
        K: Resource<DynamicType = ()> + Conditioned + Clone + DeserializeOwned + Debug,
    {
        let message = error.to_string();
        let condition = Condition {
            type_: RECONCILED.into(),
            status: "False".into(),
            reason: RECONCILE_FAILED.into(),
            message: message.clone(),
            observed_generation: None,
            last_transition_time: super::objects::now(),
        };
        self.publish_phase(obj, false, &condition).await;
        set_reconciled(api, obj, Some(&message)).await;
    }
}

/// The backoff key of an object: its kind, namespace and name (two kinds
/// share one `Context`, and may share a name).
fn backoff_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.namespace().unwrap_or_default(),
        obj.name_any()
    )
}

/// The condition a failed reconcile sets: `Reconciled` False with why.
pub const RECONCILED: &str = "Reconciled";
const RECONCILE_FAILED: &str = "ReconcileFailed";

/// Runs `reconcile` for a namespaced object behind `finalizer_name`
/// (`kube::runtime::finalizer`): it gets the object's Api and an Apply or
/// Cleanup event. A success resets the object's backoff (and clears a
/// failure shown before); a failure (a refused PVC expansion, say) is shown
/// on the object, as an Event and its `Reconciled` condition, not only
/// in the log.
pub async fn reconcile_finalized<K, F, Fut>(
    obj: Arc<K>,
    ctx: &Context,
    finalizer_name: &str,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Conditioned
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
    F: FnOnce(Api<K>, Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    let namespace = obj.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = backoff_key(&*obj);
    let failed_before = obj
        .conditions()
        .iter()
        .any(|c| c.type_ == RECONCILED && c.status == "False");
    let name = obj.name_any();
    let outcome = finalizer(&api, finalizer_name, obj.clone(), |event| reconcile(api.clone(), event))
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)));
    match &outcome {
        Ok(_) => {
            ctx.backoff.succeeded(&key);
            if failed_before && let Ok(Some(now)) = api.get_opt(&name).await {
                set_reconciled(&api, &now, None).await;
            }
        }
        Err(error) => ctx.report_failure(&api, &*obj, error).await,
    }
    outcome
}

/// Sets the `Reconciled` condition of `obj`: False with `failure`, else True.
/// Like an Event, a courtesy: a failure to write it is logged.
async fn set_reconciled<K>(api: &Api<K>, obj: &K, failure: Option<&str>)
where
    K: Resource<DynamicType = ()> + Conditioned + Clone + DeserializeOwned + Debug,
{
    let (status, reason, message) = match failure {
        Some(message) => ("False", RECONCILE_FAILED, message),
        None => ("True", RECONCILED, "the last reconcile succeeded"),
    };
    let mut conditions: Vec<Condition> = obj
        .conditions()
        .iter()
        .filter(|c| c.type_ != RECONCILED)
        .cloned()
        .collect();
    let previous = obj.conditions().iter().find(|c| c.type_ == RECONCILED);
    conditions.push(Condition {
        type_: RECONCILED.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: obj.meta().generation,
        last_transition_time: previous
            .filter(|c| c.status == status)
            .map_or_else(super::objects::now, |c| c.last_transition_time.clone()),
    });
    let patch = serde_json::json!({"status": {"conditions": conditions}});
    if let Err(error) = api
        .patch_status(
            &obj.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(name = %obj.name_any(), %error, "cannot write the Reconciled condition");
    }
}

/// The error policy of both controllers: retry with the object's backoff.
pub fn error_policy<K: Resource<DynamicType = ()>>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry = ctx.backoff.failed(&backoff_key(&*obj));
    tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), %error, ?retry, "reconcile failed");
    Action::requeue(retry)
}

const FIRST_RETRY: Duration = Duration::from_secs(5);

/// The error policy retries after 5 s, then twice as long each time up to
/// 5 minutes; a success starts over.
const RETRY: Backoff = Backoff::new(FIRST_RETRY, Duration::from_secs(300));

/// Consecutive failures per object.
#[derive(Default)]
pub struct ObjectRetries(Mutex<HashMap<String, Retries>>);

impl ObjectRetries {
    /// Records a failure of `object`; how long to wait before the retry.
    pub fn failed(&self, object: &str) -> Duration {
        let mut retries = self.0.lock_unpoisoned();
        retries
            .entry(object.to_owned())
            .or_insert_with(|| RETRY.start())
            .failed()
    }

    pub fn succeeded(&self, object: &str) {
        self.0.lock_unpoisoned().remove(object);
    }
}

/// The Events published on objects of `kind` in `ns`, oldest first:
/// (type, reason, how often, reporting instance). A repeat of an Event is
/// counted in its series, as `kubectl describe` shows it.
#[cfg(test)]
pub async fn published_events(client: &Client, ns: &str, kind: &str) -> Vec<(String, String, i32, String)> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let mut list = events.list(&Default::default()).await.unwrap().items;
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    list.into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some(kind))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.series.map_or(1, |s| s.count),
                e.reporting_instance.unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_per_object_and_reset_on_success() {
        let b = ObjectRetries::default();
        let waits: Vec<u64> = (0..8).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.failed("ns/b").as_secs(), 5, "another object has its own count");
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 5);
    }

    #[tokio::test]
    async fn objects_of_two_kinds_with_one_name_back_off_apart() {
        use crate::crd::dataflow::DataFlow;
        use crate::crd::queue_service::QueueService;
        let client = kube_fake_client::ClientBuilder::new().build().await.unwrap();
        let ctx = Arc::new(Context::new(client, OperatorConfig::default(), None));
        let mut qs = QueueService::new("main", Default::default());
        qs.metadata.namespace = Some("ns".into());
        let mut df = DataFlow::new("main", Default::default());
        df.metadata.namespace = Some("ns".into());
        let (qs, df) = (Arc::new(qs), Arc::new(df));
        assert_eq!(
            error_policy(qs.clone(), &Error::NoNamespace, ctx.clone()),
            Action::requeue(FIRST_RETRY)
        );
        assert_eq!(
            error_policy(qs, &Error::NoNamespace, ctx.clone()),
            Action::requeue(FIRST_RETRY * 2)
        );
        assert_eq!(error_policy(df, &Error::NoNamespace, ctx), Action::requeue(FIRST_RETRY));
    }
}
