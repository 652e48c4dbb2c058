//! The gateway's routing table, built from a control-plane snapshot and
//! swapped in whole: requests read it without locks held across awaits.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use sless_controlplane::model::SnapshotId;
use sless_controlplane::proto::{RoutingSnapshot, TenantRoute};
use sless_runtime::sync::Unpoisoned;

use super::limits::TenantRates;
// The longest engine token accepted is what a link's hello carries.
use crate::link::MAX_TOKEN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `host:port` of each replica of the tenant's queue engine, none
    /// while it does not run (the route's backend names them all, with
    /// commas between).
    pub members: Vec<String>,
    /// What the engine expects in `x-sless-engine-token`, if anything.
    pub token: Option<axum::http::HeaderValue>,
    /// The tenant's own rates through this gateway; 0: the gateway's.
    pub rates: TenantRates,
}

#[derive(Debug, Default)]
pub struct RoutingTable {
    pub snapshot: Option<SnapshotId>,
    pub routes: HashMap<String, Route>,
    /// Access key → (tenant, secret key).
    pub keys: HashMap<String, (String, String)>,
}

/// A route a gateway cannot use, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tenant {tenant}: {reason}")]
pub struct InvalidRoute {
    pub tenant: String,
    pub reason: String,
}

/// The routes of `routes` a gateway can use, and why each other one cannot:
/// a bad route is left out alone, never the table with it. A tenant named
/// twice, or an access key in two routes, is ambiguous: each route involved
/// is left out (a key is never sent to a tenant it may not be).
pub fn usable(routes: Vec<TenantRoute>) -> (Vec<TenantRoute>, Vec<InvalidRoute>) {
    let mut tenants: HashMap<&str, usize> = HashMap::new();
    let mut keys: HashMap<&str, usize> = HashMap::new();
    for route in &routes {
        *tenants.entry(&route.tenant).or_default() += 1;
        for key in &route.keys {
            *keys.entry(&key.access_key_id).or_default() += 1;
        }
    }
    let problem = |route: &TenantRoute| {
        if tenants[route.tenant.as_str()] > 1 {
            return Some("the tenant has more than one route".to_owned());
        }
        if route.keys.iter().any(|k| keys[k.access_key_id.as_str()] > 1) {
            return Some("an access key appears in more than one route".to_owned());
        }
        check_route(route).err()
    };
    let verdicts: Vec<Option<String>> = routes.iter().map(problem).collect();
    let mut good = Vec::with_capacity(routes.len());
    let mut bad = Vec::new();
    for (route, verdict) in routes.into_iter().zip(verdicts) {
        match verdict {
            None => good.push(route),
            Some(reason) => bad.push(InvalidRoute {
                tenant: route.tenant,
                reason,
            }),
        }
    }
    (good, bad)
}

/// Most replicas a route names.
const MAX_MEMBERS: usize = 7;

/// The replicas a route's backend names: `host:port`, with commas between.
fn members(backend: &str) -> Vec<&str> {
    if backend.is_empty() {
        return Vec::new();
    }
    backend.split(',').collect()
}

/// One route's own rules: a tenant id, `host:port` backends (or none yet),
/// keys with both halves, a token that fits a header.
fn check_route(route: &TenantRoute) -> Result<(), String> {
    sless_model::name::tenant_id(&route.tenant, "tenant").map_err(|e| e.to_string())?;
    let members = members(&route.backend_address);
    let host_port = |member: &&str| {
        member.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains(char::is_whitespace) && port.parse::<u16>().is_ok()
        })
    };
    if !members.iter().all(host_port) {
        return Err("the backend is not host:port (or several, with commas between)".into());
    }
    if members.len() > MAX_MEMBERS {
        return Err(format!("the backend names more than {MAX_MEMBERS} replicas"));
    }
    if route
        .keys
        .iter()
        .any(|k| k.access_key_id.is_empty() || k.secret_access_key.is_empty())
    {
        return Err("an access key is empty".into());
    }
    let token = &route.backend_token;
    if token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the backend token is not up to {MAX_TOKEN} printable characters"
        ));
    }
    Ok(())
}

