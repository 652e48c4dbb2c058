//! Kafka with `format: avro` at both ends of a `sless dev` dataflow, with
//! the Confluent Python client (confluent-kafka's AvroSerializer and
//! AvroDeserializer) as the producer and the consumer, over a real
//! Kafka-protocol broker (Tansu).
//!
//! The schema registry is a small one served by this test: Karapace, the
//! issue's choice, is not served by this machine's PyPI mirror ("from
//! versions: none"), and no other Confluent-compatible registry is
//! installable here. It answers the two calls the clients make (register
//! a subject's schema, read a schema by id) as Confluent's API documents
//! them, and records what it was asked.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::common::kafka::{Broker, kafka};
use crate::common::pg::{db, pg, unique, wait_for};
use crate::common::{DevServer, TOKEN_A, TempDir};

#[derive(Default)]
struct Registry {
    /// Schema texts by id (from 1), and the subjects registered.
    schemas: Vec<String>,
    subjects: BTreeMap<String, Vec<u32>>,
}

type Shared = Arc<Mutex<Registry>>;

async fn register(State(r): State<Shared>, Path(subject): Path<String>, Json(body): Json<Value>) -> Json<Value> {
    let text = body["schema"].as_str().unwrap_or_default().to_owned();
    let mut r = r.lock().unwrap();
    let id = match r.schemas.iter().position(|s| *s == text) {
        Some(i) => i as u32 + 1,
        None => {
            r.schemas.push(text);
            r.schemas.len() as u32
        }
    };
    r.subjects.entry(subject).or_default().push(id);
    Json(json!({"id": id}))
}

async fn by_id(
    State(r): State<Shared>,
    Path(id): Path<u32>,
) -> Result<Json<Value>, (axum::http::StatusCode, Json<Value>)> {
    let r = r.lock().unwrap();
    match r.schemas.get(id as usize - 1) {
        Some(text) => Ok(Json(json!({"schema": text}))),
        None => Err((
            axum::http::StatusCode::NOT_FOUND,
            Json(json!({"error_code": 40403, "message": "Schema not found"})),
        )),
    }
}

/// Serves the registry on a loopback port until the test ends: its URL.
async fn serve_registry() -> (String, Shared) {
    let shared = Shared::default();
    let app = Router::new()
        .route("/subjects/{subject}/versions", post(register))
        .route("/schemas/ids/{id}", get(by_id))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, shared)
}

fn peer(args: &[&str], input: &str) -> String {
    let mut child = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/peers/avro_peer.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "avro_peer.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const IN_SCHEMA: &str = r#"{"type": "record", "name": "Payment", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"},
    {"name": "card", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "items", "type": {"type": "array", "items": {"type": "record", "name": "Item",
        "fields": [{"name": "sku", "type": "string"}, {"name": "qty", "type": "int"}]}}},
    {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}}
]}"#;

const OUT_SCHEMA: &str = r#"{"type": "record", "name": "Masked", "fields": [
    {"name": "id", "type": "long"},
    {"name": "card", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "note", "type": ["null", "string"], "default": null},
    {"name": "state", "type": "string"}
]}"#;

#[tokio::test]
async fn avro_from_the_confluent_client_through_transformations_to_avro_it_reads_back() {
    let broker = Broker::start();
    let (registry, seen) = serve_registry().await;
    let (input, output) = (
        format!("in-{}", rand::random::<u32>()),
        format!("out-{}", rand::random::<u32>()),
    );
    broker.create_topic(&input, 1).await;
    broker.create_topic(&output, 1).await;
    let db = db().await;
    let refused = unique("avro_refused");

    let dir = TempDir::new("df-avro");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    // What is validated before anything runs.
    let mut no_registry = kafka(&broker, &input, json!({"format": "avro"}));
    no_registry["config"].as_object_mut().unwrap().remove("schemaRegistry");
    let (status, err) = a
        .post(
            "/api/v1/dataflows",
            json!({"name": "x", "source": no_registry, "sink": pg(&refused, json!({}))}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (422, Some("source.config.schemaRegistry")),
        "{err}"
    );
    let bad_schema = kafka(
        &broker,
        &output,
        json!({"format": "avro", "schemaRegistry": {"url": registry}, "avroSchema": "{\"type\": \"record\"}"}),
    );
    let (status, err) = a
        .post(
            "/api/v1/dataflows",
            json!({"name": "x", "source": kafka(&broker, &input, json!({})), "sink": bad_schema}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["field"].as_str()),
        (422, Some("sink.config.avroSchema")),
        "{err}"
    );

    a.create_dataflow(json!({
        "name": "avro",
        "source": kafka(&broker, &input, json!({"format": "avro", "schemaRegistry": {"url": registry}})),
        "transformations": [
            {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
            {"type": "filter", "config": {"condition": "items.#(qty>2)"}},
            {"type": "remove", "config": {"fields": ["items"]}}
        ],
        "sink": kafka(&broker, &output, json!({"format": "avro", "schemaRegistry": {"url": registry}, "avroSchema": OUT_SCHEMA})),
        "errors": pg(&refused, json!({"autoCreateTable": true})),
    }))
    .await;

    let mut records = String::new();
    for i in 0..30 {
        let record = json!({
            "id": i, "card": "4111111111111111", "amount": f64::from(i) + 0.5,
            "note": if i % 2 == 0 { json!(null) } else { json!(format!("ünï {i}")) },
            "items": [{"sku": "a", "qty": i % 5}], "state": if i % 3 == 0 { "NEW" } else { "PAID" },
        });
        records.push_str(&format!("{record}\n"));
    }
    // One record that is not Avro at all.
    records.push_str("{\"__raw__\": \"not avro\"}\n");
    let input_url = broker.addr.clone();
    let produced = {
        let (registry, input) = (registry.clone(), input.clone());
        tokio::task::spawn_blocking(move || peer(&["produce", &input_url, &registry, &input, IN_SCHEMA], &records))
    };
    produced.await.unwrap();

    // qty = i % 5 > 2 for i % 5 in {3, 4}: 12 of 30.
    let consumed = {
        let (registry, output, addr) = (registry.clone(), output.clone(), broker.addr.clone());
        tokio::task::spawn_blocking(move || peer(&["consume", &addr, &registry, &output, "12"], ""))
    }
    .await
    .unwrap();
    let got: Vec<Value> = consumed.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(got.len(), 12, "{consumed}");
    let ids: Vec<i64> = got.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(
        ids,
        (0..30).filter(|i| i % 5 > 2).collect::<Vec<_>>(),
        "in order, filtered"
    );
    let three = &got[0];
    assert_eq!(
        three,
        &json!({"id": 3, "card": "****************", "amount": 3.5, "note": "ünï 3", "state": "NEW"})
    );
    assert_eq!(got[1]["note"], Value::Null);

    // The record that was not Avro reached the error sink, named as such.
    wait_for(&db, &format!("SELECT count(*) FROM {refused}"), 1).await;
    let envelope: String = db
        .query_one(&format!("SELECT data::text FROM {refused}"), &[])
        .await
        .unwrap()
        .get(0);
    assert!(envelope.contains("no schema registry header"), "{envelope}");
    // Each side registered its own schema, under the default subjects.
    let subjects: Vec<String> = seen.lock().unwrap().subjects.keys().cloned().collect();
    assert!(subjects.contains(&format!("{output}-value")), "{subjects:?}");
    assert!(subjects.contains(&format!("{input}-value")), "{subjects:?}");
    db.batch_execute(&format!("DROP TABLE {refused}")).await.unwrap();
}
