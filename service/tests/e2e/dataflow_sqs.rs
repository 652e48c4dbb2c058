//! Dataflows with a tenant's own SQS queues at either end, run by `sless
//! dev` through its SigV4 gateway, with a real PostgreSQL at the other end.

use std::time::{Duration, Instant};

use crate::common::pg::{count, db, pg, unique, wait_for, wait_mid_stream};
use crate::common::sqs::{call, ready_queue_service};
use crate::common::{DevServer, TOKEN_A, TempDir};
use serde_json::{Value, json};

/// Creates queue `name` of the tenant of `view` (FIFO when the name ends
/// in `.fifo`): its URL.
async fn create_queue(view: &Value, name: &str) -> String {
    let endpoint = view["endpoint"].as_str().unwrap();
    let mut request = json!({"QueueName": name});
    if name.ends_with(".fifo") {
        request["Attributes"] = json!({"FifoQueue": "true"});
    }
    let (status, text) = call(endpoint, view, "CreateQueue", request).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str::<Value>(&text).unwrap()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Sends `{"id": i, "amount": i}` for every `i` in `ids`, ten a request.
async fn send_rows(view: &Value, queue: &str, ids: std::ops::Range<i64>) {
    let endpoint = view["endpoint"].as_str().unwrap();
    let ids: Vec<i64> = ids.collect();
    for chunk in ids.chunks(10) {
        let entries: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"Id": format!("m{i}"), "MessageBody": json!({"id": i, "amount": i}).to_string()}))
            .collect();
        let (status, text) = call(
            endpoint,
            view,
            "SendMessageBatch",
            json!({"QueueUrl": queue, "Entries": entries}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        assert!(!text.contains("\"Failed\":[{"), "{text}");
    }
}

/// How many messages the queue holds, visible or in flight.
async fn held(view: &Value, queue: &str) -> i64 {
    let endpoint = view["endpoint"].as_str().unwrap();
    let (_, text) = call(
        endpoint,
        view,
        "GetQueueAttributes",
        json!({"QueueUrl": queue, "AttributeNames": ["All"]}),
    )
    .await;
    let attributes = serde_json::from_str::<Value>(&text).unwrap()["Attributes"].clone();
    ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        .iter()
        .map(|a| attributes[*a].as_str().unwrap().parse::<i64>().unwrap())
        .sum()
}

fn sqs(view: &Value, queue: &str, extra: Value) -> Value {
    let mut config = json!({
        "queueUrl": queue,
        "accessKeyId": view["accessKey"],
        "secretAccessKey": view["secretKey"],
    });
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({"type": "sqs", "config": config})
}

#[tokio::test]
async fn a_queue_to_postgresql_and_postgresql_to_a_queue() {
    let db = db().await;
    let dst = unique("sqs_dst");
    db.batch_execute(&format!("CREATE TABLE {dst} (id int PRIMARY KEY, amount int)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-sqs");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "main"})).await.0, 201);
    let view = ready_queue_service(&a).await;
    let input = create_queue(&view, "flow-in").await;
    let output = create_queue(&view, "flow-out").await;
    send_rows(&view, &input, 0..25).await;

    a.create_dataflow(json!({
        "name": "from-queue",
        "source": sqs(&view, &input, json!({"waitTimeSeconds": 1, "visibilityTimeout": 10})),
        "sink": pg(&dst, json!({"conflictKey": "id"})),
    }))
    .await;
    wait_for(&db, &format!("SELECT count(*) FROM {dst}"), 25).await;
    assert_eq!(
        count(&db, &format!("SELECT sum(amount) FROM {dst}")).await,
        (0..25).sum::<i64>()
    );
    // Deleted from the queue once written, not before.
    let deadline = Instant::now() + Duration::from_secs(20);
    while held(&view, &input).await > 0 {
        assert!(Instant::now() < deadline, "the queue was not drained");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    a.create_dataflow(json!({
        "name": "to-queue",
        "source": pg(&dst, json!({"pollInterval": 1})),
        "sink": sqs(&view, &output, json!({})),
        "transformations": [{"type": "filter", "config": {"condition": "amount >= 5"}}],
    }))
    .await;
    let endpoint = view["endpoint"].as_str().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 20 {
        assert!(Instant::now() < deadline, "only {} of 20 arrived", seen.len());
        let (_, text) = call(
            endpoint,
            &view,
            "ReceiveMessage",
            json!({"QueueUrl": output, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1}),
        )
        .await;
        for m in serde_json::from_str::<Value>(&text).unwrap()["Messages"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let body: Value = serde_json::from_str(m["Body"].as_str().unwrap()).unwrap();
            seen.insert(body["id"].as_i64().unwrap());
        }
    }
    assert_eq!(seen, (5..25).collect(), "each row once, filtered");
}

