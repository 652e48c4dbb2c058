//! The SQS data plane of a running `sless dev`, as a tenant reaches it: its
//! queue service once Ready, and SigV4-signed JSON-protocol calls.

use std::time::{Duration, Instant};

use serde_json::Value;
use sless_sqs::sigv4;
use sless_testkit::post;

/// The first queue service of `client`'s tenant once it is Ready (its view:
/// endpoint, accessKey, secretKey, …).
pub async fn ready_queue_service(client: &super::Client) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, list) = client.get("/api/v1/queue-services").await;
        let view = list["items"][0].clone();
        if view["phase"] == "Ready" {
            return view;
        }
        assert!(Instant::now() < deadline, "not Ready: {view}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A JSON-protocol `action` at `endpoint`, signed with the keys of `view`.
pub async fn call(endpoint: &str, view: &Value, action: &str, body: Value) -> (u16, String) {
    let body = body.to_string();
    let headers = sigv4::signed_json_headers(
        endpoint,
        action,
        body.as_bytes(),
        view["accessKey"].as_str().unwrap(),
        view["secretKey"].as_str().unwrap(),
        "ru-msk-1",
    )
    .unwrap();
    post(endpoint, headers, body).await
}
