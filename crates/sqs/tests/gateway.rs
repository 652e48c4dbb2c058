//! The SQS gateway as a control-plane worker, in process: it applies
//! snapshots (and NACKs a bad one), verifies signatures, proxies to the
//! tenant's engine and reports outcomes — over real sockets throughout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sless_controlplane::proto::{AccessKey, RoutingSnapshot, TenantRoute};
use sless_controlplane::store::ControlStore;
use sless_controlplane::store::memory::MemoryStore;
use sless_sqs::engine::server::EngineServer;
use sless_sqs::engine::{Engine, EngineConfig};
use sless_sqs::gateway::Gateway;
use sless_sqs::gateway::worker::WorkerConfig;
use sless_sqs::sigv4;
use sless_testkit::cp::{Harness, config};

const ACCESS: &str = "SQSAKacme_AAAAAAAA";
const SECRET: &str = "YWNtZS1zZWNyZXQ=";

fn route(tenant: &str, backend: &str) -> TenantRoute {
    TenantRoute {
        tenant: tenant.into(),
        backend_address: backend.into(),
        keys: vec![AccessKey {
            access_key_id: format!("SQSAK{tenant}_AAAAAAAA"),
            secret_access_key: SECRET.into(),
        }],
        backend_token: ENGINE_TOKEN.into(),
        ..Default::default()
    }
}

const ENGINE_TOKEN: &str = "engine-token-of-the-test";

