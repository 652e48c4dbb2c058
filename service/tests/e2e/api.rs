//! The REST API through a real `sless dev` process over a loopback socket.
//!
//! Over 500 lines: one scenario a test, each with its own `sless dev`.

use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir, pg_dataflow};
use serde_json::{Value, json};

fn error_code(body: &Value) -> &str {
    body["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("not an error body: {body}"))
}

#[tokio::test]
async fn missing_bad_and_malformed_tokens_get_401() {
    let dir = TempDir::new("auth");
    let server = DevServer::start(&dir.0);
    let http = reqwest::Client::new();
    for path in [
        "/api/v1/queue-services",
        "/api/v1/dataflows",
        "/api/v1/queue-services/x",
    ] {
        let resp = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path}");
        assert_eq!(resp.headers()["www-authenticate"], "Bearer");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(error_code(&body), "unauthorized");
    }
    let (status, body) = server
        .client("not-a-valid-token-at-all")
        .get("/api/v1/queue-services")
        .await;
    assert_eq!((status, error_code(&body)), (401, "unauthorized"));
    let resp = http
        .get(server.url("/api/v1/queue-services"))
        .header("authorization", format!("Basic {TOKEN_A}"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // An unauthenticated write creates nothing.
    let resp = http
        .post(server.url("/api/v1/queue-services"))
        .json(&json!({"name": "q"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let (status, body) = server.client(TOKEN_A).get("/api/v1/queue-services").await;
    assert_eq!((status, body), (200, json!({"items": []})));
    // The generated dev tenant's token works.
    assert_eq!(server.client(&server.dev_token).get("/api/v1/dataflows").await.0, 200);
}

#[tokio::test]
async fn tenants_never_see_each_other() {
    let dir = TempDir::new("isolation");
    let server = DevServer::start(&dir.0);
    let (a, b) = (server.client(TOKEN_A), server.client(TOKEN_B));
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "shared"})).await.0, 201);
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("flow")).await.0, 201);

    for path in ["/api/v1/queue-services", "/api/v1/dataflows"] {
        let (status, body) = b.get(path).await;
        assert_eq!((status, &body), (200, &json!({"items": []})), "{path}");
    }
    for path in ["/api/v1/queue-services/shared", "/api/v1/dataflows/flow"] {
        let (status, get) = b.get(path).await;
        assert_eq!((status, error_code(&get)), (404, "not_found"), "{path}");
        let (status, _) = b.patch(path, json!({})).await;
        assert_eq!(status, 404, "{path}");
        let (status, _) = b.delete(path).await;
        assert_eq!(status, 404, "{path}");
    }
    // The 404 for another tenant's object is the same as for a missing one.
    let (_, missing) = b.get("/api/v1/dataflows/nope").await;
    let (_, foreign) = b.get("/api/v1/dataflows/flow").await;
    assert_eq!(missing["error"]["code"], foreign["error"]["code"]);
    assert_eq!(
        missing["error"]["message"].as_str().unwrap().replace("\"nope\"", "?"),
        foreign["error"]["message"].as_str().unwrap().replace("\"flow\"", "?")
    );

    // Names are per tenant: B can use the same names.
    let (status, view) = b.post("/api/v1/queue-services", json!({"name": "shared"})).await;
    assert_eq!((status, view["tenantId"].as_str()), (201, Some("b")));
    assert_eq!(b.post("/api/v1/dataflows", pg_dataflow("flow")).await.0, 201);
    assert_ne!(
        a.get("/api/v1/queue-services/shared").await.1["accessKey"],
        view["accessKey"],
        "each tenant has its own keys"
    );
    // A's objects survived B's attempts.
    assert_eq!(a.get("/api/v1/queue-services/shared").await.1["tenantId"], "a");
    assert_eq!(a.get("/api/v1/dataflows/flow").await.0, 200);
}

