//! What one tenant may hold and how fast it may call the API: quotas on
//! dataflows and the sinks of a dataflow (a tenant has one queue service,
//! whose queues its engine bounds as SQS bounds an account's), and a token
//! bucket per tenant. Every tenant is authenticated before it
//! gets a bucket, so there are only as many buckets as tenants.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sless_model::name::DnsLabel;

use super::error::ApiError;
use sless_runtime::rate::Bucket;
use sless_runtime::sync::Unpoisoned;

/// A tenant's quotas and API rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct TenantLimits {
    /// Dataflows one tenant may have.
    #[arg(long = "max-dataflows", default_value_t = 100)]
    pub dataflows: usize,
    /// Sinks one dataflow may write to: its sink, its error sink and each
    /// route of its router (each holds connections of its own).
    #[arg(long = "max-sinks-per-dataflow", default_value_t = 10)]
    pub sinks_per_dataflow: usize,
    /// API requests per second one tenant may make, sustained.
    #[arg(long = "api-rate", default_value_t = 50)]
    pub requests_per_second: u32,
    /// API requests one tenant may make at once above that rate.
    #[arg(long = "api-burst", default_value_t = 200)]
    pub burst: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            dataflows: 100,
            sinks_per_dataflow: 10,
            requests_per_second: 50,
            burst: 200,
        }
    }
}

impl TenantLimits {
    /// The error of a tenant that holds its `quota` of `what` already.
    pub fn exceeded(quota: usize, what: &'static str, flag: &'static str) -> ApiError {
        ApiError::QuotaExceeded(format!(
            "a tenant may have at most {quota} {what} (this platform's {flag})"
        ))
    }
}

/// One token bucket per tenant.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: Mutex<HashMap<DnsLabel, Bucket>>,
}

impl RateLimiter {
    /// Takes one request from `tenant`'s bucket, or says how long until
    /// one is there.
    pub fn take(&self, tenant: &DnsLabel, limits: &TenantLimits) -> Result<(), Duration> {
        let rate = f64::from(limits.requests_per_second.max(1));
        let burst = f64::from(limits.burst.max(1));
        let now = Instant::now();
        let mut buckets = self.buckets.lock_unpoisoned();
        let bucket = buckets.entry(tenant.clone()).or_insert(Bucket::full(burst, now));
        bucket.take_if(1.0, rate, burst, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_per_tenant_refills_at_the_rate() {
        let limits = TenantLimits {
            requests_per_second: 10,
            burst: 3,
            ..TenantLimits::default()
        };
        let limiter = RateLimiter::default();
        let (a, b) = (DnsLabel::parse("aa", "t").unwrap(), DnsLabel::parse("bb", "t").unwrap());
        for _ in 0..3 {
            limiter.take(&a, &limits).unwrap();
        }
        let wait = limiter.take(&a, &limits).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        // Another tenant's bucket is its own.
        limiter.take(&b, &limits).unwrap();
        std::thread::sleep(Duration::from_millis(120));
        limiter.take(&a, &limits).unwrap();
    }
}
