//! The Trino connectors against a real Trino 476 (sless-testkit's
//! `TrinoServer`, one per test binary), with its `memory` catalog and its
//! `postgresql` catalog on the test database: rows read through one and
//! written through the other keep every value, MERGE by key ends as if each
//! message were written once, and refused logins, a missing table and a
//! certificate not trusted are told apart, with nothing of the secrets.

use serde_json::{Value, json};
use sless_dataflow::ConnectorError;
use sless_dataflow::context::PipelineContext;
use sless_dataflow::egress::EgressPolicy;
use sless_dataflow::message::Message;
use sless_dataflow::registry;
use sless_dataflow::sinks::Sink;
use sless_dataflow::sources::Source;
use sless_model::dataflow::ConnectorSpec;
use sless_testkit::TempDir;
use sless_testkit::trino::{PASSWORD, TrinoServer, USER};

use super::postgres::{db, unique};

fn ctx(egress: EgressPolicy) -> PipelineContext {
    PipelineContext {
        id: "test/trino".into(),
        checkpoint: None,
        egress: std::sync::Arc::new(egress),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        positions_key: None,
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    }
}

fn spec(value: Value) -> ConnectorSpec {
    serde_json::from_value(value).unwrap()
}

async fn sink(value: Value) -> Result<Box<dyn Sink>, ConnectorError> {
    registry::connect_sink(&spec(value), &ctx(EgressPolicy::default())).await
}

async fn read_all(source: &dyn Source, want: usize) -> Vec<Value> {
    let mut rows = Vec::new();
    while rows.len() < want {
        let records = tokio::time::timeout(std::time::Duration::from_secs(20), source.read())
            .await
            .expect("rows within 20 s")
            .unwrap();
        source
            .commit(&records.iter().map(|r| r.position.clone()).collect::<Vec<_>>())
            .await
            .unwrap();
        rows.extend(records.into_iter().map(|r| r.message.data));
    }
    rows
}

/// PostgreSQL rows read through Trino's postgresql catalog, in batches, and
/// written through its memory catalog into typed columns: every value as
/// PostgreSQL had it, exact decimals and hostile text included.
#[tokio::test]
async fn rows_read_through_one_catalog_and_written_through_another_keep_every_value() {
    let trino = TrinoServer::shared();
    let db = db().await;
    let src = unique("trino_src");
    db.batch_execute(&format!(
        "CREATE TABLE {src} (id int PRIMARY KEY, name text, amount numeric(30, 10), doc jsonb, at timestamptz, raw bytea);
         INSERT INTO {src} SELECT g, 'n' || g, g * 1.5, jsonb_build_object('g', g), '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 minute', '\\x00ff'
           FROM generate_series(1, 25) g;
         INSERT INTO {src} VALUES (26, E'it''s \\\\ \"quoted\" \\n ünï 🦀', 12345678901234567890.0123456789, '{{\"a\": null, \"b\": [1, 2.5]}}', NULL, NULL);"
    ))
    .await
    .unwrap();
    let source = registry::connect_source(
        &spec(trino.spec("postgresql", &src, json!({"batchSize": 10, "pollInterval": 1}))),
        &ctx(EgressPolicy::default()),
    )
    .await
    .unwrap();
    let rows = read_all(source.as_ref(), 26).await;
    assert_eq!(rows.len(), 26);
    assert_eq!(
        rows.iter().map(|r| r["id"].as_i64().unwrap()).collect::<Vec<_>>(),
        (1..=26).collect::<Vec<_>>(),
        "in order, each once"
    );
    assert_eq!(rows[25]["name"], "it's \\ \"quoted\" \n ünï 🦀");
    assert_eq!(rows[25]["amount"], "12345678901234567890.0123456789", "exact");
    assert_eq!(rows[25]["doc"], json!({"a": null, "b": [1, 2.5]}), "json parsed");
    assert_eq!(rows[0]["raw"], "AP8=", "varbinary as base64");

    let dst = unique("trino_dst");
    trino
        .query(
            "memory",
            &format!(
                "CREATE TABLE {dst} (id bigint, name varchar, amount decimal(30, 10), doc json, \
                 at timestamp(3) with time zone, raw varbinary, untouched varchar)"
            ),
        )
        .await;
    let sink = sink(trino.spec("memory", &dst, json!({"batchSize": 7}))).await.unwrap();
    let messages: Vec<Message> = rows.iter().cloned().map(Message::new).collect();
    sink.write(&messages).await.unwrap();
    let back = trino
        .query(
            "memory",
            &format!("SELECT id, name, CAST(amount AS varchar), json_format(doc), CAST(at AS varchar), to_base64(raw), untouched FROM {dst} ORDER BY id"),
        )
        .await;
    assert_eq!(back.len(), 26);
    assert_eq!(
        back[25],
        vec![
            json!(26),
            json!("it's \\ \"quoted\" \n ünï 🦀"),
            json!("12345678901234567890.0123456789"),
            json!("{\"a\":null,\"b\":[1,2.5]}"),
            Value::Null,
            Value::Null,
            Value::Null
        ]
    );
    assert_eq!(back[0][4], "2026-01-01 00:01:00.000 UTC");
    assert_eq!(back[0][5], "AP8=");

    // New rows are read after the checkpoint, and only they.
    db.batch_execute(&format!("INSERT INTO {src} (id, name) VALUES (27, 'late')"))
        .await
        .unwrap();
    let late = read_all(source.as_ref(), 1).await;
    assert_eq!(late.len(), 1);
    assert_eq!(late[0]["name"], "late");
    db.batch_execute(&format!("DROP TABLE {src}")).await.unwrap();
}

