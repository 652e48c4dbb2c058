//! The gateway's routing table, built from a control-plane snapshot and
//! swapped in whole: requests read it without locks held across awaits.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use sless_controlplane::model::SnapshotId;
use sless_controlplane::proto::RoutingSnapshot;
use sless_runtime::sync::Unpoisoned;

// The longest engine token accepted is what a link's hello carries.
use crate::link::MAX_TOKEN;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `host:port` of the tenant's queue engine, if it runs.
    pub backend: Option<String>,
    /// What the engine expects in `x-sless-engine-token`, if anything.
    pub token: Option<axum::http::HeaderValue>,
}

#[derive(Debug, Default)]
pub struct RoutingTable {
    pub snapshot: Option<SnapshotId>,
    pub routes: HashMap<String, Route>,
    /// Access key → (tenant, secret key).
    pub keys: HashMap<String, (String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSnapshot(pub String);

impl RoutingTable {
    /// Validates a snapshot; any problem rejects it whole.
    pub fn from_snapshot(id: SnapshotId, snapshot: RoutingSnapshot) -> Result<Self, InvalidSnapshot> {
        let mut table = Self {
            snapshot: Some(id),
            ..Self::default()
        };
        for route in snapshot.routes {
            sless_model::name::tenant_id(&route.tenant, "tenant").map_err(|e| InvalidSnapshot(e.to_string()))?;
            let backend = if route.backend_address.is_empty() {
                None
            } else {
                let valid = route
                    .backend_address
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
                if !valid {
                    return Err(InvalidSnapshot(format!(
                        "tenant {}: backend is not host:port",
                        route.tenant
                    )));
                }
                Some(route.backend_address)
            };
            for key in route.keys {
                if key.access_key_id.is_empty() || key.secret_access_key.is_empty() {
                    return Err(InvalidSnapshot(format!("tenant {}: empty access key", route.tenant)));
                }
                if table
                    .keys
                    .insert(key.access_key_id, (route.tenant.clone(), key.secret_access_key))
                    .is_some()
                {
                    return Err(InvalidSnapshot(format!(
                        "tenant {}: an access key appears twice",
                        route.tenant
                    )));
                }
            }
            let token = match route.backend_token.as_str() {
                "" => None,
                t if t.len() <= MAX_TOKEN && t.bytes().all(|b| b.is_ascii_graphic()) => {
                    axum::http::HeaderValue::from_str(t).ok()
                }
                _ => {
                    return Err(InvalidSnapshot(format!(
                        "tenant {}: the backend token is not up to {MAX_TOKEN} printable characters",
                        route.tenant
                    )));
                }
            };
            if table
                .routes
                .insert(route.tenant.clone(), Route { backend, token })
                .is_some()
            {
                return Err(InvalidSnapshot(format!("tenant {} appears twice", route.tenant)));
            }
        }
        Ok(table)
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
    fn valid_and_invalid_snapshots() {
        let ok = RoutingTable::from_snapshot(
            id(),
            RoutingSnapshot {
                routes: vec![route("a", "127.0.0.1:1", "k1"), route("b", "", "k2")],
            },
        )
        .unwrap();
        assert_eq!(ok.keys["k2"].0, "b");
        assert_eq!(ok.routes["b"].backend, None);
        for bad in [
            vec![route("a", "127.0.0.1:1", "k"), route("a", "127.0.0.1:2", "j")],
            vec![route("a", "127.0.0.1:1", "k"), route("b", "127.0.0.1:2", "k")],
            vec![route("Bad", "127.0.0.1:1", "k")],
            vec![route("a", "no-port", "k")],
            vec![route("a", "127.0.0.1:1", "")],
        ] {
            assert!(RoutingTable::from_snapshot(id(), RoutingSnapshot { routes: bad }).is_err());
        }
    }
}