async fn call(url: &str, secret: &str, action: &str, body: Value) -> (u16, Value) {
    let body = body.to_string();
    let headers = sigv4::signed_json_headers(url, action, body.as_bytes(), ACCESS, secret, "ru-msk-1").unwrap();
    let (status, text) = sless_testkit::post(url, headers, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn eventually<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A gateway on a free loopback port, without TLS, watching the control
/// plane at `control_plane` as `worker_id`.
async fn plaintext_gateway(control_plane: std::net::SocketAddr, worker_id: &str) -> Gateway {
    Gateway::bind(
        "127.0.0.1:0".parse().unwrap(),
        None,
        WorkerConfig {
            control_planes: vec![format!("http://{control_plane}")],
            worker_id: worker_id.into(),
            instance_id: "i-1".into(),
            tls: None,
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn gateway_applies_snapshots_verifies_proxies_and_reports() {
    let store = Arc::new(MemoryStore::new());
    let cp = Harness::start(store.clone(), config(None)).await;
    let gateway = plaintext_gateway(cp.addr, "gw-test").await;
    // The engine is told the edge's address for the queue URLs it names.
    let acme = format!("{}/sqs/acme", gateway.public_url());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let engine_addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let engine = Engine::in_memory(EngineConfig {
        account_id: "acme".into(),
        region: "ru-msk-1".into(),
        base_url: acme.clone(),
    });
    let engine_server = EngineServer::start(engine.clone(), engine_addr, Some(ENGINE_TOKEN.into()))
        .await
        .unwrap();
    let base = gateway.public_url().to_owned();
    let counters = gateway.counters();
    tokio::spawn(gateway.run(std::future::pending()));

    let healthz = format!("{base}/healthz");
    assert_eq!(
        reqwest::get(&healthz).await.unwrap().status(),
        503,
        "no snapshot applied yet"
    );
    cp.publisher.publish(RoutingSnapshot {
        routes: vec![route("acme", &engine_server.addr.to_string())],
    });
    eventually("the gateway to apply its first snapshot", || async {
        reqwest::get(&healthz).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let applied = store.session("gw-test").await.unwrap().unwrap().acked_version;
    assert!(applied > 0, "the gateway ACKed what it applied");

    let (status, created) = call(&acme, SECRET, "CreateQueue", json!({"QueueName": "jobs"})).await;
    assert_eq!(status, 200, "{created}");
    // The engine serves only its gateway: a direct request without (or
    // with a wrong) token is refused, however it is signed.
    for token in [None, Some("guess")] {
        let mut direct = reqwest::Client::new()
            .post(format!("http://{engine_addr}/"))
            .header("x-amz-target", "AmazonSQS.ListQueues")
            .header("content-type", "application/x-amz-json-1.0")
            .body("{}");
        if let Some(t) = token {
            direct = direct.header("x-sless-engine-token", t);
        }
        let response = direct.send().await.unwrap();
        assert_eq!(response.status(), 403, "{token:?}");
        assert!(response.text().await.unwrap().contains("AccessDenied"));
    }
    assert_eq!(
        created["QueueUrl"],
        format!("{acme}/acme/jobs"),
        "queue URLs name the edge, not the engine"
    );
    for _ in 0..4 {
        assert_eq!(call(&acme, SECRET, "ListQueues", json!({})).await.0, 200);
    }
    for _ in 0..2 {
        let (status, err) = call(&acme, "wrong-secret", "ListQueues", json!({})).await;
        assert_eq!(
            (status, err["__type"].as_str()),
            (403, Some("com.amazonaws.sqs#SignatureDoesNotMatch"))
        );
    }
    let (status, err) = call(&format!("{base}/sqs/other"), SECRET, "ListQueues", json!({})).await;
    assert_eq!(
        (status, err["__type"].as_str()),
        (403, Some("com.amazonaws.sqs#InvalidClientTokenId"))
    );

    eventually("outcomes to reach the control plane", || async {
        store.outcome_totals("acme").await.unwrap() == [("auth_failed".to_string(), 2), ("ok".to_string(), 5)]
    })
    .await;
    // The same requests on /metrics; a path naming no tenant of the table
    // adds no tenant label.
    let metrics = sless_sqs::gateway::metrics_router(counters);
    let text = {
        use tower::ServiceExt;
        let request = axum::http::Request::get("/metrics")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = metrics.oneshot(request).await.unwrap();
        String::from_utf8(
            axum::body::to_bytes(response.into_body(), 1 << 20)
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap()
    };
    for line in [
        r#"sless_gateway_requests_total{tenant="acme",action="CreateQueue",outcome="ok"} 1"#,
        r#"sless_gateway_requests_total{tenant="acme",action="ListQueues",outcome="ok"} 4"#,
        r#"sless_gateway_requests_total{tenant="acme",action="ListQueues",outcome="auth_failed"} 2"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
    }
    assert!(!text.contains(r#"tenant="other""#), "{text}");

    // A snapshot with an unusable route (another tenant named twice) is
    // applied without it: acme stays routed, nothing is NACKed.
    let backend = engine_server.addr.to_string();
    cp.publisher.publish(RoutingSnapshot {
        routes: vec![
            route("acme", &backend),
            route("twice", "127.0.0.1:1"),
            route("twice", "127.0.0.1:2"),
        ],
    });
    eventually("the ACK", || async {
        store.session("gw-test").await.unwrap().unwrap().acked_version > applied
    })
    .await;
    assert_eq!(store.session("gw-test").await.unwrap().unwrap().nacked_version, 0);
    assert_eq!(
        call(&acme, SECRET, "ListQueues", json!({})).await.0,
        200,
        "still routed beside the route left out"
    );
    // Bodies pass through untouched, even one that holds the engine's address.
    let queue_url = created["QueueUrl"].as_str().unwrap().to_owned();
    let text = format!("see http://{engine_addr}/acme/jobs");
    let (status, _) = call(
        &acme,
        SECRET,
        "SendMessage",
        json!({"QueueUrl": queue_url, "MessageBody": text}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, received) = call(&acme, SECRET, "ReceiveMessage", json!({"QueueUrl": queue_url})).await;
    assert_eq!(received["Messages"][0]["Body"], text.as_str(), "{received}");
    let (_, _) = call(
        &acme,
        SECRET,
        "DeleteMessage",
        json!({"QueueUrl": queue_url, "ReceiptHandle": received["Messages"][0]["ReceiptHandle"]}),
    )
    .await;

    // Requests at once share each serving thread's link to the engine;
    // each gets its own answer (the digest of its own body).
    let sends = (0..64).map(|i| {
        let (acme, queue_url) = (acme.clone(), queue_url.clone());
        async move {
            let text = format!("concurrent {i}");
            let (status, sent) = call(
                &acme,
                SECRET,
                "SendMessage",
                json!({"QueueUrl": queue_url, "MessageBody": text}),
            )
            .await;
            assert_eq!(status, 200, "{sent}");
            use md5::Digest;
            let digest = sless_runtime::hex::encode(&md5::Md5::digest(text.as_bytes()));
            assert_eq!(sent["MD5OfMessageBody"], digest.as_str(), "{sent}");
        }
    });
    join_all(sends).await;

    // A header the gateway passes on, longer than the link's field for it,
    // is the client's error, refused whole (never cut short), and the link
    // serves on. (A path and query cannot be: HTTP's URIs end at 64 KiB.)
    let mut headers = sigv4::signed_json_headers(&acme, "ListQueues", b"{}", ACCESS, SECRET, "ru-msk-1").unwrap();
    headers.insert("user-agent", "u".repeat(70_000).parse().unwrap());
    let (status, text) = sless_testkit::post(&acme, headers, "{}".into()).await;
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("InvalidParameterValue") && text.contains("header value"),
        "{text}"
    );
    assert_eq!(call(&acme, SECRET, "ListQueues", json!({})).await.0, 200);

    // With the engine gone, the edge answers 503, not a hang or a 500.
    drop(engine_server);
    let (status, err) = call(&acme, SECRET, "ListQueues", json!({})).await;
    assert_eq!(
        (status, err["__type"].as_str()),
        (503, Some("com.amazonaws.sqs#ServiceUnavailable"))
    );
    // Back at the same address, it is linked to again.
    let _engine_server = EngineServer::start(engine, engine_addr, Some(ENGINE_TOKEN.into()))
        .await
        .unwrap();
    eventually("the gateway to link to the restarted engine", || async {
        call(&acme, SECRET, "ListQueues", json!({})).await.0 == 200
    })
    .await;
}

async fn join_all<F: std::future::Future<Output = ()> + Send + 'static>(all: impl Iterator<Item = F>) {
    let tasks: Vec<_> = all.map(tokio::spawn).collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// `sless dev`'s path: an engine registered in process is called without
/// a socket (nothing listens at its address), with its own token check;
/// once removed, its address is tried and is unreachable.
#[tokio::test]
async fn an_engine_in_process_is_called_directly_with_its_token_check() {
    use sless_sqs::engine::server::router;
    use sless_sqs::gateway::proxy::InProcessEngines;

    let store = Arc::new(MemoryStore::new());
    let cp = Harness::start(store, config(None)).await;
    let engines = InProcessEngines::default();
    let gateway = plaintext_gateway(cp.addr, "gw-in-process")
        .await
        .with_in_process_engines(engines.clone());
    let acme = format!("{}/sqs/acme", gateway.public_url());
    let base = gateway.public_url().to_owned();
    tokio::spawn(gateway.run(std::future::pending()));
    // Port 1: no engine listens there.
    let backend = "127.0.0.1:1";
    let engine = |token: &str| {
        let engine = Engine::in_memory(EngineConfig {
            account_id: "acme".into(),
            region: "ru-msk-1".into(),
            base_url: acme.clone(),
        });
        router(engine, Some(token.into()))
    };
    engines.insert(backend.into(), engine(ENGINE_TOKEN));
    cp.publisher.publish(RoutingSnapshot {
        routes: vec![route("acme", backend)],
    });
    let healthz = format!("{base}/healthz");
    eventually("the gateway to apply its snapshot", || async {
        reqwest::get(&healthz).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let (status, created) = call(&acme, SECRET, "CreateQueue", json!({"QueueName": "jobs"})).await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["QueueUrl"], format!("{acme}/acme/jobs"));

    // An engine taking another token refuses the gateway's, in process too.
    engines.insert(backend.into(), engine("another-token"));
    let (status, err) = call(&acme, SECRET, "ListQueues", json!({})).await;
    assert_eq!(
        (
            status,
            err["__type"].as_str().is_some_and(|t| t.contains("AccessDenied"))
        ),
        (403, true),
        "{err}"
    );

    engines.remove(backend);
    let (status, _) = call(&acme, SECRET, "ListQueues", json!({})).await;
    assert_eq!(status, 503, "nothing answers at port 1");
}

/// A route naming a queue engine's three replicas (and, first, an address
/// where nothing listens): the gateway skips what it cannot reach, any
/// replica serves, and once the leader's process is gone the others take
/// its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_of_three_replicas_is_served_by_any_that_answers() {
    use sless_sqs::engine::Persistence;
    use sless_sqs::engine::raft::Replication;
    let store = Arc::new(MemoryStore::new());
    let cp = Harness::start(store.clone(), config(None)).await;
    let gateway = plaintext_gateway(cp.addr, "gw-replicas").await;
    let acme = format!("{}/sqs/acme", gateway.public_url());
    tokio::spawn(gateway.run(std::future::pending()));
    let dir = sless_testkit::TempDir::new("gateway-replicas");
    let peer_ports: Vec<u16> = (0..3).map(|_| sless_testkit::free_port()).collect();
    let peers: std::collections::BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", peer_ports[id as usize - 1])))
        .collect();
    let mut replicas = Vec::new();
    for id in 1..=3u64 {
        let replication = Replication {
            me: id,
            peers: peers.clone(),
            token: "the-replicas-token-of-the-test".into(),
        };
        let listen = peers[&id].parse().unwrap();
        let persistence = Persistence {
            journal: dir.0.join(id.to_string()).join("queues.journal"),
            durability: Default::default(),
        };
        std::fs::create_dir_all(dir.0.join(id.to_string())).unwrap();
        let config = EngineConfig {
            account_id: "acme".into(),
            region: "ru-msk-1".into(),
            base_url: acme.clone(),
        };
        let engine = Engine::open_replica(config, Some(&persistence), Some((replication, listen)))
            .await
            .unwrap();
        let server = EngineServer::start(
            engine.clone(),
            "127.0.0.1:0".parse().unwrap(),
            Some(ENGINE_TOKEN.into()),
        )
        .await
        .unwrap();
        replicas.push(Some((engine, server)));
    }
    let nowhere = format!("127.0.0.1:{}", sless_testkit::free_port());
    let members: Vec<String> = std::iter::once(nowhere)
        .chain(replicas.iter().flatten().map(|(_, s)| s.addr.to_string()))
        .collect();
    cp.publisher.publish(RoutingSnapshot {
        routes: vec![route("acme", &members.join(","))],
    });
    let healthz = format!("{}/healthz", acme.trim_end_matches("/sqs/acme"));
    eventually("the gateway to apply the route", || async {
        reqwest::get(&healthz).await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    // Until the replicas elected a leader, the SDKs' retry: so does this.
    let retrying = |action: &'static str, body: Value| {
        let acme = acme.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let (status, answer) = call(&acme, SECRET, action, body.clone()).await;
                if status == 200 {
                    return answer;
                }
                assert!(
                    status == 503 && Instant::now() < deadline,
                    "{action}: {status} {answer}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let created = retrying("CreateQueue", json!({"QueueName": "jobs"})).await;
    let queue = created["QueueUrl"].as_str().unwrap().to_owned();
    retrying("SendMessage", json!({"QueueUrl": queue, "MessageBody": "before"})).await;
    // Replica 1 started the queue service alone and leads it; once the
    // others are voters (and the change is over: while the membership is
    // joint, no election succeeds without replica 1), it goes away with its peer port, and they elect a
    // leader and serve its requests.
    eventually("the three replicas to be voters", || async {
        let status = reqwest::Client::new()
            .get(format!("http://{}/raft/status", peers[&2]))
            .header("x-sless-peer-token", "the-replicas-token-of-the-test")
            .send()
            .await;
        match status {
            Ok(status) => status
                .json::<Value>()
                .await
                .is_ok_and(|s| s["voters"] == json!([1, 2, 3]) && s["joint"] == false),
            Err(_) => false,
        }
    })
    .await;
    let (engine, server) = replicas[0].take().unwrap();
    drop(server);
    drop(engine);
    retrying("SendMessage", json!({"QueueUrl": queue, "MessageBody": "after"})).await;
    let mut bodies = Vec::new();
    while bodies.len() < 2 {
        let received = retrying(
            "ReceiveMessage",
            json!({"QueueUrl": queue, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
        )
        .await;
        for m in received["Messages"].as_array().into_iter().flatten() {
            bodies.push(m["Body"].as_str().unwrap().to_owned());
        }
    }
    bodies.sort();
    assert_eq!(bodies, ["after", "before"]);
}
