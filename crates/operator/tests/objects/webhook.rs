//! The DataFlow admission webhook over real HTTPS, with a certificate made
//! at test time, answering AdmissionReviews as the API server sends them.

use serde_json::{Value, json};
use sless_operator::webhook::{DATAFLOW_PATH, Webhook};
use sless_testkit::TempDir;
use sless_testkit::tls::Ca;

fn review(spec: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e911857d-c318-11e8-bbad-025000000001",
            "kind": {"group": "dataflow.dataflow.io", "version": "v1", "kind": "DataFlow"},
            "resource": {"group": "dataflow.dataflow.io", "version": "v1", "resource": "dataflows"},
            "name": "orders",
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "dataflow.dataflow.io/v1",
                "kind": "DataFlow",
                "metadata": {"name": "orders", "namespace": "team-a"},
                "spec": spec
            }
        }
    })
}

#[tokio::test]
async fn reviews_are_answered_over_https() {
    let ca = Ca::new("webhook test CA");
    let (cert, key) = ca.issue(&["localhost"], &[]);
    let dir = TempDir::new("webhook");
    std::fs::write(dir.0.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.0.join("tls.key"), key).unwrap();
    let webhook = Webhook::bind(
        "127.0.0.1:0".parse().unwrap(),
        &dir.0.join("tls.crt"),
        &dir.0.join("tls.key"),
    )
    .await
    .unwrap();
    let port = webhook.addr.port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook.serve(async {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    let url = format!("https://localhost:{port}{DATAFLOW_PATH}");
    let ask = |spec: Value| {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let answer: Value = client
                .post(url)
                .json(&review(spec))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            answer["response"].clone()
        }
    };
    let allowed = ask(json!({
        "source": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "a"}},
        "sink": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "out"}}
    }))
    .await;
    assert_eq!(
        (&allowed["allowed"], &allowed["uid"]),
        (&json!(true), &json!("e911857d-c318-11e8-bbad-025000000001"))
    );
    let denied = ask(json!({
        "source": {"type": "nessie", "config": {"nessieUrl": "http://nessie:19120/api/v2", "namespace": "n"}},
        "sink": {"type": "kafka", "config": {"brokers": ["k:9092"]}}
    }))
    .await;
    assert_eq!(denied["allowed"], false);
    let message = denied["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("source.config.table") && message.contains("sink.config.topic"),
        "{message}"
    );

    // A client that does not trust the webhook's CA gets no answer.
    let stranger = reqwest::Client::builder()
        .resolve("localhost", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    assert!(stranger.post(&url).json(&review(json!({}))).send().await.is_err());

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
