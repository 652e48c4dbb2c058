//! The queue engines of `sless dev`: one per tenant on a loopback port,
//! reachable only with the token the gateway learns from the routing
//! snapshot, and the queue service's phase from the engine's health and
//! the gateway's acknowledgement.

use std::collections::HashMap;

use sless_model::queue_service::QueueServicePhase;
use sless_model::queue_service::QueueServiceStatus;
use sless_sqs::engine::server::{EngineServer, router};
use sless_sqs::engine::{Engine, EngineConfig, Persistence};
use sless_sqs::gateway::proxy::InProcessEngines;

use super::db::StoreError;
use super::{LocalPlatform, QUEUE_SERVICE, QueueRecord, QueueState, now_rfc3339};
use sless_runtime::sync::Unpoisoned;

/// A tenant's running queue engine and the token it takes from the gateway.
pub(super) struct RunningEngine {
    server: EngineServer,
    token: String,
    /// What it was started with; another value restarts it.
    persistence: Option<Persistence>,
    /// Where the gateway finds it in process; it leaves with the engine.
    registry: InProcessEngines,
}

impl Drop for RunningEngine {
    fn drop(&mut self) {
        self.registry.remove(&self.server.addr.to_string());
    }
}

impl LocalPlatform {
    pub(super) async fn ensure_engines(
        &self,
        queues: &[QueueRecord],
    ) -> HashMap<String, Result<(String, String), String>> {
        let mut engines = self.engines.lock().await;
        // A changed durability restarts the engine on the same store.
        engines.retain(|tenant, running| {
            queues
                .iter()
                .any(|q| &q.tenant == tenant && running.persistence == self.persistence(q))
        });
        let mut backends = HashMap::new();
        for q in queues {
            if !engines.contains_key(&q.tenant) {
                match self.start_engine(q).await {
                    Ok(running) => {
                        tracing::info!(tenant = %q.tenant, addr = %running.server.addr, "queue engine started");
                        engines.insert(q.tenant.clone(), running);
                    }
                    Err(message) => {
                        backends.insert(q.tenant.clone(), Err(message));
                        continue;
                    }
                }
            }
            if let Some(running) = engines.get(&q.tenant) {
                backends.insert(
                    q.tenant.clone(),
                    Ok((running.server.addr.to_string(), running.token.clone())),
                );
            }
        }
        backends
    }

    fn persistence(&self, q: &QueueRecord) -> Option<Persistence> {
        q.spec.persistence.then(|| Persistence {
            journal: self.data_dir.join("queues").join(format!("{}.journal", q.tenant)),
            durability: q.spec.durability,
        })
    }

    async fn start_engine(&self, q: &QueueRecord) -> Result<RunningEngine, String> {
        let persistence = self.persistence(q);
        let config = EngineConfig {
            account_id: sless_sqs::credentials::account_id(&q.tenant),
            region: self.gateway.region.clone(),
            base_url: self.endpoint(&q.tenant),
        };
        let engine = Engine::open(config, persistence.as_ref())
            .await
            .map_err(|e| format!("cannot open the message store: {}", e.message))?;
        // Only the gateway, which learns it from the routing snapshot, can
        // reach the engine's loopback port.
        let token = sless_sqs::credentials::engine_token();
        let server = EngineServer::start_within(
            engine.clone(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            Some(token.clone()),
            self.gateway.engine_connections.clone(),
        )
        .await
        .map_err(|e| format!("cannot start the queue engine: {e}"))?;
        // The gateway calls the same router in process (same token check);
        // the port stays for health checks and any other client.
        let registry = self.gateway.engines.clone();
        registry.insert(server.addr.to_string(), router(engine, Some(token.clone())));
        Ok(RunningEngine {
            server,
            token,
            persistence,
            registry,
        })
    }

    pub(super) fn endpoint(&self, tenant: &str) -> String {
        format!("{}/sqs/{tenant}", self.gateway.public_url.trim_end_matches('/'))
    }

    /// Records, per tenant, the first published version that routes it to
    /// its current backend.
    pub(super) fn learn_route_versions(&self) {
        let Some(published) = self.gateway.published.borrow().clone() else {
            return;
        };
        let table = &published.snapshot;
        let mut versions = self.route_versions.lock_unpoisoned();
        versions.retain(|tenant, _| table.routes.iter().any(|r| &r.tenant == tenant));
        for route in table.routes.iter().filter(|r| !r.backend_address.is_empty()) {
            let current = versions.get(&route.tenant);
            if current.is_none_or(|(backend, _)| *backend != route.backend_address) {
                versions.insert(
                    route.tenant.clone(),
                    (route.backend_address.clone(), published.id.version),
                );
            }
        }
    }

    async fn healthy(&self, backend: &str) -> bool {
        let url = format!("http://{backend}/health");
        matches!(self.http.get(url).send().await, Ok(r) if r.status().is_success())
    }

    /// Seed 000's phases: Ready once the engine answers and the gateway has
    /// applied a snapshot that routes to it; Failed while it does not
    /// answer; back to Ready when it recovers.
    pub(super) async fn reconcile_queue_service(
        &self,
        q: QueueRecord,
        backend: Result<String, String>,
        acked: u64,
    ) -> Result<QueueServicePhase, StoreError> {
        let previous = &q.status.status;
        let desired = match backend {
            Err(message) => QueueServiceStatus {
                phase: QueueServicePhase::Failed,
                message: Some(message),
                endpoint: None,
                ready_at: previous.ready_at.clone(),
            },
            Ok(backend) if !self.healthy(&backend).await => QueueServiceStatus {
                phase: QueueServicePhase::Failed,
                message: Some("the queue engine does not answer its health check".into()),
                endpoint: previous.endpoint.clone(),
                ready_at: previous.ready_at.clone(),
            },
            Ok(backend) => {
                let routed = self
                    .route_versions
                    .lock_unpoisoned()
                    .get(&q.tenant)
                    .filter(|(b, _)| *b == backend)
                    .map(|(_, version)| *version);
                match routed {
                    Some(version) if acked >= version => QueueServiceStatus {
                        phase: QueueServicePhase::Ready,
                        message: None,
                        endpoint: Some(self.endpoint(&q.tenant)),
                        ready_at: previous.ready_at.clone().or_else(|| Some(now_rfc3339())),
                    },
                    _ => QueueServiceStatus {
                        phase: QueueServicePhase::Provisioning,
                        message: Some("queue engine running; waiting for the gateway to apply its route".into()),
                        endpoint: None,
                        ready_at: previous.ready_at.clone(),
                    },
                }
            }
        };
        let phase = desired.phase;
        if *previous != desired {
            let state = QueueState {
                status: desired,
                credentials: q.status.credentials,
            };
            self.store
                .update_status(QUEUE_SERVICE, &q.tenant, &q.name, q.generation, &state)
                .await?;
            tracing::info!(tenant = %q.tenant, name = %q.name, ?phase, "queue service reconciled");
        }
        Ok(phase)
    }
}
