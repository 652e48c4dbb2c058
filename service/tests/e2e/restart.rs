//! State survives `kill -9` of `sless dev`.

use crate::common::{DevServer, TOKEN_A, TempDir, pg_dataflow};
use serde_json::json;

#[tokio::test]
async fn objects_survive_kill_9_and_restart() {
    let dir = TempDir::new("restart");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let (status, queue) = a
        .post("/api/v1/queue-services", json!({"name": "durable", "memoryMB": 256}))
        .await;
    assert_eq!(status, 201);
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("flow-1")).await.0, 201);
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("flow-2")).await.0, 201);
    assert_eq!(
        a.patch("/api/v1/dataflows/flow-2", json!({"channelBufferSize": 42}))
            .await
            .0,
        200
    );
    assert_eq!(a.delete("/api/v1/dataflows/flow-1").await.0, 204);
    let dev_token = server.dev_token.clone();
    // Every response above was sent after its write committed; kill -9 now.
    server.kill9();

    let server = DevServer::start(&dir.0);
    assert_eq!(server.dev_token, dev_token, "the dev tenant keeps its token");
    let a = server.client(TOKEN_A);
    let (status, got) = a.get("/api/v1/queue-services/durable").await;
    assert_eq!(status, 200);
    assert_eq!(got["memoryMB"], 256);
    assert_eq!(got["accessKey"], queue["accessKey"]);
    assert_eq!(got["secretKey"], queue["secretKey"]);
    assert_eq!(got["createdAt"], queue["createdAt"]);
    let (_, flows) = a.get("/api/v1/dataflows").await;
    let items = flows["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{flows}");
    assert_eq!(
        (items[0]["name"].as_str(), items[0]["channelBufferSize"].as_u64()),
        (Some("flow-2"), Some(42))
    );
}
