//! Per-tenant request counters and outcome tallies of the gateway, updated
//! on the request path with atomics, read by the worker for its reports and
//! rendered as Prometheus metrics. The tenant label takes only tenants of
//! the routing table whose key signed the request, the action label only
//! [`ACTIONS`] (anything else is `other`): nothing a client sends adds a
//! series.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::protocol::ACTIONS;

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

/// The outcome labels, by [`KINDS`].
const OUTCOME_LABELS: [&str; 4] = ["ok", "client_error", "auth_failed", "backend_error"];

/// Upper bounds of the latency histogram, in seconds: from an in-memory
/// send (well under a millisecond) to the longest long poll (20 s).
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 20.0,
];

/// An action's index in [`ACTIONS`]; unknown ones share the last.
pub fn action_index(action: &str) -> usize {
    ACTIONS.iter().position(|a| *a == action).unwrap_or(ACTIONS.len())
}

#[derive(Default)]
pub struct TenantCounters {
    pub requests: AtomicI64,
    pub errors: AtomicI64,
    pub in_flight: AtomicI64,
    pub bytes_in: AtomicI64,
    pub bytes_out: AtomicI64,
    /// Requests answered RequestThrottled (the tenant's rate, `limits`).
    pub throttled: AtomicI64,
    /// Outcomes since the last report, by [`KINDS`].
    outcomes: [AtomicI64; 4],
    /// Requests since start, by action ([`ACTIONS`], then other) and kind.
    by_action: [[AtomicU64; 4]; ACTIONS.len() + 1],
    /// Requests whose time ended within each of [`BUCKETS`] (not cumulative).
    latency: [AtomicU64; BUCKETS.len() + 1],
    latency_micros: AtomicU64,
}

impl TenantCounters {
    /// One request's end: its action, how it ended and how long it took.
    pub fn record(&self, action: usize, kind: OutcomeKind, took: Duration) {
        self.outcome(kind);
        self.by_action[action.min(ACTIONS.len())][kind_index(kind)].fetch_add(1, Ordering::Relaxed);
        let seconds = took.as_secs_f64();
        let bucket = BUCKETS.iter().position(|b| seconds <= *b).unwrap_or(BUCKETS.len());
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
        self.latency_micros
            .fetch_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn outcome(&self, kind: OutcomeKind) {
        self.outcomes[kind_index(kind)].fetch_add(1, Ordering::Relaxed);
    }
}

fn kind_index(kind: OutcomeKind) -> usize {
    // Exhaustive: a new kind must be given its place in KINDS.
    let i = match kind {
        OutcomeKind::Ok => 0,
        OutcomeKind::ClientError => 1,
        OutcomeKind::AuthFailed => 2,
        OutcomeKind::BackendError => 3,
    };
    debug_assert_eq!(KINDS[i], kind);
    i
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

    /// The Prometheus text exposition of every tenant's requests (by
    /// action and outcome), latency and bytes.
    pub fn render(&self) -> String {
        let tenants = self.tenants.read_unpoisoned();
        let mut sorted: Vec<(&String, &Arc<TenantCounters>)> = tenants.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(
            out,
            "# HELP sless_gateway_requests_total SQS requests by tenant, action and outcome.\n\
             # TYPE sless_gateway_requests_total counter"
        );
        for (tenant, c) in &sorted {
            for (i, row) in c.by_action.iter().enumerate() {
                let action = ACTIONS.get(i).copied().unwrap_or("other");
                for (label, n) in OUTCOME_LABELS.iter().zip(row) {
                    let n = n.load(Ordering::Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "sless_gateway_requests_total{{tenant=\"{tenant}\",action=\"{action}\",outcome=\"{label}\"}} {n}"
                        );
                    }
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP sless_gateway_request_duration_seconds Time from a request's arrival to its answer, by tenant.\n\
             # TYPE sless_gateway_request_duration_seconds histogram"
        );
        for (tenant, c) in &sorted {
            let mut cumulative = 0;
            for (i, n) in c.latency.iter().enumerate() {
                cumulative += n.load(Ordering::Relaxed);
                let le = BUCKETS.get(i).map_or("+Inf".to_owned(), f64::to_string);
                let _ = writeln!(
                    out,
                    "sless_gateway_request_duration_seconds_bucket{{tenant=\"{tenant}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let sum = c.latency_micros.load(Ordering::Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "sless_gateway_request_duration_seconds_sum{{tenant=\"{tenant}\"}} {sum}\n\
                 sless_gateway_request_duration_seconds_count{{tenant=\"{tenant}\"}} {cumulative}"
            );
        }
        for (name, help, value) in [
            (
                "sless_gateway_received_bytes_total",
                "Request bytes forwarded to tenants' engines.",
                (|c: &TenantCounters| c.bytes_in.load(Ordering::Relaxed)) as fn(&TenantCounters) -> i64,
            ),
            (
                "sless_gateway_sent_bytes_total",
                "Answer bytes relayed from tenants' engines.",
                |c: &TenantCounters| c.bytes_out.load(Ordering::Relaxed),
            ),
            (
                "sless_gateway_throttled_total",
                "Requests answered RequestThrottled: the tenant at its requests or bytes a second.",
                |c: &TenantCounters| c.throttled.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (tenant, c) in &sorted {
                let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {}", value(c).max(0));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    #[test]
    fn requests_are_rendered_by_tenant_action_and_outcome_with_their_latency() {
        let counters = Counters::default();
        let acme = counters.tenant("acme");
        acme.record(action_index("SendMessage"), OutcomeKind::Ok, Duration::from_micros(300));
        acme.record(action_index("SendMessage"), OutcomeKind::Ok, Duration::from_millis(3));
        acme.record(
            action_index("ReceiveMessage"),
            OutcomeKind::AuthFailed,
            Duration::from_secs(30),
        );
        let text = counters.render();
        for line in [
            r#"sless_gateway_requests_total{tenant="acme",action="SendMessage",outcome="ok"} 2"#,
            r#"sless_gateway_requests_total{tenant="acme",action="ReceiveMessage",outcome="auth_failed"} 1"#,
            r#"sless_gateway_request_duration_seconds_bucket{tenant="acme",le="0.0005"} 1"#,
            r#"sless_gateway_request_duration_seconds_bucket{tenant="acme",le="0.005"} 2"#,
            r#"sless_gateway_request_duration_seconds_bucket{tenant="acme",le="20"} 2"#,
            r#"sless_gateway_request_duration_seconds_bucket{tenant="acme",le="+Inf"} 3"#,
            r#"sless_gateway_request_duration_seconds_count{tenant="acme"} 3"#,
            r#"sless_gateway_received_bytes_total{tenant="acme"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        // Reports to the control plane still take their outcomes.
        assert_eq!(counters.take_outcomes().len(), 2);
    }

    /// Whatever actions clients make up, a tenant has at most one series
    /// per listed action (and `other`) and outcome.
    #[test]
    fn made_up_actions_add_no_series() {
        let counters = Counters::default();
        let acme = counters.tenant("acme");
        for i in 0..10_000 {
            acme.record(
                action_index(&format!("Invented{i}")),
                OutcomeKind::ClientError,
                Duration::ZERO,
            );
        }
        let text = counters.render();
        let requests: Vec<&str> = series(&text)
            .into_iter()
            .filter(|l| l.starts_with("sless_gateway_requests_total"))
            .collect();
        assert_eq!(
            requests,
            [r#"sless_gateway_requests_total{tenant="acme",action="other",outcome="client_error"} 10000"#]
        );
    }
}
