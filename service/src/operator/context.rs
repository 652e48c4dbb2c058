//! What every reconcile shares, and the reconcilers' error.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::Client;

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
}
