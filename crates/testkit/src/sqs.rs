//! An in-memory SQS queue engine served on a loopback port, with no token:
//! the SQS endpoint of tests and benches that need one without a gateway.

use std::sync::Arc;

use serde_json::json;
use sless_sqs::engine::server::EngineServer;
use sless_sqs::engine::{Engine, EngineConfig};

/// The base URL the engine is opened with; queue URLs answer the server's
/// real address instead.
const BASE_URL: &str = "http://127.0.0.1";

/// A running engine; stopped when dropped.
pub struct LoopbackEngine {
    pub engine: Arc<Engine>,
    pub server: EngineServer,
}

impl LoopbackEngine {
    pub async fn start() -> Self {
        let config = EngineConfig {
            account_id: "000000000000".into(),
            region: sless_sqs::DEFAULT_REGION.into(),
            base_url: BASE_URL.into(),
        };
        let engine = Engine::in_memory(config);
        let server = EngineServer::start(engine.clone(), "127.0.0.1:0".parse().expect("an address"), None)
            .await
            .expect("a loopback port");
        Self { engine, server }
    }

    /// Creates queue `name`: its URL at the server's address.
    pub async fn queue(&self, name: &str) -> String {
        let created = self
            .engine
            .handle("CreateQueue", &json!({"QueueName": name}))
            .await
            .expect("a queue is created");
        created["QueueUrl"]
            .as_str()
            .expect("CreateQueue answers a URL")
            .replace(BASE_URL, &format!("http://{}", self.server.addr))
    }
}
