//! The queue engines of `sless dev`: one per tenant on a loopback port (or
//! three replicas, `replicas.rs`), reachable only with the token the
//! gateway learns from the routing snapshot, and the queue service's phase
//! from the engine's health and the gateway's acknowledgement.

use std::collections::HashMap;
use std::sync::Arc;

use sless_model::queue_service::QueueServicePhase;
use sless_model::queue_service::QueueServiceStatus;
use sless_sqs::engine::server::{EngineServer, router};
use sless_sqs::engine::{Engine, EngineConfig, Persistence};
use sless_sqs::gateway::proxy::InProcessEngines;

use super::db::StoreError;
use super::replicas::{self, ReplicaConfig, ReplicaSet, Revived};

/// A replicated queue service's phase message until its three replicas
/// are its voters.
const STARTING: &str = "starting the queue engine's replicas";
use super::{LocalPlatform, QUEUE_SERVICE, QueueRecord, QueueState, now_rfc3339};
use sless_runtime::sync::Unpoisoned;

/// A tenant's running queue engine and the token it takes from the gateway.
pub(super) struct RunningEngine {
    token: String,
    serving: Serving,
}

/// Where a tenant's queue engine runs.
enum Serving {
    /// In this process, on a loopback port.
    InProcess {
        engine: Arc<Engine>,
        server: EngineServer,
        /// What it was started with; another value restarts it.
        persistence: Option<Persistence>,
        registered: Registered,
    },
    /// As three `sless queue` processes.
    Replicas(ReplicaSet),
}

/// Where the gateway finds an engine in process; it leaves with the engine.
struct Registered {
    registry: InProcessEngines,
    addr: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.remove(&self.addr);
    }
}

/// Where the gateway reaches a tenant's engine, or why it cannot.
pub(super) struct Backend {
    /// The engine's address, or its replicas' (comma-separated).
    pub address: String,
    pub token: String,
    /// Set while the engine is being changed (the replicas, say): not Ready.
    pub changing: Option<String>,
}

impl RunningEngine {
    fn persistence(&self) -> Option<&Persistence> {
        match &self.serving {
            Serving::InProcess { persistence, .. } => persistence.as_ref(),
            Serving::Replicas(set) => Some(set.persistence()),
        }
    }

    fn replicas(&self) -> u8 {
        match self.serving {
            Serving::InProcess { .. } => 1,
            Serving::Replicas(_) => replicas::REPLICATED,
        }
    }

    fn backend(&self, changing: Option<String>) -> Backend {
        Backend {
            address: match &self.serving {
                Serving::InProcess { server, .. } => server.addr.to_string(),
                Serving::Replicas(set) => set.backend(),
            },
            token: self.token.clone(),
            changing,
        }
    }

    /// Stops it so that another may open its files at once.
    async fn stop(self) {
        match self.serving {
            Serving::InProcess {
                engine,
                server,
                registered,
                ..
            } => {
                drop(registered);
                drop(server);
                engine.stop().await;
            }
            Serving::Replicas(set) => set.stop().await,
        }
    }
}

impl LocalPlatform {
    pub(super) async fn ensure_engines(&self, queues: &[QueueRecord]) -> HashMap<String, Result<Backend, String>> {
        let mut engines = self.engines.lock().await;
        let gone: Vec<String> = engines
            .keys()
            .filter(|tenant| !queues.iter().any(|q| &q.tenant == *tenant))
            .cloned()
            .collect();
        for tenant in gone {
            if let Some(running) = engines.remove(&tenant) {
                running.stop().await;
            }
        }
        let mut backends = HashMap::new();
        for q in queues {
            backends.insert(q.tenant.clone(), self.ensure_engine(&mut engines, q).await);
        }
        backends
    }