/// With `upsertMode`, a batch is one MERGE: a key twice in a batch keeps its
/// last message, and a replayed batch leaves the table as it was.
#[tokio::test]
async fn merge_by_key_keeps_the_last_message_of_a_key_and_a_replay_changes_nothing() {
    let trino = TrinoServer::shared();
    let db = db().await;
    let dst = unique("trino_merge");
    db.batch_execute(&format!("CREATE TABLE {dst} (id int PRIMARY KEY, name text, n bigint)"))
        .await
        .unwrap();
    let sink = sink(trino.spec("postgresql", &dst, json!({"upsertMode": true, "conflictKey": "id"})))
        .await
        .unwrap();
    let batch: Vec<Message> = [
        json!({"id": 1, "name": "first", "n": 1}),
        json!({"id": 2, "name": "two", "n": 2}),
        json!({"id": 1, "name": "last", "n": 3}),
    ]
    .into_iter()
    .map(Message::new)
    .collect();
    for _ in 0..2 {
        sink.write(&batch).await.unwrap();
    }
    let rows = db
        .query(&format!("SELECT id, name, n FROM {dst} ORDER BY id"), &[])
        .await
        .unwrap();
    let rows: Vec<(i32, String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(rows, [(1, "last".into(), 3), (2, "two".into(), 2)]);
    // A message fills the columns it has keys for, whatever the rest of its
    // batch has: a merge never sets a column it did not name to NULL. Keys
    // match columns in any case (Trino keeps names in lower case).
    sink.write(&[
        Message::new(json!({"ID": 1, "Name": "renamed"})),
        Message::new(json!({"id": 4, "n": 40})),
    ])
    .await
    .unwrap();
    let rows = db
        .query(&format!("SELECT id, name, n FROM {dst} ORDER BY id"), &[])
        .await
        .unwrap();
    let rows: Vec<(i32, Option<String>, Option<i64>)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    assert_eq!(
        rows,
        [
            (1, Some("renamed".into()), Some(3)),
            (2, Some("two".into()), Some(2)),
            (4, None, Some(40))
        ]
    );
    // A message without the key is refused as data, not retried for ever.
    let err = sink
        .write(&[Message::new(json!({"name": "keyless"}))])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectorError::Data(m) if m.contains("conflictKey")),
        "{err:?}"
    );
    // So is a value that is no number for a bigint column.
    let err = sink
        .write(&[Message::new(json!({"id": 3, "n": "many"}))])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConnectorError::Data(m) if m.contains("INVALID_CAST_ARGUMENT")),
        "{err:?}"
    );
    db.batch_execute(&format!("DROP TABLE {dst}")).await.unwrap();
}

/// Over HTTPS with a CA made at start: a password or a bearer token logs
/// in; a wrong one, an untrusted certificate, credentials over plain HTTP
/// and a missing table each fail with their own reason, and no reason
/// carries a secret.
#[tokio::test]
async fn logins_certificates_and_a_missing_table_fail_each_with_its_reason() {
    let trino = TrinoServer::shared();
    let tls_dir = TempDir::new("trino-tls");
    std::fs::write(tls_dir.0.join("ca.pem"), &trino.ca.pem).unwrap();
    let egress = EgressPolicy {
        tls_dir: Some(tls_dir.0.clone()),
        ..Default::default()
    };
    let table = unique("trino_auth");
    trino
        .query("memory", &format!("CREATE TABLE {table} (data varchar)"))
        .await;
    let https = |extra: Value| {
        let mut config = json!({"serverURL": trino.https_url, "catalog": "memory", "schema": "default",
            "table": table, "user": USER, "tls": {"caFile": "ca.pem"}});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec(json!({"type": "trino", "config": config}))
    };
    let open = |spec: ConnectorSpec| {
        let egress = egress.clone();
        async move { registry::connect_sink(&spec, &ctx(egress)).await }
    };

    let by_password = open(https(json!({"password": PASSWORD}))).await.unwrap();
    by_password.write(&[Message::new(json!({"k": 1}))]).await.unwrap();
    let by_token = open(https(json!({"token": trino.token(USER)}))).await.unwrap();
    by_token.write(&[Message::new(json!({"k": 2}))]).await.unwrap();
    assert_eq!(trino.count("memory", &format!("SELECT count(*) FROM {table}")).await, 2);

    let wrong = "not-the-password-x9";
    let Err(err) = open(https(json!({"password": wrong}))).await else {
        panic!("a wrong password logged in")
    };
    assert!(
        matches!(&err, ConnectorError::Config(m) if m.contains("refused the login")),
        "{err:?}"
    );
    assert!(!err.to_string().contains(wrong) && !err.to_string().contains(PASSWORD));
    let forged = format!("{}x", trino.token(USER));
    let Err(err) = open(https(json!({"token": forged}))).await else {
        panic!("a forged token logged in")
    };
    assert!(
        matches!(&err, ConnectorError::Config(m) if m.contains("refused the login")),
        "{err:?}"
    );

    // The server's certificate is not trusted without the test CA.
    let mut untrusted = https(json!({"password": PASSWORD}));
    untrusted.config.as_mut().unwrap()["tls"] = json!({});
    let Err(err) = open(untrusted).await else {
        panic!("an untrusted certificate was accepted")
    };
    assert!(matches!(err, ConnectorError::Connect(_)), "{err:?}");

    // Credentials never go over plain HTTP.
    let plain = spec(
        json!({"type": "trino", "config": {"serverURL": trino.http_url, "catalog": "memory",
        "schema": "default", "table": table, "password": PASSWORD}}),
    );
    let Err(err) = open(plain).await else {
        panic!("a password was sent over http")
    };
    assert!(
        matches!(&err, ConnectorError::Config(m) if m.contains("only over https")),
        "{err:?}"
    );

    // A table that is not there: a configuration error naming it.
    let Err(err) = sink(trino.spec("memory", "no_such_table", json!({}))).await else {
        panic!("a missing table was opened")
    };
    assert!(
        matches!(&err, ConnectorError::Config(m) if m.contains("no_such_table") && m.contains("TABLE_NOT_FOUND")),
        "{err:?}"
    );
}

