//! Per-tenant request counters and outcome tallies of the gateway, updated
//! on the request path with atomics and read by the worker for reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use sless_controlplane::model::OutcomeKind;
use sless_controlplane::proto;
use sless_runtime::sync::Unpoisoned;

/// The outcome kinds, in the order of [`TenantCounters`]' tallies.
const KINDS: [OutcomeKind; 4] = [
    OutcomeKind::Ok,
    OutcomeKind::ClientError,
    OutcomeKind::AuthFailed,
    OutcomeKind::BackendError,
];

#[derive(Default)]
pub struct TenantCounters {
    pub requests: AtomicI64,
    pub errors: AtomicI64,
    pub in_flight: AtomicI64,
    pub bytes_in: AtomicI64,
    pub bytes_out: AtomicI64,
    /// Outcomes since the last report, by [`KINDS`].
    outcomes: [AtomicI64; 4],
}

impl TenantCounters {
    pub fn outcome(&self, kind: OutcomeKind) {
        // Exhaustive: a new kind must be given its place in KINDS.
        let i = match kind {
            OutcomeKind::Ok => 0,
            OutcomeKind::ClientError => 1,
            OutcomeKind::AuthFailed => 2,
            OutcomeKind::BackendError => 3,
        };
        debug_assert_eq!(KINDS[i], kind);
        self.outcomes[i].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct Counters {
    tenants: RwLock<HashMap<String, Arc<TenantCounters>>>,
}

fn wire_kind(kind: OutcomeKind) -> proto::OutcomeKind {
    match kind {
        OutcomeKind::Ok => proto::OutcomeKind::Ok,
        OutcomeKind::ClientError => proto::OutcomeKind::ClientError,
        OutcomeKind::AuthFailed => proto::OutcomeKind::AuthFailed,
        OutcomeKind::BackendError => proto::OutcomeKind::BackendError,
    }
}

impl Counters {
    pub fn tenant(&self, tenant: &str) -> Arc<TenantCounters> {
        if let Some(c) = self.tenants.read_unpoisoned().get(tenant) {
            return c.clone();
        }
        let mut tenants = self.tenants.lock_unpoisoned();
        tenants.entry(tenant.to_owned()).or_default().clone()
    }

    /// Cumulative counters of the tenants in `tenants` (a full, sparse report).
    pub fn report(&self, tenants: impl Iterator<Item = String>) -> Vec<proto::ProxyCounters> {
        let known = self.tenants.read_unpoisoned();
        let mut out: Vec<proto::ProxyCounters> = tenants
            .filter_map(|t| {
                let c = known.get(&t)?;
                Some(proto::ProxyCounters {
                    proxy_id: t,
                    requests: c.requests.load(Ordering::Relaxed),
                    errors: c.errors.load(Ordering::Relaxed),
                    in_flight: c.in_flight.load(Ordering::Relaxed).max(0),
                    bytes_in: c.bytes_in.load(Ordering::Relaxed),
                    bytes_out: c.bytes_out.load(Ordering::Relaxed),
                })
            })
            .collect();
        out.sort_by(|a, b| a.proxy_id.cmp(&b.proxy_id));
        out
    }

    /// Takes the outcomes tallied since the last call.
    pub fn take_outcomes(&self) -> Vec<proto::Outcome> {
        let tenants = self.tenants.read_unpoisoned();
        let mut out = Vec::new();
        for (tenant, c) in tenants.iter() {
            for (kind, tally) in KINDS.iter().zip(&c.outcomes) {
                let count = tally.swap(0, Ordering::Relaxed);
                if count > 0 {
                    out.push(proto::Outcome {
                        proxy_id: tenant.clone(),
                        kind: wire_kind(*kind) as i32,
                        count,
                    });
                }
            }
        }
        out
    }
}
