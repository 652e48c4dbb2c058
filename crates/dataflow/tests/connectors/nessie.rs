//! The Nessie connectors against a real Nessie 0.99 (sless-testkit's
//! `NessieServer`: its in-memory version store, moto's S3 server as the
//! object store) with Trino's Iceberg connector on the same catalog as the
//! independent reader, and the other writer: what the sink appends Trino
//! reads value for value; what Trino appends the source reads, snapshot by
//! snapshot, never a row twice; commits that race are all kept once each.
//!
//! What the stand-in store does not do: moto takes any signature, so the
//! requests' SigV4 is checked against AWS's published S3 example in
//! sless-sqs's unit tests, not here.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sless_dataflow::ConnectorError;
use sless_dataflow::context::{PipelineContext, PositionsKey};
use sless_dataflow::egress::EgressPolicy;
use sless_dataflow::message::Message;
use sless_dataflow::registry;
use sless_dataflow::sinks::Sink;
use sless_dataflow::sources::{Position, Source};
use sless_model::dataflow::ConnectorSpec;
use sless_testkit::TempDir;
use sless_testkit::nessie::NessieServer;
use sless_testkit::trino::TrinoServer;

use super::postgres::unique;

fn ctx(resume: Option<String>, key: Option<PositionsKey>) -> PipelineContext {
    ctx_with(resume, key, EgressPolicy::default())
}

fn ctx_with(resume: Option<String>, key: Option<PositionsKey>, egress: EgressPolicy) -> PipelineContext {
    PipelineContext {
        id: "test/nessie".into(),
        checkpoint: None,
        egress: Arc::new(egress),
        queue_services: None,
        resume,
        snapshots: Vec::new(),
        positions_key: key,
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    }
}

fn spec(value: Value) -> ConnectorSpec {
    serde_json::from_value(value).unwrap()
}

async fn sink(value: Value) -> Result<Box<dyn Sink>, ConnectorError> {
    registry::connect_sink(&spec(value), &ctx(None, None)).await
}

async fn source(value: Value, resume: Option<String>) -> Arc<dyn Source> {
    registry::connect_source(&spec(value), &ctx(resume, None))
        .await
        .unwrap()
}

fn messages(values: impl IntoIterator<Item = Value>) -> Vec<Message> {
    values.into_iter().map(Message::new).collect()
}

/// Records until `want` messages are read (20 s at most): the messages and
/// the position of each.
async fn read(source: &dyn Source, want: usize) -> (Vec<Value>, Vec<Position>) {
    let (mut rows, mut positions) = (Vec::new(), Vec::new());
    while rows.len() < want {
        let records = tokio::time::timeout(Duration::from_secs(20), source.read())
            .await
            .expect("rows within 20 s")
            .unwrap();
        for record in records {
            rows.push(record.message.data);
            positions.push(record.position);
        }
    }
    (rows, positions)
}

/// A namespace of its own in Trino's `iceberg` catalog, and `table` in it
/// made by Trino with `columns`.
async fn trino_table(trino: &TrinoServer, table: &str, columns: &str) -> String {
    trino.add_iceberg(NessieServer::shared()).await;
    let namespace = unique("ns");
    trino
        .query("iceberg", &format!("CREATE SCHEMA iceberg.{namespace}"))
        .await;
    trino
        .query(
            "iceberg",
            &format!("CREATE TABLE iceberg.{namespace}.{table} ({columns})"),
        )
        .await;
    namespace
}

