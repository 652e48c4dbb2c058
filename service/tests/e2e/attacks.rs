//! Regressions of the attack run against `sless dev` (a real process on
//! loopback): what a hostile tenant or a local process sends, and that the
//! platform answers it with a clear error and stays up.

use serde_json::{Value, json};

use crate::common::{DevServer, TOKEN_A, TempDir, pg_dataflow};
use sless_testkit::post;

fn with_filter(name: &str, condition: &str) -> Value {
    let mut flow = pg_dataflow(name);
    flow["transformations"] = json!([{"type": "filter", "config": {"condition": condition}}]);
    flow
}

/// Each of these aborted the whole process (stack overflow) before, or was
/// stored and aborted it at the first record and after every restart.
#[tokio::test]
async fn condition_bombs_are_refused_with_the_field_named_and_the_platform_stays_up() {
    let dir = TempDir::new("condition-bombs");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    let bombs = [
        ("parens", format!("{}a{}", "(".repeat(520), ")".repeat(520))),
        ("chain", vec!["a"; 20_000].join(" && ")),
        ("path", vec!["a"; 5_000].join(".")),
    ];
    for (name, condition) in &bombs {
        let (status, body) = a.post("/api/v1/dataflows", with_filter(name, condition)).await;
        assert_eq!(status, 422, "{name}: {body}");
        assert_eq!(body["error"]["code"], "validation_failed", "{name}");
        assert_eq!(
            body["error"]["field"], "transformations[0].config.condition",
            "{name}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.len() < 300,
            "{name}: the error does not echo the whole condition"
        );
    }
    // A router's conditions are bounded the same way, and named by route.
    let mut routed = pg_dataflow("routed");
    routed["transformations"] = json!([{"type": "router", "config": {"routes": [
        {"condition": "a", "sink": routed["sink"].clone()},
        {"condition": format!("{}a", "(".repeat(100)), "sink": routed["sink"].clone()},
    ]}}]);
    let (status, body) = a.post("/api/v1/dataflows", routed).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "transformations[0].config.routes[1].condition");
    // 1,600 `!` overflowed the stack; now a run of them folds into one node.
    let (status, body) = a
        .post(
            "/api/v1/dataflows",
            with_filter("many-nots", &format!("{}active", "!".repeat(2000))),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // Still serving.
    assert_eq!(a.get("/api/v1/dataflows/many-nots").await.0, 200);
    assert_eq!(reqwest::get(server.url("/healthz")).await.unwrap().status(), 200);
}

/// A queue service of tenant `a`, once Ready: (endpoint, access key, secret key).
async fn ready_queue_service(server: &DevServer) -> (String, String, String) {
    let a = server.client(TOKEN_A);
    let (status, body) = a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    assert_eq!(status, 201, "{body}");
    let view = crate::common::sqs::ready_queue_service(&a).await;
    let s = |k: &str| view[k].as_str().unwrap().to_owned();
    (s("endpoint"), s("accessKey"), s("secretKey"))
}

/// A captured request re-sent within the 15 minutes with another body (or
/// its query-protocol action rewritten) was answered 200 before.
#[tokio::test]
async fn a_captured_signature_does_not_carry_another_body() {
    use sless_sqs::sigv4;
    let dir = TempDir::new("replay");
    let server = DevServer::start(&dir.0);
    let (endpoint, access, secret) = ready_queue_service(&server).await;
    let create = json!({"QueueName": "jobs"}).to_string();
    let headers = sigv4::signed_json_headers(
        &endpoint,
        "CreateQueue",
        create.as_bytes(),
        &access,
        &secret,
        "ru-msk-1",
    )
    .unwrap();
    let (status, created) = post(&endpoint, headers, create).await;
    assert_eq!(status, 200, "{created}");
    let queue_url: Value = serde_json::from_str(&created).unwrap();
    let queue_url = queue_url["QueueUrl"].as_str().unwrap().to_owned();

    let body = json!({"QueueUrl": queue_url, "MessageBody": "pay 1"}).to_string();
    let headers =
        sigv4::signed_json_headers(&endpoint, "SendMessage", body.as_bytes(), &access, &secret, "ru-msk-1").unwrap();
    assert_eq!(post(&endpoint, headers.clone(), body.clone()).await.0, 200);
    // The same signature over another body.
    let forged = json!({"QueueUrl": queue_url, "MessageBody": "pay 1000"}).to_string();
    let (status, text) = post(&endpoint, headers.clone(), forged.clone()).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    // An unsigned x-amz-content-sha256 naming the signed body's hash.
    let mut claimed = headers.clone();
    let hash = <sha2::Sha256 as sha2::Digest>::digest(body.as_bytes());
    let hash: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    claimed.insert("x-amz-content-sha256", hash.parse().unwrap());
    let (status, text) = post(&endpoint, claimed, forged).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("XAmzContentSHA256Mismatch"), "{text}");

    // The query protocol: a signed SendMessage rewritten into DeleteQueue.
    let form = |action: &str| {
        format!(
            "Action={action}&QueueUrl={}&MessageBody=hi&Version=2012-11-05",
            urlencode(&queue_url)
        )
    };
    let send = form("SendMessage");
    let headers = signed_form(&endpoint, &access, &secret, &send);
    assert_eq!(post(&endpoint, headers.clone(), send).await.0, 200);
    let (status, text) = post(&endpoint, headers, form("DeleteQueue")).await;
    assert_eq!(status, 403, "{text}");
    // The queue is still there.
    let list = json!({}).to_string();
    let headers =
        sigv4::signed_json_headers(&endpoint, "ListQueues", list.as_bytes(), &access, &secret, "ru-msk-1").unwrap();
    let (status, text) = post(&endpoint, headers, list).await;
    assert_eq!(status, 200);
    assert!(text.contains("jobs"), "{text}");

    // Any region's name is accepted (SDKs default to us-east-1); a scope
    // of another service, or a region that is no region's name, is refused.
    for region in ["us-east-1", "eu-west-1"] {
        let list = json!({}).to_string();
        let headers =
            sigv4::signed_json_headers(&endpoint, "ListQueues", list.as_bytes(), &access, &secret, region).unwrap();
        let (status, text) = post(&endpoint, headers, list).await;
        assert_eq!(status, 200, "{region}: {text}");
    }
    for (region, scope, wanted) in [
        ("ru-msk-1", "/s3/aws4_request", "correct service"),
        ("Not_A_Region", "/sqs/aws4_request", "valid region"),
    ] {
        let list = json!({}).to_string();
        let mut headers =
            sigv4::signed_json_headers(&endpoint, "ListQueues", list.as_bytes(), &access, &secret, region).unwrap();
        let value = headers["authorization"]
            .to_str()
            .unwrap()
            .replace("/sqs/aws4_request", scope);
        headers.insert("authorization", value.parse().unwrap());
        let (status, text) = post(&endpoint, headers, list).await;
        assert_eq!(status, 403, "{text}");
        assert!(text.contains(wanted), "{text}");
    }
    // `/sqs/{tenant}/` answers in SQS's shape, not with an empty 404.
    let resp = reqwest::Client::new()
        .post(format!("{endpoint}/"))
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .header("content-type", "application/x-amz-json-1.0")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert!(resp.text().await.unwrap().contains("MissingAuthenticationToken"));
}

