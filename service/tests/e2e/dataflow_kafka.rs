//! Dataflows run by `sless dev` with Kafka sources and sinks, against a real
//! Kafka-protocol broker (Tansu, started per test on a loopback port) and a
//! real PostgreSQL.

use std::time::{Duration, Instant};

use crate::common::kafka::{Broker, kafka};
use crate::common::pg::{count, db, pg, unique, wait_for, wait_mid_stream};
use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir};
use serde_json::{Value, json};

async fn wait_committed(broker: &Broker, group: &str, topic: &str, partitions: i32, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let committed: i64 = broker.committed(group, topic, partitions).values().sum();
        if committed == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group {group} committed {committed} of {want}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn kafka_to_pg_commits_offsets_only_after_writing_and_survives_kill_9() {
    let broker = Broker::start();
    let db = db().await;
    let (topic, dst) = (unique("orders"), unique("orders_dwh"));
    broker.create_topic(&topic, 3).await;
    let first: Vec<(String, Value)> = (0..200)
        .map(|i| {
            (
                format!("k{i}"),
                json!({"id": i, "firstName": format!("n{i}"), "card": "4111111111111111"}),
            )
        })
        .collect();
    broker.produce(&topic, &first).await;

    let dir = TempDir::new("df-kafka");
    let server = DevServer::start(&dir.0);
    let (status, body) = server
        .client(TOKEN_A)
        .post(
            "/api/v1/dataflows",
            json!({
                "name": "orders",
                "source": kafka(&broker, &topic, json!({"consumerGroup": "sless.a.orders-etl"})),
                "sink": pg(&dst, json!({"autoCreateTable": true})),
                "transformations": [
                    {"type": "mask", "config": {"fields": ["card"], "keepLength": true}},
                    {"type": "snakeCase", "config": {}}
                ]
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let distinct = format!("SELECT count(DISTINCT (data->>'id')) FROM {dst}");
    wait_for(&db, &distinct, 200).await;
    let row: String = db
        .query_one(&format!("SELECT data::text FROM {dst} WHERE data->>'id' = '7'"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        serde_json::from_str::<Value>(&row).unwrap(),
        json!({"id": 7, "first_name": "n7", "card": "****************"})
    );
    // Every record written means every offset committed, in the named group.
    wait_committed(&broker, "sless.a.orders-etl", &topic, 3, 200).await;
    let view = server.client(TOKEN_A).get("/api/v1/dataflows/orders").await.1;
    assert_eq!(
        (view["phase"].as_str(), view["message"].as_str()),
        (Some("Running"), Some("running"))
    );

    // A kill -9 in the middle of a stream (while it is still being
    // produced): nothing lost, duplicates bounded by two batches (of 1000
    // records for a Kafka source): the one being written and the one whose
    // offsets were being committed.
    let second: Vec<(String, Value)> = (200..6200)
        .map(|i| (format!("k{i}"), json!({"id": i, "pad": "x".repeat(100)})))
        .collect();
    let kill_mid_stream = async {
        let copied = wait_mid_stream(&db, &distinct, 200, 6200).await;
        server.kill9();
        copied
    };
    let ((), copied) = tokio::join!(broker.produce(&topic, &second), kill_mid_stream);
    assert!(copied < 6200);
    let server = DevServer::start(&dir.0);
    wait_for(&db, &distinct, 6200).await;
    let total = count(&db, &format!("SELECT count(*) FROM {dst}")).await;
    assert!(
        total - 6200 <= 2000,
        "{} duplicates: more than two batches",
        total - 6200
    );
    wait_committed(&broker, "sless.a.orders-etl", &topic, 3, 6200).await;

    // Tenant b naming a's group would get a share of a's records: refused
    // when made, naming the prefix b's groups need.
    let b = server.client(TOKEN_B);
    let (status, body) = b
        .post(
            "/api/v1/dataflows",
            json!({
                "name": "orders",
                "source": kafka(&broker, &topic, json!({"consumerGroup": "sless.a.orders-etl"})),
                "sink": pg(&unique("intruder"), json!({"autoCreateTable": true})),
            }),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["field"], "source.config.consumerGroup", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must begin with sless.b."),
        "{body}"
    );
    assert!(broker.committed("sless.a.orders-etl", &topic, 3).values().sum::<i64>() == 6200);

    assert_eq!(server.client(TOKEN_A).delete("/api/v1/dataflows/orders").await.0, 204);
    db.batch_execute(&format!("DROP TABLE {dst}")).await.unwrap();
}

#[tokio::test]
async fn pg_to_kafka_with_a_router_sink_on_another_topic() {
    let broker = Broker::start();
    let db = db().await;
    let (src, sales, refunds) = (unique("events"), unique("sales"), unique("refunds"));
    broker.create_topic(&sales, 1).await;
    broker.create_topic(&refunds, 1).await;
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id serial PRIMARY KEY, kind text, amount int);
         INSERT INTO {src} (kind, amount) SELECT CASE WHEN g % 3 = 0 THEN 'refund' ELSE 'sale' END, g
         FROM generate_series(1, 30) g;"
    ))
    .await
    .unwrap();
    let dir = TempDir::new("df-pg-kafka");
    let server = DevServer::start(&dir.0);
    let (status, body) = server
        .client(TOKEN_A)
        .post(
            "/api/v1/dataflows",
            json!({
                "name": "events-out",
                "source": pg(&src, json!({"pollInterval": 1, "batchSize": 7})),
                "sink": kafka(&broker, &sales, json!({})),
                "transformations": [
                    {"type": "router", "config": {"routes": [
                        {"condition": "kind == 'refund'", "sink": kafka(&broker, &refunds, json!({}))}
                    ]}},
                    {"type": "remove", "config": {"fields": ["kind"]}}
                ]
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut got_sales = broker.consume(&sales, 20);
    let mut got_refunds = broker.consume(&refunds, 10);
    let ids = |records: &mut Vec<(Option<String>, Value)>| {
        records.sort_by_key(|(_, v)| v["id"].as_i64());
        records
            .iter()
            .map(|(_, v)| v["id"].as_i64().unwrap_or(-1))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&mut got_refunds),
        (1..=30).filter(|g| g % 3 == 0).collect::<Vec<_>>()
    );
    assert_eq!(ids(&mut got_sales), (1..=30).filter(|g| g % 3 != 0).collect::<Vec<_>>());
    assert_eq!(got_sales[0], (None, json!({"id": 1, "amount": 1})));
    // Routed messages go through the rest of the chain too.
    assert_eq!(got_refunds[0], (None, json!({"id": 3, "amount": 3})));
    // Nothing more than the 30 rows arrives.
    assert_eq!(broker.consume(&sales, 21).len(), 20);
    assert_eq!(
        server.client(TOKEN_A).delete("/api/v1/dataflows/events-out").await.0,
        204
    );
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}

#[tokio::test]
async fn an_unreachable_broker_fails_the_dataflow_with_the_reason() {
    let broker = Broker::start();
    let addr = broker.addr.clone();
    drop(broker);
    let db_table = unique("never");
    let dir = TempDir::new("df-kafka-down");
    let server = DevServer::start(&dir.0);
    let a = server.client(TOKEN_A);
    a.create_dataflow(json!({
        "name": "down",
        "source": {"type": "kafka", "config": {"brokers": [addr], "topic": "t"}},
        "sink": pg(&db_table, json!({"autoCreateTable": true}))
    }))
    .await;
    let view = a.wait_for_phase("down", "Error", Duration::from_secs(40)).await;
    let message = view["message"].as_str().unwrap_or_default();
    assert!(message.contains("Kafka brokers did not answer"), "{message}");
    db().await
        .batch_execute(&format!("DROP TABLE IF EXISTS {db_table}"))
        .await
        .unwrap();
}