/// The sink's rows as Trino reads them back through the same catalog: every
/// type of the table, exactly (decimals digit for digit, microseconds,
/// UUIDs); one data file per batch.
#[tokio::test]
async fn what_the_sink_appends_trino_reads_back_value_for_value() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    let namespace = trino_table(
        trino,
        "typed",
        "id bigint, name varchar, price decimal(38, 10), at timestamp(6) with time zone, \
         day date, u uuid, flag boolean, ratio double, n integer",
    )
    .await;
    let sink = sink(nessie.spec(&namespace, "typed", json!({}))).await.unwrap();
    sink.write(&messages([
        json!({"id": 1, "name": "it's \\ \"quoted\" ünï 🦀", "price": "1234567890123456789012345678.0123456789",
               "at": "2026-12-07T10:00:00.123456Z", "day": "2026-02-28", "u": "123e4567-e89b-12d3-a456-426614174000",
               "flag": true, "ratio": 0.1, "n": -7, "ignored": {"x": 1}}),
        json!({"id": 2, "price": "1.10", "at": "2026-12-07 13:00:00+03:00"}),
    ]))
    .await
    .unwrap();
    sink.write(&messages([json!({"ID": 3, "Name": "case differs"})]))
        .await
        .unwrap();
    let rows = trino
        .query(
            "iceberg",
            &format!(
                "SELECT id, name, CAST(price AS varchar), CAST(at AS varchar), CAST(day AS varchar), \
                 CAST(u AS varchar), flag, ratio, n FROM iceberg.{namespace}.typed ORDER BY id"
            ),
        )
        .await;
    assert_eq!(
        rows,
        vec![
            vec![
                json!(1),
                json!("it's \\ \"quoted\" ünï 🦀"),
                json!("1234567890123456789012345678.0123456789"),
                json!("2026-12-07 10:00:00.123456 UTC"),
                json!("2026-02-28"),
                json!("123e4567-e89b-12d3-a456-426614174000"),
                json!(true),
                json!(0.1),
                json!(-7)
            ],
            vec![
                json!(2),
                Value::Null,
                json!("1.1000000000"),
                json!("2026-12-07 10:00:00.000000 UTC"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null
            ],
            vec![
                json!(3),
                json!("case differs"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null
            ],
        ]
    );
    let files = trino
        .count(
            "iceberg",
            &format!("SELECT count(*) FROM iceberg.{namespace}.\"typed$files\""),
        )
        .await;
    assert_eq!(files, 2, "one data file per batch");
    // A value the column cannot take refuses the batch, naming both.
    let refused = sink
        .write(&messages([
            json!({"id": 4}),
            json!({"id": 5, "price": "0.00000000001"}),
        ]))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, ConnectorError::Data(m) if m.contains("message 1") && m.contains("price")),
        "{refused}"
    );
}

/// Appends of another writer (Trino), read by the source a snapshot at a
/// time in batches of 3, in order, each row once; a source opened at a
/// position inside a snapshot goes on after it; a new snapshot is read
/// without the old ones again.
#[tokio::test]
async fn the_source_reads_each_snapshots_new_rows_once_and_resumes_inside_one() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    let namespace = trino_table(trino, "events", "id bigint, name varchar").await;
    let table = format!("iceberg.{namespace}.events");
    trino
        .query(
            "iceberg",
            &format!("INSERT INTO {table} VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')"),
        )
        .await;
    trino
        .query("iceberg", &format!("INSERT INTO {table} VALUES (5, 'e'), (6, 'f')"))
        .await;
    let config = nessie.spec(&namespace, "events", json!({"batchSize": 3, "pollInterval": 1}));
    let first = source(config.clone(), None).await;
    let (rows, positions) = read(first.as_ref(), 6).await;
    let ids: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, [1, 2, 3, 4, 5, 6], "every row once");
    assert_eq!(
        &sorted[..4],
        {
            let mut older = ids[..4].to_vec();
            older.sort();
            older
        },
        "the older snapshot's rows first"
    );
    assert_eq!(rows[0].as_object().unwrap().len(), 2, "{}", rows[0]);
    trino
        .query("iceberg", &format!("INSERT INTO {table} VALUES (7, 'g')"))
        .await;
    let (rows, _) = read(first.as_ref(), 1).await;
    assert_eq!(rows, [json!({"id": 7, "name": "g"})], "only the new snapshot");

    // Resumed after the second row read: the rest, and nothing before.
    let resume = first.resume_text(&positions[..2]).unwrap();
    let again = source(config, Some(resume)).await;
    let (rows, _) = read(again.as_ref(), 5).await;
    let mut resumed: Vec<i64> = rows.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(resumed.len(), 5);
    resumed.sort();
    let mut want: Vec<i64> = ids[2..].to_vec();
    want.push(7);
    want.sort();
    assert_eq!(resumed, want);
}