#[tokio::test]
async fn queue_service_crud() {
    let dir = TempDir::new("qs-crud");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);

    let resp = a
        .http
        .post(server.url("/api/v1/queue-services"))
        .bearer_auth(TOKEN_A)
        .json(&json!({"name": "main", "memoryMB": 128}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["location"], "/api/v1/queue-services/main");
    let created: Value = resp.json().await.unwrap();
    assert_eq!(created["name"], "main");
    assert_eq!(created["tenantId"], "a");
    assert_eq!(
        (created["memoryMB"].as_u64(), created["storageMB"].as_u64()),
        (Some(128), Some(512))
    );
    assert_eq!(created["persistence"], true);
    assert!(created["accessKey"].as_str().unwrap().starts_with("SQSAKa_"));
    assert!(!created["secretKey"].as_str().unwrap().is_empty());
    assert!(created["createdAt"].as_str().unwrap().ends_with('Z'));
    for field in ["phase", "endpoint", "message", "readyAt"] {
        assert!(created.get(field).is_some(), "view has {field}");
    }

    // Ready once its queue engine answers and the gateway routes to it.
    let mut got = Value::Null;
    for _ in 0..100 {
        got = a.get("/api/v1/queue-services/main").await.1;
        if got["phase"] == "Ready" {
            break;
        }
        assert_ne!(got["phase"], "Failed", "{got}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(got["phase"], "Ready", "{got}");
    let endpoint = got["endpoint"].as_str().unwrap();
    assert!(
        endpoint.starts_with("http://127.0.0.1:") && endpoint.ends_with("/sqs/a"),
        "{endpoint}"
    );
    assert!(got["readyAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(got["region"], "ru-msk-1", "the region queue ARNs carry, for the SDKs");

    let (status, body) = a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    assert_eq!((status, error_code(&body)), (409, "already_exists"));
    let (status, body) = a.post("/api/v1/queue-services", json!({"name": "second"})).await;
    assert_eq!((status, error_code(&body)), (409, "conflict"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(r#"already has queue service "main""#) && message.contains("up to 1000 queues"),
        "{message}"
    );

    let (status, list) = a.get("/api/v1/queue-services").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 1);

    // PATCH changes only what is given; keys stay.
    let (status, patched) = a.patch("/api/v1/queue-services/main", json!({"storageMB": 1024})).await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(
        (patched["memoryMB"].as_u64(), patched["storageMB"].as_u64()),
        (Some(128), Some(1024))
    );
    assert_eq!(patched["accessKey"], created["accessKey"]);
    // PUT replaces: absent memoryMB goes back to its default.
    let (status, put) = a
        .put(
            "/api/v1/queue-services/main",
            json!({"name": "main", "storageMB": 2048}),
        )
        .await;
    assert_eq!(status, 200, "{put}");
    assert_eq!(
        (put["memoryMB"].as_u64(), put["storageMB"].as_u64()),
        (Some(64), Some(2048))
    );

    for (body, field) in [
        (json!({"storageMB": 1024}), "storageMB"),
        (json!({"persistence": false}), "persistence"),
        (json!({"name": "other"}), "name"),
        (json!({"memoryMB": 4096}), "memoryMB"),
    ] {
        let (status, err) = a.patch("/api/v1/queue-services/main", body.clone()).await;
        assert_eq!((status, error_code(&err)), (422, "validation_failed"), "{body}");
        assert_eq!(err["error"]["field"], field, "{body}");
        // Values as the client wrote them, not as Rust debug-prints them.
        let message = err["error"]["message"].as_str().unwrap();
        assert!(!message.contains("DnsLabel"), "{message}");
    }
    let (_, unchanged) = a.get("/api/v1/queue-services/main").await;
    assert_eq!(
        (unchanged["memoryMB"].as_u64(), unchanged["storageMB"].as_u64()),
        (Some(64), Some(2048))
    );

    assert_eq!(a.delete("/api/v1/queue-services/main").await.0, 204);
    assert_eq!(a.get("/api/v1/queue-services/main").await.0, 404);
    assert_eq!(a.delete("/api/v1/queue-services/main").await.0, 404);
    // With the old one gone, the tenant can create a new one.
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "second"})).await.0, 201);
}

#[tokio::test]
async fn dataflow_crud() {
    let dir = TempDir::new("df-crud");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);

    let (status, created) = a.post("/api/v1/dataflows", pg_dataflow("orders")).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["checkpointPersistence"], true);
    assert_eq!(created["channelBufferSize"], 100);
    assert_eq!(created["source"]["config"]["table"], "orders");
    assert_eq!(created["transformations"][0]["type"], "mask");
    assert!(created["phase"].is_string() && created.get("message").is_some());

    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("orders")).await.0, 409);
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("second")).await.0, 201);
    let (_, list) = a.get("/api/v1/dataflows").await;
    let names: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["orders", "second"]);

    let (status, patched) = a
        .patch("/api/v1/dataflows/orders", json!({"channelBufferSize": 500}))
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["channelBufferSize"], 500);
    assert_eq!(patched["transformations"], created["transformations"]);

    let mut replacement = pg_dataflow("orders");
    replacement["transformations"] = json!([]);
    let (status, put) = a.put("/api/v1/dataflows/orders", replacement).await;
    assert_eq!(status, 200, "{put}");
    assert_eq!(put["transformations"], json!([]));
    assert_eq!(put["channelBufferSize"], 100, "PUT resets absent fields");

    // An invalid update changes nothing.
    let (status, err) = a
        .patch(
            "/api/v1/dataflows/orders",
            json!({"transformations": [{"type": "nope", "config": {}}]}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (422, Some("transformations[0].type"))
    );
    assert_eq!(a.get("/api/v1/dataflows/orders").await.1["transformations"], json!([]));

    assert_eq!(a.delete("/api/v1/dataflows/orders").await.0, 204);
    assert_eq!(a.get("/api/v1/dataflows/orders").await.0, 404);
}

