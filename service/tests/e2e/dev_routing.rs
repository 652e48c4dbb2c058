//! `sless dev` routes each tenant's queue service through its SQS gateway:
//! the routing table reaches the gateway over the worker control plane, which
//! speaks mTLS even on loopback with certificates made at each start, so no
//! other local process can register a worker and read the table's keys.

use std::time::{Duration, Instant};

use crate::common::sqs::{call, ready_queue_service};
use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir};
use serde_json::json;
use sless_controlplane::proto::worker_control_plane_client::WorkerControlPlaneClient;
use sless_testkit::cp::register_request;
use sless_testkit::tls::Ca;

#[tokio::test]
async fn queue_services_become_gateway_routes() {
    let dir = TempDir::new("routing");
    let server = DevServer::start(&dir.0);
    let (a, b) = (server.client(TOKEN_A), server.client(TOKEN_B));
    a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    b.post("/api/v1/queue-services", json!({"name": "other"})).await;
    let (qa, qb) = (ready_queue_service(&a).await, ready_queue_service(&b).await);
    let (ea, eb) = (qa["endpoint"].as_str().unwrap(), qb["endpoint"].as_str().unwrap());
    assert!(ea.ends_with("/sqs/a") && eb.ends_with("/sqs/b"), "{ea} {eb}");

    // Each tenant has its own queue engine, reached with its own keys.
    assert_eq!(call(ea, &qa, "CreateQueue", json!({"QueueName": "jobs"})).await.0, 200);
    let (status, listed) = call(eb, &qb, "ListQueues", json!({})).await;
    assert_eq!(status, 200);
    assert!(!listed.contains("jobs"), "{listed}");
    // Another tenant's keys are an unknown key at this path.
    let (status, refused) = call(ea, &qb, "ListQueues", json!({})).await;
    assert_eq!(status, 403);
    assert!(refused.contains("InvalidClientTokenId"), "{refused}");

    // Deleting a queue service removes its route: its keys stop working.
    assert_eq!(b.delete("/api/v1/queue-services/other").await.0, 204);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = call(eb, &qb, "ListQueues", json!({})).await;
        if status == 403 && text.contains("InvalidClientTokenId") {
            break;
        }
        assert!(Instant::now() < deadline, "still routed: {status} {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(call(ea, &qa, "ListQueues", json!({})).await.0, 200);
}

/// Any local process could register a worker over plaintext and watch
/// snapshots with every tenant's secret keys before.
#[tokio::test]
async fn no_other_local_process_can_join_the_control_plane() {
    let dir = TempDir::new("cp-auth");
    let server = DevServer::start(&dir.0);
    // Plaintext: no TLS handshake, no call.
    let plaintext = async {
        let mut client = WorkerControlPlaneClient::connect(format!("http://{}", server.control_plane)).await?;
        client
            .register_worker(register_request("intruder"))
            .await
            .map_err(Into::into)
    };
    let result: Result<_, Box<dyn std::error::Error>> = plaintext.await;
    assert!(result.is_err(), "a plaintext worker registered");
    // TLS with a certificate of the intruder's own CA, claiming dev's
    // gateway's SPIFFE id: the handshake fails.
    let ca = Ca::new("intruder CA");
    let (cert, key) = ca.issue(&[], &["spiffe://sless.local/dev/worker/dev-gateway"]);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca.pem))
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .domain_name("localhost");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", server.control_plane))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await;
    if let Ok(channel) = channel {
        let mut client = WorkerControlPlaneClient::new(channel);
        assert!(
            client.register_worker(register_request("dev-gateway")).await.is_err(),
            "a worker with a foreign certificate registered"
        );
    }
    // Dev's own gateway is unaffected.
    let a = server.client(TOKEN_A);
    a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    let view = ready_queue_service(&a).await;
    assert_eq!(
        call(view["endpoint"].as_str().unwrap(), &view, "ListQueues", json!({}))
            .await
            .0,
        200
    );
}