/// Headers of a query-protocol POST of `body` to `endpoint`, signed as an
/// SDK signs them.
fn signed_form(endpoint: &str, access: &str, secret: &str, body: &str) -> reqwest::header::HeaderMap {
    use sless_sqs::sigv4;
    let url = reqwest::Url::parse(endpoint).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    let host = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    headers.insert("host", host.parse().unwrap());
    headers.insert("content-type", "application/x-www-form-urlencoded".parse().unwrap());
    let date = sigv4::amz_date(std::time::SystemTime::now());
    headers.insert("x-amz-date", date.parse().unwrap());
    let request = sigv4::Request {
        method: "POST",
        path: url.path(),
        query: None,
        headers: &headers,
        body: body.as_bytes(),
    };
    let authorization = sigv4::sign(&request, access, secret, "ru-msk-1").unwrap();
    headers.insert("authorization", authorization.parse().unwrap());
    // The HTTP client sets Host itself.
    headers.remove("host");
    headers
}

/// A signed query-protocol request whose parameter names nest 100,000 deep
/// (it overflowed the engine's stack) or number in the ten thousands: a
/// clear 400, and the tenant's engine still answers.
#[tokio::test]
async fn query_protocol_bombs_through_the_gateway_get_a_400_and_the_engine_lives() {
    let dir = TempDir::new("query-bombs");
    let server = DevServer::start(&dir.0);
    let (endpoint, access, secret) = ready_queue_service(&server).await;
    let deep = format!("Action=ListQueues&{}=x", vec!["a"; 100_000].join("."));
    let many: String = (0..10_000).map(|i| format!("&P{i}=x")).collect();
    let many = format!("Action=ListQueues{many}");
    for body in [deep, many] {
        let headers = signed_form(&endpoint, &access, &secret, &body);
        let (status, text) = post(&endpoint, headers, body).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("MalformedQueryString"), "{text}");
    }
    let list = "Action=ListQueues&Version=2012-11-05".to_owned();
    let headers = signed_form(&endpoint, &access, &secret, &list);
    assert_eq!(post(&endpoint, headers, list).await.0, 200);
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Invented HTTP methods made new label values, one series each.
#[tokio::test]
async fn metrics_labels_come_from_a_closed_set() {
    let dir = TempDir::new("metrics-flood");
    let server = DevServer::start(&dir.0);
    let http = reqwest::Client::new();
    let size = || async {
        reqwest::get(server.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let before = size().await.len();
    for i in 0..300 {
        let method = reqwest::Method::from_bytes(format!("INVENTED{i}{}", "X".repeat(200)).as_bytes()).unwrap();
        http.request(method, server.url(&format!("/api/v1/x{i}")))
            .send()
            .await
            .unwrap();
    }
    let after = size().await;
    assert!(after.len() < before + 4096, "{} → {} bytes", before, after.len());
    assert!(after.contains("method=\"other\""), "{after}");
    assert!(!after.contains("INVENTED"));
    assert!(!after.contains("/api/v1/x1"), "raw paths are no labels");
}

/// `%ff` does not decode to text: a JSON 400 like every other error.
#[tokio::test]
async fn an_undecodable_path_gets_the_json_error() {
    let dir = TempDir::new("bad-path");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    for path in ["/api/v1/queue-services/%ff", "/api/v1/dataflows/%ff%fe"] {
        let (status, body) = a.get(path).await;
        assert_eq!(status, 400, "{path}");
        assert_eq!(body["error"]["code"], "bad_request", "{body}");
    }
}
