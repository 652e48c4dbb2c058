//! A token bucket: what the REST API's per-tenant request rate and the SQS
//! gateway's per-tenant requests and bytes a second are kept to.

use std::time::{Duration, Instant};

/// Tokens that come back at `rate` a second, up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket holding its whole burst at `now`.
    pub fn full(burst: f64, now: Instant) -> Self {
        Self { tokens: burst, at: now }
    }

    /// Whether `cost` may be taken at `now` (refilled at `rate` up to
    /// `burst` first), or how long until it may. A cost above the burst
    /// may be taken from a full bucket, leaving it in debt: a large
    /// request is slowed, never refused for ever.
    pub fn check(&mut self, cost: f64, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.at = self.at.max(now);
        let need = cost.min(burst);
        match self.tokens >= need {
            true => Ok(()),
            // A rate of 0 never refills: the wait is as long as can be.
            false => Err(Duration::try_from_secs_f64((need - self.tokens) / rate).unwrap_or(Duration::MAX)),
        }
    }

    /// Takes `cost`, after a [`Bucket::check`] that allowed it.
    pub fn take(&mut self, cost: f64) {
        self.tokens -= cost;
    }

    /// [`Bucket::check`], then [`Bucket::take`] if allowed.
    pub fn take_if(&mut self, cost: f64, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        self.check(cost, rate, burst, now)?;
        self.take(cost);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate_and_lends_to_a_large_cost() {
        let start = Instant::now();
        let mut bucket = Bucket::full(3.0, start);
        for _ in 0..3 {
            bucket.take_if(1.0, 10.0, 3.0, start).unwrap();
        }
        let wait = bucket.take_if(1.0, 10.0, 3.0, start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        bucket
            .take_if(1.0, 10.0, 3.0, start + Duration::from_millis(100))
            .unwrap();
        // Never more than the burst, however long it waited.
        let later = start + Duration::from_secs(60);
        assert!(bucket.check(3.0, 10.0, 3.0, later).is_ok());
        assert!(
            bucket.check(3.5, 10.0, 3.0, later).is_ok(),
            "a cost above the burst, from a full bucket"
        );
        bucket.take(10.0);
        let wait = bucket.check(1.0, 10.0, 3.0, later).unwrap_err();
        assert_eq!(wait, Duration::from_millis(800), "in debt: 7 tokens owed, then 1");
        // A clock read earlier than the last one takes nothing back.
        assert!(bucket.check(1.0, 10.0, 3.0, start).is_err());
        assert_eq!(bucket.check(1.0, 0.0, 3.0, later), Err(Duration::MAX), "a rate of 0");
    }
}