/// Exactly once: the position goes into a table property of the dataflow
/// in the batch's commit, sealed; the same batch sent again with its
/// position (a commit whose answer was lost) is not appended twice; a
/// position alone is a commit of no rows; releasing the dataflow removes
/// the property.
#[tokio::test]
async fn a_batch_sent_again_with_its_position_is_appended_once() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    let namespace = trino_table(trino, "once", "id bigint").await;
    let key = PositionsKey::generate();
    let config = spec(nessie.spec(&namespace, "once", json!({})));
    let sink = registry::connect_sink(&config, &ctx(None, Some(key.clone())))
        .await
        .unwrap();
    assert_eq!(sink.stored_position().await.unwrap(), None);
    let batch = messages([json!({"id": 1}), json!({"id": 2})]);
    sink.write_at(&batch, Some("row:2")).await.unwrap();
    sink.write_at(&batch, Some("row:2")).await.unwrap();
    sink.write_at(&[], Some("row:3")).await.unwrap();
    assert_eq!(sink.stored_position().await.unwrap().as_deref(), Some("row:3"));
    let table = format!("iceberg.{namespace}.once");
    assert_eq!(
        trino.count("iceberg", &format!("SELECT count(*) FROM {table}")).await,
        2
    );
    let properties =
        format!("SELECT value FROM iceberg.{namespace}.\"once$properties\" WHERE key LIKE 'sless.position.%'");
    let stored = trino.query("iceberg", &properties).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let stored: Value = serde_json::from_str(stored[0][0].as_str().unwrap()).unwrap();
    assert_eq!(stored["position"], "row:3");
    assert_eq!(stored["dataflow"], format!("test/nessie main/{namespace}.once"));
    // Another tenant's key does not resume from it.
    let other = registry::connect_sink(&config, &ctx(None, Some(PositionsKey::generate())))
        .await
        .unwrap();
    let refused = other.stored_position().await.unwrap_err();
    assert!(
        refused.to_string().contains("not sealed with this tenant's key"),
        "{refused}"
    );
    registry::release(&config, &config, &ctx(None, None)).await.unwrap();
    assert!(trino.query("iceberg", &properties).await.is_empty(), "released");
}

/// Two sinks and Trino appending to one table at once: commits that lose
/// the race are made again on the winner's snapshot; every row is there
/// exactly once.
#[tokio::test]
async fn racing_commits_are_retried_and_no_row_is_lost_or_doubled() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    let namespace = trino_table(trino, "race", "id bigint, writer varchar").await;
    let config = nessie.spec(&namespace, "race", json!({}));
    let (a, b) = (
        Arc::new(sink(config.clone()).await.unwrap()),
        Arc::new(sink(config).await.unwrap()),
    );
    let writer = |sink: Arc<Box<dyn Sink>>, name: &'static str, base: i64| {
        tokio::spawn(async move {
            for batch in 0..10 {
                let rows = (0..5).map(|i| json!({"id": base + batch * 5 + i, "writer": name}));
                sink.write(&messages(rows)).await.unwrap();
            }
        })
    };
    let (one, two) = (writer(a, "a", 0), writer(b, "b", 1000));
    let table = format!("iceberg.{namespace}.race");
    for i in 0..5 {
        trino
            .query(
                "iceberg",
                &format!("INSERT INTO {table} VALUES ({}, 'trino')", 5000 + i),
            )
            .await;
    }
    one.await.unwrap();
    two.await.unwrap();
    assert_eq!(
        trino.count("iceberg", &format!("SELECT count(*) FROM {table}")).await,
        105
    );
    assert_eq!(
        trino
            .count("iceberg", &format!("SELECT count(DISTINCT id) FROM {table}"))
            .await,
        105
    );
}

