//! What every reconcile shares, and the reconcilers' error.

use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::config::OperatorConfig;

pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub backoff: Backoff,
}

impl Context {
    pub fn new(client: Client, config: OperatorConfig) -> Self {
        Self {
            client,
            config,
            backoff: Backoff::default(),
        }
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

/// Runs `reconcile` for a namespaced object behind `finalizer_name`
/// (`kube::runtime::finalizer`): it gets the object's Api and an Apply or
/// Cleanup event. A success resets the object's backoff.
pub async fn reconcile_finalized<K, F, Fut>(
    obj: Arc<K>,
    ctx: &Context,
    finalizer_name: &str,
    reconcile: F,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + DeserializeOwned + Serialize + Debug,
    F: FnOnce(Api<K>, Event<K>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    let namespace = obj.namespace().ok_or(Error::NoNamespace)?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = backoff_key(&*obj);
    finalizer(&api, finalizer_name, obj, |event| reconcile(api.clone(), event))
        .await
        .map_err(|e| Error::Finalizer(Box::new(e)))
        .inspect(|_| ctx.backoff.succeeded(&key))
}

/// The error policy of both controllers: retry with the object's backoff.
pub fn error_policy<K: Resource<DynamicType = ()>>(obj: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action {
    let retry = ctx.backoff.failed(&backoff_key(&*obj));
    tracing::warn!(kind = %K::kind(&()), name = %obj.name_any(), %error, ?retry, "reconcile failed");
    Action::requeue(retry)
}

const FIRST_RETRY: Duration = Duration::from_secs(5);
const LAST_RETRY: Duration = Duration::from_secs(300);

/// Consecutive failures per object: the error policy retries after 5 s,
/// then twice as long each time up to 5 minutes; a success starts over.
#[derive(Default)]
pub struct Backoff(Mutex<HashMap<String, u32>>);

impl Backoff {
    /// Records a failure of `object`; how long to wait before the retry.
    pub fn failed(&self, object: &str) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(object.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        FIRST_RETRY.saturating_mul(2u32.saturating_pow(*n - 1)).min(LAST_RETRY)
    }

    pub fn succeeded(&self, object: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(object);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("the object has no namespace")]
    NoNamespace,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_per_object_and_reset_on_success() {
        let b = Backoff::default();
        let waits: Vec<u64> = (0..8).map(|_| b.failed("ns/a").as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(b.failed("ns/b").as_secs(), 5, "another object has its own count");
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a").as_secs(), 5);
    }

    #[tokio::test]
    async fn objects_of_two_kinds_with_one_name_back_off_apart() {
        use crate::operator::crd::dataflow::DataFlow;
        use crate::operator::crd::queue_service::QueueService;
        let client = kube_fake_client::ClientBuilder::new().build().await.unwrap();
        let ctx = Arc::new(Context::new(client, OperatorConfig::default()));
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