    /// Keeps `q`'s engine running as its spec says: started, restarted for
    /// a new durability, grown to three replicas or shrunk to one, its
    /// replicas revived.
    async fn ensure_engine(
        &self,
        engines: &mut HashMap<String, RunningEngine>,
        q: &QueueRecord,
    ) -> Result<Backend, String> {
        let persistence = self.persistence(q);
        if let Some(running) = engines.get_mut(&q.tenant) {
            let mut same = running.persistence() == persistence.as_ref() && running.replicas() == q.spec.replicas;
            // Whether replica 1 alone is the voter: 2 and 3 may be forgotten.
            let mut shrunk = false;
            if let Serving::Replicas(set) = &mut running.serving {
                if let Revived::PortsLost = set.revive() {
                    // Started again below, on new ports and the same files.
                    same = false;
                } else if same && !set.settled().await {
                    return Ok(running.backend(Some(STARTING.into())));
                } else if q.spec.replicas == 1 {
                    // Three become one once replica 1 alone holds the queues.
                    if !set.shrunk_to_first().await {
                        return Ok(running.backend(Some("lowering the queue service to one replica".into())));
                    }
                    shrunk = true;
                }
            }
            if same {
                return Ok(running.backend(None));
            }
            if let Some(running) = engines.remove(&q.tenant) {
                running.stop().await;
                if let Some(persistence) = persistence.as_ref().filter(|_| shrunk) {
                    replicas::forget_others(persistence);
                }
            }
        }
        // Voters the three replicas kept (of a queue service deleted while
        // replicated): they start, and shrink if asked.
        let replicas = match &persistence {
            Some(p) if replicas::replicated_before(p) => replicas::REPLICATED,
            _ => q.spec.replicas,
        };
        let running = self.start_engine(q, replicas).await?;
        let backend = running.backend((replicas > 1).then(|| STARTING.into()));
        tracing::info!(tenant = %q.tenant, addr = %backend.address, replicas, "queue engine started");
        engines.insert(q.tenant.clone(), running);
        Ok(backend)
    }

    fn persistence(&self, q: &QueueRecord) -> Option<Persistence> {
        q.spec.persistence.then(|| Persistence {
            journal: self.data_dir.join("queues").join(format!("{}.journal", q.tenant)),
            durability: q.spec.durability,
        })
    }

    async fn start_engine(&self, q: &QueueRecord, replicas: u8) -> Result<RunningEngine, String> {
        let persistence = self.persistence(q);
        let config = EngineConfig {
            account_id: sless_sqs::credentials::account_id(&q.tenant),
            region: self.gateway.region.clone(),
            base_url: self.endpoint(&q.tenant),
        };
        // Only the gateway, which learns it from the routing snapshot, can
        // reach the engine's loopback port.
        let token = sless_sqs::credentials::engine_token();
        if replicas > 1 {
            let (Some(program), Some(persistence)) = (self.replica_program.clone(), persistence) else {
                return Err(
                    "this platform cannot run queue engine replicas (no sless program, or no persistence)".into(),
                );
            };
            let set = ReplicaSet::start(ReplicaConfig {
                program,
                persistence,
                account_id: config.account_id,
                region: config.region,
                base_url: config.base_url,
                token: token.clone(),
            })
            .map_err(|e| e.to_string())?;
            return Ok(RunningEngine {
                token,
                serving: Serving::Replicas(set),
            });
        }
        let engine = Engine::open(config, persistence.as_ref())
            .await
            .map_err(|e| format!("cannot open the message store: {}", e.message))?;
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
        let registered = Registered {
            registry: self.gateway.engines.clone(),
            addr: server.addr.to_string(),
        };
        registered
            .registry
            .insert(registered.addr.clone(), router(engine.clone(), Some(token.clone())));
        Ok(RunningEngine {
            token,
            serving: Serving::InProcess {
                engine,
                server,
                persistence,
                registered,
            },
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

    /// Whether most of the backend's members (one engine, or replicas)
    /// answer their health check.
    async fn healthy(&self, backend: &str) -> bool {
        let members: Vec<&str> = backend.split(',').collect();
        let mut answering = 0;
        for member in &members {
            let url = format!("http://{member}/health");
            if matches!(self.http.get(url).send().await, Ok(r) if r.status().is_success()) {
                answering += 1;
            }
        }
        answering * 2 > members.len()
    }

    /// Seed 000's phases: Ready once the engine answers and the gateway has
    /// applied a snapshot that routes to it; Failed while it does not
    /// answer; back to Ready when it recovers.
    pub(super) async fn reconcile_queue_service(
        &self,
        q: QueueRecord,
        backend: Result<&Backend, String>,
        acked: u64,
    ) -> Result<QueueServicePhase, StoreError> {
        let previous = &q.status.status;
        let desired = match backend.map(|b| (b.address.as_str(), b.changing.as_deref())) {
            Err(message) => QueueServiceStatus {
                phase: QueueServicePhase::Failed,
                message: Some(message),
                endpoint: None,
                ready_at: previous.ready_at.clone(),
            },
            Ok((_, Some(changing))) => QueueServiceStatus {
                phase: QueueServicePhase::Provisioning,
                message: Some(changing.to_owned()),
                endpoint: previous.endpoint.clone(),
                ready_at: previous.ready_at.clone(),
            },
            Ok((backend, None)) if !self.healthy(backend).await => QueueServiceStatus {
                phase: QueueServicePhase::Failed,
                message: Some("the queue engine does not answer its health check".into()),
                endpoint: previous.endpoint.clone(),
                ready_at: previous.ready_at.clone(),
            },
            Ok((backend, None)) => {
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