#[tokio::test]
async fn bad_input_gets_4xx_json_and_creates_nothing() {
    let dir = TempDir::new("validation");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);

    let long = "x".repeat(64);
    for (body, field) in [
        (json!({}), "name"),
        (json!({"name": ""}), "name"),
        (json!({"name": "Bad_Name"}), "name"),
        (json!({"name": long}), "name"),
        (json!({"name": "q", "memoryMB": 31}), "memoryMB"),
        (json!({"name": "q", "memoryMB": 1025}), "memoryMB"),
        (json!({"name": "q", "storageMB": 127}), "storageMB"),
        (json!({"name": "q", "storageMB": 10241}), "storageMB"),
    ] {
        let (status, err) = a.post("/api/v1/queue-services", body.clone()).await;
        assert_eq!((status, error_code(&err)), (422, "validation_failed"), "{body}");
        assert_eq!(err["error"]["field"], field, "{body}");
        // Values as the client wrote them, not as Rust debug-prints them.
        let message = err["error"]["message"].as_str().unwrap();
        assert!(!message.contains("DnsLabel"), "{message}");
    }
    for body in [
        json!({"name": "q", "memory": 64}),
        json!({"name": "q", "memoryMB": "big"}),
        json!([1, 2]),
        json!("q"),
    ] {
        let (status, err) = a.post("/api/v1/queue-services", body.clone()).await;
        assert_eq!((status, error_code(&err)), (400, "bad_request"), "{body}");
    }

    let dataflow_cases = [
        (json!({"name": "d"}), "source"),
        (
            json!({"name": "d", "source": {"type": "mysql", "config": {}}, "sink": pg_dataflow("x")["sink"]}),
            "source.type",
        ),
        (
            json!({"name": "d", "source": {"config": {}}, "sink": pg_dataflow("x")["sink"]}),
            "source.type",
        ),
        (
            json!({"name": "d", "source": pg_dataflow("x")["source"], "sink": {"type": "nessie", "config": {}}}),
            "sink.config.nessieUrl",
        ),
        (
            json!({"name": "d", "source": pg_dataflow("x")["source"],
                   "sink": {"type": "clickhouse", "config": {"connectionString": "clickhouse://ch:9000", "table": "t"}}}),
            "sink.config.connectionString",
        ),
        (
            json!({"name": "d", "source": {"type": "clickhouse", "config": {"connectionString": "http://ch:8123", "pollInterval": 0}},
                   "sink": pg_dataflow("x")["sink"]}),
            "source.config.table",
        ),
        (
            json!({"name": "d", "source": {"type": "postgresql", "config": {"table": "t"}}, "sink": pg_dataflow("x")["sink"]}),
            "source.config.connectionString",
        ),
        (
            json!({"name": "d", "source": pg_dataflow("x")["source"], "sink": {"type": "trino", "config": {
                "serverURL": "http://trino:8080", "catalog": "c", "schema": "s", "table": "t", "password": "p"}}}),
            "sink.config.serverURL",
        ),
        (
            json!({"name": "d", "source": {"type": "trino", "config": {"serverURL": "https://trino", "catalog": "c",
                "schema": "s", "table": "t", "upsertMode": true}}, "sink": pg_dataflow("x")["sink"]}),
            "source.config.upsertMode",
        ),
        (
            json!({"name": "d", "source": {"type": "kafka", "config": {"topic": "t"}}, "sink": pg_dataflow("x")["sink"]}),
            "source.config.brokers",
        ),
        (
            json!({"name": "d", "source": {"type": "postgresql"}, "sink": pg_dataflow("x")["sink"]}),
            "source.config",
        ),
        (
            json!({"name": "d", "source": pg_dataflow("x")["source"], "sink": pg_dataflow("x")["sink"],
            "transformations": [{"type": "uppercase", "config": {}}]}),
            "transformations[0].type",
        ),
        (
            json!({"name": "d", "source": pg_dataflow("x")["source"], "sink": pg_dataflow("x")["sink"],
            "transformations": [{"type": "filter"}]}),
            "transformations[0].config",
        ),
        (
            json!({"name": "D!", "source": pg_dataflow("x")["source"], "sink": pg_dataflow("x")["sink"]}),
            "name",
        ),
    ];
    for (body, field) in dataflow_cases {
        let (status, err) = a.post("/api/v1/dataflows", body.clone()).await;
        assert_eq!((status, error_code(&err)), (422, "validation_failed"), "{body}");
        assert_eq!(err["error"]["field"], field, "{body}");
        assert!(!err["error"]["message"].as_str().unwrap().is_empty());
    }
    // A token is never sent in the clear.
    let (status, err) = a
        .post(
            "/api/v1/dataflows",
            json!({"name": "d", "sink": pg_dataflow("x")["sink"], "source": {"type": "nessie", "config":
                {"nessieUrl": "http://nessie:19120", "namespace": "n", "table": "t", "token": "secret"}}}),
        )
        .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (422, &json!("source.config.nessieUrl")),
        "{err}"
    );
    assert!(
        err["error"]["message"].as_str().unwrap().contains("only over https://"),
        "{err}"
    );

    // Raw bodies: malformed JSON, wrong content type, oversized.
    let raw = |body: &'static str, content_type: &'static str| {
        a.http
            .post(server.url("/api/v1/dataflows"))
            .bearer_auth(TOKEN_A)
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let resp = raw("{\"name\": ", "application/json").await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(error_code(&resp.json::<Value>().await.unwrap()), "bad_request");
    let resp = raw("name=d", "application/x-www-form-urlencoded").await.unwrap();
    assert_eq!(resp.status(), 415);
    assert_eq!(
        error_code(&resp.json::<Value>().await.unwrap()),
        "unsupported_media_type"
    );
    let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(300 * 1024));
    let resp = a
        .http
        .post(server.url("/api/v1/dataflows"))
        .bearer_auth(TOKEN_A)
        .header("content-type", "application/json")
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(error_code(&resp.json::<Value>().await.unwrap()), "payload_too_large");

    // Unknown routes and methods are JSON errors too.
    let (status, err) = a.get("/api/v1/nothing-here").await;
    assert_eq!((status, error_code(&err)), (404, "no_route"));
    let (status, err) = a.send(reqwest::Method::DELETE, "/api/v1/dataflows", None).await;
    assert_eq!((status, error_code(&err)), (405, "method_not_allowed"));

    for path in ["/api/v1/queue-services", "/api/v1/dataflows"] {
        assert_eq!(
            a.get(path).await.1,
            json!({"items": []}),
            "nothing was created at {path}"
        );
    }
}