/// A batch longer than one statement may be is cut into several, every row
/// once; one message longer than a statement is refused as data.
#[tokio::test]
async fn a_long_batch_is_cut_into_statements_and_a_huge_message_refused() {
    let trino = TrinoServer::shared();
    let table = unique("trino_long");
    trino
        .query("memory", &format!("CREATE TABLE {table} (id bigint, note varchar)"))
        .await;
    let sink = sink(trino.spec("memory", &table, json!({}))).await.unwrap();
    // About 1.3 MB of JSON, quotes included: three statements at least.
    let batch: Vec<Message> = (0..3000)
        .map(|i| Message::new(json!({"id": i, "note": format!("it's {}", "x".repeat(400))})))
        .collect();
    sink.write(&batch).await.unwrap();
    assert_eq!(
        trino
            .query(
                "memory",
                &format!("SELECT count(*), count(DISTINCT id), min(length(note)) FROM {table}")
            )
            .await[0],
        vec![json!(3000), json!(3000), json!(405)]
    );
    let huge = Message::new(json!({"id": 1, "note": "'".repeat(300 << 10)}));
    let err = sink.write(&[huge]).await.unwrap_err();
    assert!(
        matches!(&err, ConnectorError::Data(m) if m.contains("longer than one Trino statement")),
        "{err:?}"
    );
}

/// Rows whose position is NULL are passed over, not read again and again,
/// and never stop the source; a char column is written (cast from text);
/// `upsertMode` on a table of whole messages is refused when it opens.
#[tokio::test]
async fn null_positions_char_columns_and_a_merge_into_whole_messages() {
    let trino = TrinoServer::shared();
    let table = unique("trino_nulls");
    trino
        .query(
            "memory",
            &format!("CREATE TABLE {table} (id bigint, code char(3), v varchar)"),
        )
        .await;
    let writer = sink(trino.spec("memory", &table, json!({}))).await.unwrap();
    writer
        .write(&[
            Message::new(json!({"id": 1, "code": "ab", "v": "a"})),
            Message::new(json!({"code": "xyz", "v": "no id"})),
            Message::new(json!({"id": 2, "v": "b"})),
        ])
        .await
        .unwrap();
    let source = registry::connect_source(
        &spec(trino.spec("memory", &table, json!({"batchSize": 2, "pollInterval": 1}))),
        &ctx(EgressPolicy::default()),
    )
    .await
    .unwrap();
    let rows = read_all(source.as_ref(), 2).await;
    assert_eq!(
        rows.iter()
            .map(|r| (r["id"].clone(), r["code"].clone()))
            .collect::<Vec<_>>(),
        [(json!(1), json!("ab ")), (json!(2), Value::Null)]
    );
    writer.write(&[Message::new(json!({"id": 3, "v": "c"}))]).await.unwrap();
    assert_eq!(read_all(source.as_ref(), 1).await[0]["id"], 3);

    let whole = unique("trino_whole");
    trino
        .query("memory", &format!("CREATE TABLE {whole} (id bigint, data varchar)"))
        .await;
    let Err(err) = sink(trino.spec("memory", &whole, json!({"upsertMode": true, "conflictKey": "id"}))).await else {
        panic!("a merge into whole messages was opened")
    };
    assert!(
        matches!(&err, ConnectorError::Config(m) if m.contains("takes whole messages")),
        "{err:?}"
    );
}
