//! Per-tenant data-plane limits of a gateway: requests and request bytes a
//! second, each a token bucket holding one second's worth. A request over
//! either is answered `RequestThrottled` (403, as AWS's service model
//! gives it), which the AWS SDKs retry with backoff, and is not sent to the
//! engine. Charged once the signature is verified: a client holding only a
//! tenant's key id cannot spend the tenant's budget. Each gateway keeps its
//! own buckets, so a tenant may make N times the rate through N gateways.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use sless_runtime::rate::Bucket;
use sless_runtime::sync::Unpoisoned;

/// What one tenant may send through one gateway; 0 is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::Args)]
pub struct TenantRates {
    /// SQS requests a second one tenant may make through this gateway,
    /// with a burst of one second's worth; over it, requests are answered
    /// RequestThrottled, which the AWS SDKs retry. 0: no limit.
    #[arg(
        id = "tenant_requests_per_second",
        long = "tenant-requests-per-second",
        default_value_t = 0
    )]
    pub requests_per_second: u32,
    /// Request body bytes a second one tenant may send through this
    /// gateway, with a burst of one second's worth (a body larger than
    /// that passes when the bucket is full, and the tenant waits it off).
    /// 0: no limit.
    #[arg(
        id = "tenant_bytes_per_second",
        long = "tenant-bytes-per-second",
        default_value_t = 0
    )]
    pub bytes_per_second: u64,
}

/// A tenant's buckets, in the order of [`Limiter::limits`]: requests, bytes.
type Buckets = [Bucket; 2];

/// The buckets of the tenants this gateway has served: only tenants whose
/// key signed a request, so as many as the routing table has had (a
/// deleted tenant's stay until the gateway restarts, as its counters do).
#[derive(Debug, Default)]
pub struct Limiter {
    rates: TenantRates,
    tenants: RwLock<HashMap<String, Arc<Mutex<Buckets>>>>,
}

/// A request the tenant's rate does not allow now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "Rate exceeded: this tenant's {what} a second through this gateway are at their limit ({limit}); retry in {wait:?}."
)]
pub struct Throttled {
    pub what: &'static str,
    pub limit: u64,
    pub wait: Duration,
}

impl Limiter {
    pub fn new(rates: TenantRates) -> Self {
        Self {
            rates,
            tenants: RwLock::default(),
        }
    }

    /// What a request of `bytes` costs against each limit: its name, its
    /// rate (0: none) and the cost, in the order of [`Buckets`].
    fn limits(&self, bytes: usize) -> [(&'static str, u64, f64); 2] {
        [
            ("requests", u64::from(self.rates.requests_per_second), 1.0),
            ("bytes", self.rates.bytes_per_second, bytes as f64),
        ]
    }

    /// Takes one request of `bytes` from `tenant`'s buckets at `now`, or
    /// says which limit holds it back (taking nothing).
    pub fn admit(&self, tenant: &str, bytes: usize, now: Instant) -> Result<(), Throttled> {
        let limits = self.limits(bytes);
        if limits.iter().all(|(_, limit, _)| *limit == 0) {
            return Ok(());
        }
        let buckets = self.buckets(tenant, now);
        let mut buckets = buckets.lock_unpoisoned();
        for ((what, limit, cost), bucket) in limits.iter().zip(buckets.iter_mut()) {
            if *limit > 0 {
                let rate = *limit as f64;
                bucket.check(*cost, rate, rate, now).map_err(|wait| Throttled {
                    what,
                    limit: *limit,
                    wait,
                })?;
            }
        }
        for ((_, limit, cost), bucket) in limits.iter().zip(buckets.iter_mut()) {
            if *limit > 0 {
                bucket.take(*cost);
            }
        }
        Ok(())
    }

    fn buckets(&self, tenant: &str, now: Instant) -> Arc<Mutex<Buckets>> {
        if let Some(buckets) = self.tenants.read_unpoisoned().get(tenant) {
            return buckets.clone();
        }
        let full = self.limits(0).map(|(_, rate, _)| Bucket::full(rate as f64, now));
        self.tenants
            .lock_unpoisoned()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(full)))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_requests_and_bytes_a_second() {
        let start = Instant::now();
        let limiter = Limiter::new(TenantRates {
            requests_per_second: 10,
            bytes_per_second: 1000,
        });
        for _ in 0..10 {
            limiter.admit("a", 10, start).unwrap();
        }
        let held = limiter.admit("a", 10, start).unwrap_err();
        assert_eq!((held.what, held.limit), ("requests", 10));
        assert!(held.to_string().contains("retry in"), "{held}");
        limiter.admit("b", 10, start).unwrap();
        // A tenth of a second later, one request more.
        let later = start + Duration::from_millis(100);
        limiter.admit("a", 10, later).unwrap();
        assert!(limiter.admit("a", 10, later).is_err());
        // Bytes: a body above the burst passes a full bucket, then waits.
        limiter.admit("c", 5000, start).unwrap();
        let held = limiter.admit("c", 1, start + Duration::from_secs(1)).unwrap_err();
        assert_eq!(held.what, "bytes");
        // Held back by bytes, the request is not taken: nine more pass.
        limiter.admit("d", 1000, start).unwrap();
        assert_eq!(limiter.admit("d", 1, start).unwrap_err().what, "bytes");
        let soon = start + Duration::from_millis(2);
        for _ in 0..9 {
            limiter.admit("d", 0, soon).unwrap();
        }
        assert_eq!(limiter.admit("d", 0, soon).unwrap_err().what, "requests");
    }

    #[test]
    fn no_limit_keeps_no_buckets() {
        let limiter = Limiter::default();
        for _ in 0..10_000 {
            limiter.admit("a", 1 << 20, Instant::now()).unwrap();
        }
        assert!(limiter.tenants.read_unpoisoned().is_empty());
    }
}