#[tokio::test]
async fn health_metrics_and_openapi() {
    let dir = TempDir::new("ops");
    let server = DevServer::start(&dir.0);
    let http = reqwest::Client::new();
    for path in ["/healthz", "/readyz"] {
        assert_eq!(http.get(server.url(path)).send().await.unwrap().status(), 200, "{path}");
    }
    let a = server.client(TOKEN_A);
    a.get("/api/v1/queue-services/some-name").await;
    a.get("/api/v1/queue-services/other-name").await;

    let metrics = http
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = metrics
        .lines()
        .find(|l| l.starts_with("sless_api_requests_total{") && l.contains(r#"route="/api/v1/queue-services/{name}""#))
        .unwrap_or_else(|| panic!("no per-route counter in:\n{metrics}"));
    assert!(line.contains(r#"status="404""#) && line.ends_with(" 2"), "{line}");
    assert!(metrics.contains("sless_api_request_duration_seconds_bucket"));
    assert!(!metrics.contains("some-name"), "object names are not label values");

    let doc: Value = http
        .get(server.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/v1/queue-services",
        "/api/v1/queue-services/{name}",
        "/api/v1/dataflows",
        "/api/v1/dataflows/{name}",
    ] {
        assert!(doc["paths"][path].is_object(), "openapi documents {path}");
    }
    for method in ["get", "put", "patch", "delete"] {
        assert!(
            doc["paths"]["/api/v1/queue-services/{name}"][method].is_object(),
            "{method}"
        );
    }
    let props = &doc["components"]["schemas"]["QueueServiceRequest"]["properties"];
    assert!(
        props["memoryMB"].is_object() && props["persistence"].is_object(),
        "{props}"
    );
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
}

/// N5 of the attack run: the quota was a list, a check and a create with
/// nothing between them, and 150 creates at once made 145 dataflows
/// against a quota of 100. Their endpoints are closed ports, so the
/// dataflows made only retry a refused connection.
#[tokio::test]
async fn creates_at_once_never_pass_the_dataflow_quota() {
    let dir = TempDir::new("quota-race");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let closed = json!({"connectionString": "postgres://127.0.0.1:1/none", "table": "t"});
    let creates = (0..150).map(|i| {
        let a = a.clone();
        let spec = json!({"name": format!("f{i}"),
            "source": {"type": "postgresql", "config": closed},
            "sink": {"type": "postgresql", "config": closed}});
        tokio::spawn(async move { a.post("/api/v1/dataflows", spec).await })
    });
    let mut answers = std::collections::BTreeMap::<(u16, String), usize>::new();
    for create in creates.collect::<Vec<_>>() {
        let (status, body) = create.await.unwrap();
        let code = body["error"]["code"].as_str().unwrap_or_default().to_owned();
        *answers.entry((status, code)).or_default() += 1;
    }
    let (status, list) = a.get("/api/v1/dataflows").await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 100, "{answers:?}");
    let expected = [((201, String::new()), 100), ((403, "quota_exceeded".to_owned()), 50)];
    assert_eq!(answers, expected.into(), "answers by status and code");
}

/// Quotas and the API rate, per tenant: 300 dataflows in 0.9 s were
/// accepted before, and one dataflow with a 32-route router held 35 of a
/// shared PostgreSQL's connections. (A tenant has one queue service; its
/// engine bounds its queues.)
#[tokio::test]
async fn quotas_and_the_api_rate_bound_each_tenant_alone() {
    let dir = TempDir::new("quotas");
    let server = DevServer::start_with(
        &dir.0,
        "127.0.0.1:0",
        &[
            "--max-dataflows",
            "2",
            "--max-sinks-per-dataflow",
            "3",
            "--api-rate",
            "5",
            "--api-burst",
            "40",
        ],
    );
    let (a, b) = (server.client(TOKEN_A), server.client(TOKEN_B));
    // A router of three routes makes four sinks: over the quota of three.
    let mut routed = pg_dataflow("routed");
    let sink = routed["sink"].clone();
    let route = |v: i64| json!({"condition": format!("$.v == {v}"), "sink": sink.clone()});
    routed["transformations"] = json!([{"type": "router", "config": {"routes": [route(1), route(2), route(3)]}}]);
    let (status, body) = a.post("/api/v1/dataflows", routed.clone()).await;
    assert_eq!((status, error_code(&body)), (403, "quota_exceeded"), "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("this one has 4"),
        "{body}"
    );
    routed["transformations"][0]["config"]["routes"] = json!([route(1), route(2)]);
    assert_eq!(a.post("/api/v1/dataflows", routed.clone()).await.0, 201);
    // An update may not grow past it either.
    routed["transformations"][0]["config"]["routes"] = json!([route(1), route(2), route(3)]);
    let (status, _) = a.put("/api/v1/dataflows/routed", routed).await;
    assert_eq!(status, 403);
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("second")).await.0, 201);
    let (status, body) = a.post("/api/v1/dataflows", pg_dataflow("third")).await;
    assert_eq!((status, error_code(&body)), (403, "quota_exceeded"), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 2 dataflows")
    );
    // The name it already has is still a 409, not a quota; b has its own.
    assert_eq!(a.post("/api/v1/dataflows", pg_dataflow("second")).await.0, 409);
    assert_eq!(b.post("/api/v1/dataflows", pg_dataflow("third")).await.0, 201);

    // The rate: a burst of 40, then 429 with Retry-After, for a alone.
    let mut limited = None;
    for _ in 0..60 {
        let resp = a
            .http
            .get(server.url("/api/v1/dataflows"))
            .bearer_auth(TOKEN_A)
            .send()
            .await
            .unwrap();
        if resp.status() == 429 {
            limited = Some(resp);
            break;
        }
    }
    let limited = limited.expect("60 requests at once passed a burst of 40");
    assert!(
        limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let body: Value = limited.json().await.unwrap();
    assert_eq!(error_code(&body), "too_many_requests");
    assert_eq!(
        b.get("/api/v1/dataflows").await.0,
        200,
        "another tenant's rate is its own"
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(a.get("/api/v1/dataflows").await.0, 200, "refilled at 5 a second");
}

/// What the OpenAPI document promises, the server takes: an integer written
/// `64.0` (JSON Schema's integer) is an integer; and what it refuses, the
/// server refuses: an array where an object is expected (serde read a
/// struct from one, field by field).
#[tokio::test]
async fn bodies_are_taken_as_the_document_types_them() {
    let dir = TempDir::new("body-types");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let (status, body) = a
        .post(
            "/api/v1/queue-services",
            json!({"name": "main", "memoryMB": 64.0, "storageMB": 256.0}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        (body["memoryMB"].as_u64(), body["storageMB"].as_u64()),
        (Some(64), Some(256))
    );
    for (value, why) in [(json!(64.5), "a fraction"), (json!(1e300), "out of range")] {
        let (status, body) = a.patch("/api/v1/queue-services/main", json!({"memoryMB": value})).await;
        assert_eq!((status, error_code(&body)), (400, "bad_request"), "{why}: {body}");
    }
    let mut flow = pg_dataflow("buffered");
    flow["channelBufferSize"] = json!(10.0);
    assert_eq!(a.post("/api/v1/dataflows", flow).await.0, 201);
    for array in [json!(["main", 64, 512, true]), json!([]), json!("main"), json!(7)] {
        let (status, body) = a.post("/api/v1/queue-services", array.clone()).await;
        assert_eq!((status, error_code(&body)), (400, "bad_request"), "{array}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("JSON object"),
            "{body}"
        );
    }
}
