//! The one retry backoff of sless: the first delay, doubled after each
//! failure up to a ceiling. Pipelines, the dataflow supervisor, the
//! gateway's control-plane session and the operator's error policy use it.

use std::time::Duration;

/// Delays of consecutive retries: `first`, `2·first`, `4·first`, … at most
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { first, max }
    }

    /// The delay before retry number `failures` (1 after the first failure).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// A counter of consecutive failures that yields this backoff's delays.
    pub fn start(self) -> Retries {
        Retries {
            backoff: self,
            failures: 0,
        }
    }
}

/// Consecutive failures of one task, and the delay before its next retry.
#[derive(Debug, Clone)]
pub struct Retries {
    backoff: Backoff,
    failures: u32,
}

impl Retries {
    /// Records a failure; how long to wait before retrying.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.backoff.delay(self.failures)
    }

    /// A success: the next failure waits the first delay again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// Sleeps before a retry unless `stop` turns true first; `false` then.
    pub async fn wait(&mut self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        let delay = self.failed();
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            _ = stop.wait_for(|s| *s) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_ceiling_and_starts_over_after_a_success() {
        let mut r = Backoff::new(Duration::from_millis(200), Duration::from_secs(1)).start();
        let delays: Vec<_> = (0..5).map(|_| r.failed().as_millis()).collect();
        assert_eq!(delays, [200, 400, 800, 1000, 1000]);
        r.succeeded();
        assert_eq!(r.failed(), Duration::from_millis(200));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
        assert_eq!(b.delay(1), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_ends_the_wait() {
        let (tx, mut rx) = tokio::sync::watch::channel(false);
        let mut r = Backoff::new(Duration::from_secs(60), Duration::from_secs(60)).start();
        tx.send(true).unwrap();
        assert!(!r.wait(&mut rx).await);
    }
}