impl RoutingTable {
    /// The table of a snapshot's usable routes, and the routes left out.
    pub fn from_snapshot(id: SnapshotId, snapshot: RoutingSnapshot) -> (Self, Vec<InvalidRoute>) {
        let (routes, left_out) = usable(snapshot.routes);
        let mut table = Self {
            snapshot: Some(id),
            ..Self::default()
        };
        for route in routes {
            for key in route.keys {
                table
                    .keys
                    .insert(key.access_key_id, (route.tenant.clone(), key.secret_access_key));
            }
            let members = members(&route.backend_address).into_iter().map(str::to_owned).collect();
            let token = Some(route.backend_token)
                .filter(|t| !t.is_empty())
                .and_then(|t| axum::http::HeaderValue::from_str(&t).ok());
            let rates = TenantRates {
                requests_per_second: route.requests_per_second,
                bytes_per_second: route.bytes_per_second,
            };
            table.routes.insert(route.tenant, Route { members, token, rates });
        }
        (table, left_out)
    }
}

/// The table in use, shared by the request path and the worker.
#[derive(Clone, Default)]
pub struct SharedTable(Arc<RwLock<Arc<RoutingTable>>>);

impl SharedTable {
    pub fn current(&self) -> Arc<RoutingTable> {
        self.0.read_unpoisoned().clone()
    }

    pub fn replace(&self, table: RoutingTable) {
        *self.0.lock_unpoisoned() = Arc::new(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sless_controlplane::proto::{AccessKey, TenantRoute};

    fn route(tenant: &str, backend: &str, key: &str) -> TenantRoute {
        TenantRoute {
            tenant: tenant.into(),
            backend_address: backend.into(),
            keys: vec![AccessKey {
                access_key_id: key.into(),
                secret_access_key: "s".into(),
            }],
            ..Default::default()
        }
    }

    fn id() -> SnapshotId {
        SnapshotId {
            version: 1,
            ownership_epoch: 1,
            checksum: [0; 32],
        }
    }

    #[test]
    fn a_bad_route_is_left_out_alone() {
        let (table, left_out) = RoutingTable::from_snapshot(
            id(),
            RoutingSnapshot {
                routes: vec![route("a", "127.0.0.1:1", "k1"), route("b", "", "k2")],
            },
        );
        assert!(left_out.is_empty(), "{left_out:?}");
        assert_eq!(table.keys["k2"].0, "b");
        assert!(table.routes["b"].members.is_empty());
        for (bad, out) in [
            (
                vec![route("a", "127.0.0.1:1", "k"), route("a", "127.0.0.1:2", "j")],
                vec!["a", "a"],
            ),
            (
                vec![route("a", "127.0.0.1:1", "k"), route("b", "127.0.0.1:2", "k")],
                vec!["a", "b"],
            ),
            (vec![route("Bad", "127.0.0.1:1", "k")], vec!["Bad"]),
            (vec![route("a", "no-port", "k")], vec!["a"]),
            (vec![route("a", "127.0.0.1:1,,127.0.0.1:2", "k")], vec!["a"]),
            (vec![route("a", "127.0.0.1:1, 127.0.0.1:2", "k")], vec!["a"]),
            (vec![route("a", &["127.0.0.1:1"; 8].join(","), "k")], vec!["a"]),
            (vec![route("a", "127.0.0.1:1", "")], vec!["a"]),
        ] {
            let mut routes = bad.clone();
            routes.push(route("good", "127.0.0.1:3", "g"));
            let (table, left_out) = RoutingTable::from_snapshot(id(), RoutingSnapshot { routes });
            let tenants: Vec<&str> = left_out.iter().map(|r| r.tenant.as_str()).collect();
            assert_eq!(tenants, out, "{bad:?}");
            // The good route is served whatever the others hold.
            assert_eq!(table.routes.keys().collect::<Vec<_>>(), ["good"], "{bad:?}");
            assert_eq!(table.keys.keys().collect::<Vec<_>>(), ["g"], "{bad:?}");
        }
        let (table, _) = RoutingTable::from_snapshot(
            id(),
            RoutingSnapshot {
                routes: vec![route("a", "10.0.0.1:9324,10.0.0.2:9324,10.0.0.3:9324", "k")],
            },
        );
        assert_eq!(
            table.routes["a"].members,
            ["10.0.0.1:9324", "10.0.0.2:9324", "10.0.0.3:9324"]
        );
        let mut tokened = route("a", "127.0.0.1:1", "k");
        tokened.backend_token = "has space".into();
        assert_eq!(usable(vec![tokened]).1.len(), 1);
    }
}
