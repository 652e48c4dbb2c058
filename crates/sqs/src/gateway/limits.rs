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

/// What one tenant may send through one gateway: the gateway's default
/// (0: no limit), or a queue service's own (0: the default).
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

impl TenantRates {
    /// These rates, each 0 taking `default`'s.
    pub fn over(self, default: TenantRates) -> TenantRates {
        fn or<T: Default + PartialEq>(own: T, default: T) -> T {
            if own == T::default() { default } else { own }
        }
        TenantRates {
            requests_per_second: or(self.requests_per_second, default.requests_per_second),
            bytes_per_second: or(self.bytes_per_second, default.bytes_per_second),
        }
    }
}

/// A tenant's buckets, in the order of [`limits`]: requests, bytes.
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

    /// Takes one request of `bytes` from `tenant`'s buckets at `now`, at
    /// the tenant's `own` rates over this gateway's, or says which limit
    /// holds it back (taking nothing).
    pub fn admit(&self, tenant: &str, own: TenantRates, bytes: usize, now: Instant) -> Result<(), Throttled> {
        let limits = limits(own.over(self.rates), bytes);
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
        // Full whatever the rate: a check clamps the tokens to its burst.
        let full = [Bucket::full(f64::INFINITY, now); 2];
        self.tenants
            .lock_unpoisoned()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Mutex::new(full)))
            .clone()
    }
}

/// What a request of `bytes` costs against each of `rates`: its name, its
/// rate (0: none) and the cost, in the order of [`Buckets`].
fn limits(rates: TenantRates, bytes: usize) -> [(&'static str, u64, f64); 2] {
    [
        ("requests", u64::from(rates.requests_per_second), 1.0),
        ("bytes", rates.bytes_per_second, bytes as f64),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant whose queue service asks for no rates of its own.
    const GATEWAYS: TenantRates = TenantRates {
        requests_per_second: 0,
        bytes_per_second: 0,
    };

    #[test]
    fn each_tenant_has_its_own_requests_and_bytes_a_second() {
        let start = Instant::now();
        let limiter = Limiter::new(TenantRates {
            requests_per_second: 10,
            bytes_per_second: 1000,
        });
        for _ in 0..10 {
            limiter.admit("a", GATEWAYS, 10, start).unwrap();
        }
        let held = limiter.admit("a", GATEWAYS, 10, start).unwrap_err();
        assert_eq!((held.what, held.limit), ("requests", 10));
        assert!(held.to_string().contains("retry in"), "{held}");
        limiter.admit("b", GATEWAYS, 10, start).unwrap();
        // A tenth of a second later, one request more.
        let later = start + Duration::from_millis(100);
        limiter.admit("a", GATEWAYS, 10, later).unwrap();
        assert!(limiter.admit("a", GATEWAYS, 10, later).is_err());
        // Bytes: a body above the burst passes a full bucket, then waits.
        limiter.admit("c", GATEWAYS, 5000, start).unwrap();
        let held = limiter
            .admit("c", GATEWAYS, 1, start + Duration::from_secs(1))
            .unwrap_err();
        assert_eq!(held.what, "bytes");
        // Held back by bytes, the request is not taken: nine more pass.
        limiter.admit("d", GATEWAYS, 1000, start).unwrap();
        assert_eq!(limiter.admit("d", GATEWAYS, 1, start).unwrap_err().what, "bytes");
        let soon = start + Duration::from_millis(2);
        for _ in 0..9 {
            limiter.admit("d", GATEWAYS, 0, soon).unwrap();
        }
        assert_eq!(limiter.admit("d", GATEWAYS, 0, soon).unwrap_err().what, "requests");
    }

    #[test]
    fn no_limit_keeps_no_buckets() {
        let limiter = Limiter::default();
        for _ in 0..10_000 {
            limiter.admit("a", GATEWAYS, 1 << 20, Instant::now()).unwrap();
        }
        assert!(limiter.tenants.read_unpoisoned().is_empty());
    }

    #[test]
    fn a_queue_services_own_rates_replace_the_gateways_each_alone_and_at_once() {
        let start = Instant::now();
        let limiter = Limiter::new(TenantRates {
            requests_per_second: 10,
            bytes_per_second: 1000,
        });
        let own = TenantRates {
            requests_per_second: 2,
            bytes_per_second: 0,
        };
        for _ in 0..2 {
            limiter.admit("a", own, 10, start).unwrap();
        }
        let held = limiter.admit("a", own, 10, start).unwrap_err();
        assert_eq!((held.what, held.limit), ("requests", 2));
        // Its bytes are still the gateway's.
        limiter.admit("b", own, 2000, start).unwrap();
        assert_eq!(limiter.admit("b", own, 1, start).unwrap_err().limit, 1000);
        // Raised, the new rate holds from the next request (the bucket
        // refills to the new burst as time passes).
        let raised = TenantRates {
            requests_per_second: 20,
            ..own
        };
        let later = start + Duration::from_secs(1);
        for _ in 0..20 {
            limiter.admit("a", raised, 10, later).unwrap();
        }
        assert_eq!(limiter.admit("a", raised, 10, later).unwrap_err().limit, 20);
        // A gateway with no default limits a queue service that has its own.
        let open = Limiter::default();
        open.admit("a", own, 10, start).unwrap();
        open.admit("a", own, 10, start).unwrap();
        assert!(open.admit("a", own, 10, start).is_err());
        assert!(open.admit("b", GATEWAYS, 10, start).is_ok());
    }
}