/// `autoCreateTable` makes the namespace and a `data string` table, which
/// takes each message whole; without it a missing table is the spec's to
/// fix, as are an unknown branch and a column type the connector does not
/// carry; a branch of its own keeps its rows from `main`.
#[tokio::test]
async fn tables_branches_and_what_the_spec_must_fix() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    trino.add_iceberg(nessie).await;
    let namespace = unique("auto");
    let missing = sink(nessie.spec(&namespace, "t", json!({}))).await.err().unwrap();
    assert!(
        matches!(&missing, ConnectorError::Config(m) if m.contains("no such table")),
        "{missing}"
    );
    let auto = sink(nessie.spec(&namespace, "t", json!({"autoCreateTable": true})))
        .await
        .unwrap();
    auto.write(&messages([json!({"a": [1, {"b": null}]})])).await.unwrap();
    let rows = trino
        .query("iceberg", &format!("SELECT data FROM iceberg.{namespace}.t"))
        .await;
    assert_eq!(rows, [vec![json!(r#"{"a":[1,{"b":null}]}"#)]]);

    let branch = sink(nessie.spec(&namespace, "t", json!({"branch": "no-such-branch"})))
        .await
        .err()
        .unwrap();
    assert!(matches!(&branch, ConnectorError::Config(_)), "{branch}");

    let nested = trino_table(trino, "nested", "id bigint, tags array(varchar)").await;
    let refused = sink(nessie.spec(&nested, "nested", json!({}))).await.err().unwrap();
    assert!(
        matches!(&refused, ConnectorError::Config(m) if m.contains("\"tags\"") && m.contains("nested")),
        "{refused}"
    );

    let dev = unique("dev");
    nessie.create_branch(&dev).await;
    let on_dev = sink(nessie.spec(&namespace, "t", json!({"branch": dev})))
        .await
        .unwrap();
    on_dev.write(&messages([json!({"on": "dev"})])).await.unwrap();
    assert_eq!(
        trino
            .count("iceberg", &format!("SELECT count(*) FROM iceberg.{namespace}.t"))
            .await,
        1,
        "main does not see dev's rows"
    );
    let from_dev = source(
        nessie.spec(&namespace, "t", json!({"branch": dev, "pollInterval": 1})),
        None,
    )
    .await;
    let (rows, _) = read(from_dev.as_ref(), 2).await;
    assert_eq!(rows[1], json!({"data": r#"{"on":"dev"}"#}));
}

/// Logins over HTTPS, against the test kit's stand-in for a Nessie that
/// requires one (`AuthProxy`: it checks the header and forwards; Nessie's
/// own OIDC checks are not there): a bearer token and a user's password
/// pass with the proxy's CA from the TLS directory; a forged token and a
/// wrong password are refused as logins, naming no secret; a certificate
/// not trusted is not connected to.
#[tokio::test]
async fn bearer_and_basic_logins_over_https_and_refused_ones() {
    let (nessie, trino) = (NessieServer::shared(), TrinoServer::shared());
    trino.add_iceberg(nessie).await;
    let proxy = nessie.auth_proxy("nessie-token-9", "writer", "nessie-pass-4").await;
    let tls_dir = TempDir::new("nessie-tls");
    std::fs::write(tls_dir.0.join("ca.pem"), &proxy.ca.pem).unwrap();
    let egress = EgressPolicy {
        tls_dir: Some(tls_dir.0.clone()),
        ..Default::default()
    };
    let namespace = unique("auth");
    let open = |login: Value, trusted: bool| {
        let mut config = nessie.spec(&namespace, "t", json!({"autoCreateTable": true}));
        config["config"]["nessieUrl"] = json!(proxy.url);
        if trusted {
            config["config"]["tls"] = json!({"caFile": "ca.pem"});
        }
        for (k, v) in login.as_object().unwrap() {
            config["config"][k] = v.clone();
        }
        let ctx = ctx_with(None, None, egress.clone());
        async move { registry::connect_sink(&spec(config), &ctx).await }
    };
    for login in [
        json!({"token": "nessie-token-9"}),
        json!({"user": "writer", "password": "nessie-pass-4"}),
    ] {
        let sink = open(login, true).await.unwrap();
        sink.write(&messages([json!({"n": 1})])).await.unwrap();
    }
    assert_eq!(
        trino
            .count("iceberg", &format!("SELECT count(*) FROM iceberg.{namespace}.t"))
            .await,
        2
    );
    for (login, secret) in [
        (json!({"token": "forged-token-1"}), "forged-token-1"),
        (json!({"user": "writer", "password": "guess-5"}), "guess-5"),
    ] {
        let refused = open(login, true).await.err().unwrap();
        let text = refused.to_string();
        assert!(
            matches!(refused, ConnectorError::Config(_)) && text.contains("refused the login"),
            "{text}"
        );
        assert!(!text.contains(secret), "{text}");
    }
    let untrusted = open(json!({"token": "nessie-token-9"}), false).await.err().unwrap();
    assert!(!matches!(untrusted, ConnectorError::Config(_)), "{untrusted}");
}
