//! `sless dev` publishes the gateway routing table, built from the queue
//! services and their queue engines, on its worker control plane (real gRPC
//! on loopback).

use std::time::Duration;

use crate::common::cp::{ack_of, next, register};
use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir};
use prost::Message;
use serde_json::json;
use sless::controlplane::proto::worker_control_plane_client::WorkerControlPlaneClient;
use sless::controlplane::proto::{RoutingSnapshot, WatchSnapshotsRequest};

#[tokio::test]
async fn queue_services_become_gateway_routes() {
    let dir = TempDir::new("routing");
    let server = DevServer::start(&dir.0);
    let (a, b) = (server.client(TOKEN_A), server.client(TOKEN_B));
    let (_, qa) = a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    let (_, qb) = b.post("/api/v1/queue-services", json!({"name": "other"})).await;

    let mut c = WorkerControlPlaneClient::connect(format!("http://{}", server.control_plane))
        .await
        .unwrap();
    let session = register(&mut c, "gateway-1").await.session_id;
    let mut stream = c
        .watch_snapshots(WatchSnapshotsRequest {
            worker_id: "gateway-1".into(),
            session_id: session.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let wait = Duration::from_secs(10);
    let mut delivery = next(&mut stream, wait).await.unwrap().unwrap();
    let mut table = RoutingSnapshot::decode(&delivery.payload[..]).unwrap();
    // The first table may predate the second queue service; ACK and wait.
    while table.routes.len() < 2 {
        c.acknowledge_snapshot(ack_of("gateway-1", &session, &delivery, true))
            .await
            .unwrap();
        delivery = next(&mut stream, wait).await.unwrap().unwrap();
        table = RoutingSnapshot::decode(&delivery.payload[..]).unwrap();
    }
    let tenants: Vec<_> = table.routes.iter().map(|r| r.tenant.as_str()).collect();
    assert_eq!(tenants, ["a", "b"]);
    assert_eq!(table.routes[0].keys[0].access_key_id, qa["accessKey"].as_str().unwrap());
    assert_eq!(
        table.routes[0].keys[0].secret_access_key,
        qa["secretKey"].as_str().unwrap()
    );
    assert_eq!(table.routes[1].keys[0].access_key_id, qb["accessKey"].as_str().unwrap());
    // Each tenant has its own queue engine, which answers.
    let (ea, eb) = (&table.routes[0].backend_address, &table.routes[1].backend_address);
    assert!(!ea.is_empty() && ea != eb, "{ea} {eb}");
    let health = reqwest::get(format!("http://{ea}/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    c.acknowledge_snapshot(ack_of("gateway-1", &session, &delivery, true))
        .await
        .unwrap();

    // Deleting a queue service removes its route.
    assert_eq!(b.delete("/api/v1/queue-services/other").await.0, 204);
    let delivery = next(&mut stream, wait).await.unwrap().unwrap();
    let table = RoutingSnapshot::decode(&delivery.payload[..]).unwrap();
    assert_eq!(
        table.routes.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
}