/// `kill -9` of `sless dev` while a queue drains into PostgreSQL: the
/// messages not yet deleted come back after their visibility timeout, and
/// every one lands (once, by its key).
#[tokio::test]
async fn a_queue_source_survives_kill_9_mid_stream() {
    let db = db().await;
    let dst = unique("sqs_kill");
    db.batch_execute(&format!("CREATE TABLE {dst} (id int PRIMARY KEY, amount int)"))
        .await
        .unwrap();
    let dir = TempDir::new("df-sqs-kill");
    // The queue URL in the spec names the gateway: it keeps its address.
    let gateway = format!("127.0.0.1:{}", sless_testkit::free_port());
    let server = DevServer::start_with_gateway(&dir.0, &gateway);
    let a = server.client(TOKEN_A);
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "main"})).await.0, 201);
    let view = ready_queue_service(&a).await;
    let input = create_queue(&view, "kill-in").await;
    send_rows(&view, &input, 0..600).await;
    a.create_dataflow(json!({
        "name": "drain",
        "source": sqs(&view, &input, json!({"waitTimeSeconds": 1, "visibilityTimeout": 3})),
        "sink": pg(&dst, json!({"conflictKey": "id"})),
    }))
    .await;
    let rows = format!("SELECT count(*) FROM {dst}");
    wait_mid_stream(&db, &rows, 0, 600).await;
    server.kill9();

    let server = DevServer::start_with_gateway(&dir.0, &gateway);
    let a = server.client(TOKEN_A);
    ready_queue_service(&a).await;
    wait_for(&db, &rows, 600).await;
    assert_eq!(count(&db, &format!("SELECT count(DISTINCT id) FROM {dst}")).await, 600);
}

/// An SQS connector may name the tenant's own queue service instead of a
/// URL and keys: the platform supplies them. Another tenant naming it gets
/// its own (absent) service, never this one.
#[tokio::test]
async fn a_dataflow_names_its_tenants_queue_service_and_never_another_tenants() {
    let db = db().await;
    let src = unique("sqs_by_name");
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, amount int);
         INSERT INTO {src} SELECT g, g FROM generate_series(1, 12) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-sqs-name");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "main"})).await.0, 201);
    let view = ready_queue_service(&a).await;
    let queue = create_queue(&view, "by-name").await;
    let by_name = json!({"type": "sqs", "config": {"queueService": "main", "queueName": "by-name"}});

    // What the platform supplies cannot be given as well.
    let mut both = by_name.clone();
    both["config"]["accessKeyId"] = json!("AKIA");
    let (status, err) = a
        .post(
            "/api/v1/dataflows",
            json!({"name": "both", "source": pg(&src, json!({})), "sink": both}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (422, Some("sink.config.accessKeyId")),
        "{err}"
    );
    let (status, err) = a
        .post(
            "/api/v1/dataflows",
            json!({"name": "bad", "source": pg(&src, json!({})),
                   "sink": {"type": "sqs", "config": {"queueService": "main", "queueName": "../x"}}}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (422, Some("sink.config.queueName")),
        "{err}"
    );

    a.create_dataflow(json!({"name": "to-service", "source": pg(&src, json!({"pollInterval": 1})), "sink": by_name}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while held(&view, &queue).await < 12 {
        assert!(Instant::now() < deadline, "the rows did not arrive");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Tenant b has no queue service "main": its dataflow fails, a's queue
    // gets nothing from it.
    let b = server.client(crate::common::TOKEN_B);
    b.create_dataflow(json!({
        "name": "intruder",
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": {"type": "sqs", "config": {"queueService": "main", "queueName": "by-name"}},
    }))
    .await;
    let view_b = b.wait_for_phase("intruder", "Error", Duration::from_secs(20)).await;
    assert!(
        view_b["message"].as_str().unwrap().contains("does not exist"),
        "{view_b}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(held(&view, &queue).await, 12);
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}

/// Rows whose bodies are equal all reach a FIFO queue: a message's
/// deduplication id names its place in what the sink wrote, not its body
/// (the body's hash kept one of each body within SQS's five minutes).
#[tokio::test]
async fn rows_with_equal_bodies_all_reach_a_fifo_queue() {
    let db = db().await;
    let src = unique("sqs_fifo_src");
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, amount int);
         INSERT INTO {src} SELECT g, g % 2 FROM generate_series(1, 30) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-sqs-fifo");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    assert_eq!(a.post("/api/v1/queue-services", json!({"name": "main"})).await.0, 201);
    let view = ready_queue_service(&a).await;
    let endpoint = view["endpoint"].as_str().unwrap();
    let queue = create_queue(&view, "equal.fifo").await;
    a.create_dataflow(json!({
        "name": "equal-bodies",
        "source": pg(&src, json!({"pollInterval": 1})),
        "sink": sqs(&view, &queue, json!({})),
        "transformations": [{"type": "select", "config": {"fields": ["amount"]}}],
    }))
    .await;

    let mut bodies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Until all 30 came, then 3 s more: none may come twice either.
    let mut quiet_until = None;
    while quiet_until.is_none_or(|t| Instant::now() < t) {
        assert!(Instant::now() < deadline, "{} of 30 arrived: {bodies:?}", bodies.len());
        let receive = json!({"QueueUrl": queue, "MaxNumberOfMessages": 10, "WaitTimeSeconds": 1});
        let (_, text) = call(endpoint, &view, "ReceiveMessage", receive).await;
        for m in serde_json::from_str::<Value>(&text).unwrap()["Messages"]
            .as_array()
            .into_iter()
            .flatten()
        {
            bodies.push(m["Body"].as_str().unwrap().to_owned());
            let delete = json!({"QueueUrl": queue, "ReceiptHandle": m["ReceiptHandle"]});
            assert_eq!(call(endpoint, &view, "DeleteMessage", delete).await.0, 200);
        }
        if bodies.len() >= 30 && quiet_until.is_none() {
            quiet_until = Some(Instant::now() + Duration::from_secs(3));
        }
    }
    let zeros = bodies.iter().filter(|b| *b == r#"{"amount":0}"#).count();
    let ones = bodies.iter().filter(|b| *b == r#"{"amount":1}"#).count();
    assert_eq!((zeros, ones, bodies.len()), (15, 15, 30), "{bodies:?}");
}
