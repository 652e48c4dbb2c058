//! The PostgreSQL connectors against a real server (`SLESS_TEST_PG`,
//! default postgres://postgres@127.0.0.1/test): the source gives each row
//! as the server's own `row_to_json` does, and the sink's COPY writes what
//! its `INSERT … ON CONFLICT` statement writes, a replayed batch included.

use std::sync::Arc;

use serde_json::{Value, json};
use sless_dataflow::context::PipelineContext;
use sless_dataflow::message::Message;
use sless_dataflow::registry;
use sless_dataflow::sinks::Sink;
use sless_dataflow::sources::Source;
use sless_model::dataflow::ConnectorSpec;

fn dsn() -> String {
    std::env::var("SLESS_TEST_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".into())
}

pub(super) async fn db() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&dsn(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    tokio::spawn(conn);
    client
}

pub(super) fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", std::process::id() ^ rand::random::<u32>())
}

fn ctx() -> PipelineContext {
    PipelineContext {
        id: "test/pg".into(),
        checkpoint: None,
        egress: Default::default(),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        positions_key: Some(sless_dataflow::context::PositionsKey::generate()),
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    }
}

fn spec(config: Value) -> ConnectorSpec {
    let mut config = config;
    config["connectionString"] = dsn().into();
    serde_json::from_value(json!({"type": "postgresql", "config": config})).unwrap()
}

async fn source(config: Value) -> Arc<dyn Source> {
    registry::connect_source(&spec(config), &ctx()).await.unwrap()
}

async fn sink(table: &str, extra: Value) -> Box<dyn Sink> {
    let mut config = extra;
    config["table"] = table.into();
    registry::connect_sink(&spec(config), &ctx()).await.unwrap()
}

/// The rows of `sql` as the server's `row_to_json` makes them.
async fn row_to_json(db: &tokio_postgres::Client, sql: &str) -> Vec<Value> {
    db.query(&format!("SELECT row_to_json(q)::text FROM ({sql}) q"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r.get(0)).unwrap())
        .collect()
}

async fn read(source: &dyn Source) -> Vec<Value> {
    let records = tokio::time::timeout(std::time::Duration::from_secs(10), source.read())
        .await
        .expect("rows within 10 s")
        .unwrap();
    records.into_iter().map(|r| r.message.data).collect()
}

const TYPED_ROWS: &str = "
    (true, 1, 2, 3, 'a \"quoted\" \\ tab\there', 'v', 'c', 'nm', '{\"k\": [1, 2.5]}', '\"s\"', 12.50, 'NaN', \
     '2026-01-02 03:04:05.678+01', '2026-01-02', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{1,NULL,3}', 'b', '1 day 2 hours', '\\x00ff'),
    (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
    (false, -32768, -2147483648, -9223372036854775808, 'ünï ☃ 🦀', '', ' ', '', 'null', '{}', -1e-7, 'Infinity', \
     'infinity', '0001-01-01 BC', '00000000-0000-0000-0000-000000000000', '{}', 'a', '-1 mons', '')";

#[tokio::test]
async fn the_source_gives_rows_as_row_to_json_does_also_after_the_columns_change() {
    let db = db().await;
    let (table, mood) = (unique("src_types"), unique("mood"));
    db.batch_execute(&format!(
        "CREATE TYPE {mood} AS ENUM ('a', 'b');
         CREATE TABLE {table} (id serial PRIMARY KEY, bo bool, i2 int2, i4 int4, i8 int8, te text, vc varchar(10),
           ch char(3), na name, js json, jb jsonb, nu numeric, fl float8, ts timestamptz, da date, uu uuid,
           ar int[], en {mood}, iv interval, by bytea);
         INSERT INTO {table} (bo, i2, i4, i8, te, vc, ch, na, js, jb, nu, fl, ts, da, uu, ar, en, iv, by) VALUES {TYPED_ROWS};"
    ))
    .await
    .unwrap();
    let source = source(json!({"table": table, "pollInterval": 1})).await;
    let expected = row_to_json(&db, &format!("SELECT * FROM {table} ORDER BY id")).await;
    assert_eq!(read(source.as_ref()).await, expected);
    assert_eq!(
        expected[0]["te"], "a \"quoted\" \\ tab\there",
        "the fixture is what it says"
    );

    // A column added later is in the rows read after it, as it would be
    // in row_to_json: the prepared read is made again for the new columns.
    db.batch_execute(&format!(
        "ALTER TABLE {table} ADD COLUMN added timestamptz DEFAULT '2026-03-04 05:06:07+00', DROP COLUMN vc;
         INSERT INTO {table} (te) VALUES ('after');"
    ))
    .await
    .unwrap();
    let after = read(source.as_ref()).await;
    let expected = row_to_json(&db, &format!("SELECT * FROM {table} WHERE id > 3 ORDER BY id")).await;
    assert_eq!(after, expected);
    assert!(
        after[0].get("added").is_some() && after[0].get("vc").is_none(),
        "{after:?}"
    );
    db.batch_execute(&format!("DROP TABLE {table}; DROP TYPE {mood}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_column_without_a_binary_form_is_read_as_row_to_json_gives_it() {
    let db = db().await;
    let table = unique("src_aclitem");
    // aclitem is a built-in type with no binary output, as are some types
    // of extensions: such a column cannot come back in binary.
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id serial PRIMARY KEY, acl aclitem, acls aclitem[]);
         INSERT INTO {table} (acl, acls) VALUES ('postgres=r/postgres', '{{postgres=w/postgres}}'), (NULL, NULL);"
    ))
    .await
    .unwrap();
    let source = source(json!({"table": table, "pollInterval": 1})).await;
    let expected = row_to_json(&db, &format!("SELECT * FROM {table} ORDER BY id")).await;
    assert_eq!(read(source.as_ref()).await, expected);
    db.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}

#[tokio::test]
async fn a_query_whose_column_names_repeat_still_gives_row_to_json() {
    let db = db().await;
    let table = unique("src_dup");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id serial PRIMARY KEY, v text); INSERT INTO {table} (v) VALUES ('x'), ('y');"
    ))
    .await
    .unwrap();
    let query = format!("SELECT a.id, a.v, b.v FROM {table} a JOIN {table} b ON b.id = a.id");
    let source = source(json!({"query": query, "pollInterval": 1})).await;
    let expected = row_to_json(&db, &format!("{query} ORDER BY a.id")).await;
    assert_eq!(read(source.as_ref()).await, expected);
    db.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}

fn messages(values: &[Value]) -> Vec<Message> {
    values.iter().cloned().map(Message::new).collect()
}

/// Every row of `table` as jsonb, by id.
async fn contents(db: &tokio_postgres::Client, table: &str) -> Vec<Value> {
    db.query(&format!("SELECT to_jsonb(t)::text FROM {table} t ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r.get(0)).unwrap())
        .collect()
}

#[tokio::test]
async fn copy_writes_what_the_insert_statement_writes() {
    let db = db().await;
    let (copied, inserted, log) = (unique("sink_copy"), unique("sink_insert"), unique("sink_log"));
    // Row-level security keeps the second table on the statement path (the
    // test connects as the owner, whom no policy restricts). A statement
    // trigger logs how each batch reached the first one.
    db.batch_execute(&format!(
        "CREATE TABLE {copied} (id int PRIMARY KEY, te text, jb jsonb, js json, bo bool, nu numeric,
           ts timestamptz, ch char(3), dflt text DEFAULT 'kept');
         CREATE TABLE {inserted} (LIKE {copied} INCLUDING ALL);
         ALTER TABLE {inserted} ENABLE ROW LEVEL SECURITY;
         CREATE TABLE {log} (n serial, how text);
         CREATE FUNCTION {log}() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN INSERT INTO {log} (how) VALUES (split_part(current_query(), ' ', 1)); RETURN NULL; END $$;
         CREATE TRIGGER logged AFTER INSERT ON {copied} FOR EACH STATEMENT EXECUTE FUNCTION {log}();"
    ))
    .await
    .unwrap();
    let copyable = messages(&[
        json!({"id": 1, "te": "tab\there\nnew line\r\\back\\slash \"q\" ünï 🦀", "jb": "a string", "js": {"k": [1, null]},
               "bo": true, "nu": 12.5, "ts": "2026-01-02T03:04:05Z", "ch": "ab"}),
        json!({"id": 2, "jb": {"nested": {"a": "\\t"}}, "js": "x", "bo": "false", "nu": "1e-7"}),
        json!({"id": 3, "te": 42, "jb": [1, "two"], "js": null, "bo": null, "nu": -3, "ts": null}),
        json!({"id": 4, "te": true, "jb": 7, "unknown": "ignored"}),
        json!({"id": 5, "te": "\\N", "jb": "\\."}),
    ]);
    // Values whose text only jsonb gives: the batch goes by statement.
    let by_statement = messages(&[
        json!({"id": 6, "te": {"an": "object", "b": [1.5]}}),
        json!({"id": 7, "te": 1e-7, "nu": 1e20, "ch": 2.5}),
    ]);
    for table in [&copied, &inserted] {
        let sink = sink(table, json!({})).await;
        sink.write(&copyable).await.unwrap();
        sink.write(&by_statement).await.unwrap();
    }
    let (a, b) = (contents(&db, &copied).await, contents(&db, &inserted).await);
    assert_eq!(a, b);
    assert_eq!(a[0]["te"], "tab\there\nnew line\r\\back\\slash \"q\" ünï 🦀");
    assert_eq!(a[0]["jb"], "a string");
    assert_eq!(
        (&a[2]["te"], &a[3]["te"], &a[3]["dflt"]),
        (&json!("42"), &json!("true"), &json!("kept"))
    );
    assert_eq!((&a[4]["te"], &a[4]["jb"]), (&json!("\\N"), &json!("\\.")));
    assert_eq!(a[5]["te"], "{\"b\": [1.5], \"an\": \"object\"}");
    assert_eq!((&a[6]["te"], &a[6]["ch"]), (&json!("0.0000001"), &json!("2.5")));
    let how: Vec<String> = db
        .query(&format!("SELECT how FROM {log} ORDER BY n"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(how, ["COPY", "INSERT"]);

    // A value the column refuses is the data's fault on both paths.
    let bad = messages(&[json!({"id": 9, "bo": "maybe"})]);
    for table in [&copied, &inserted] {
        let error = sink(table, json!({})).await.write(&bad).await.unwrap_err();
        assert!(matches!(error, sless_dataflow::ConnectorError::Data(_)), "{error}");
    }
    db.batch_execute(&format!("DROP TABLE {copied}, {inserted}, {log}; DROP FUNCTION {log}"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replayed_batch_is_skipped_or_upserted_as_the_statement_would() {
    let db = db().await;
    let (skip, upsert) = (unique("sink_skip"), unique("sink_upsert"));
    db.batch_execute(&format!(
        "CREATE TABLE {skip} (id int PRIMARY KEY, v text); CREATE TABLE {upsert} (id int PRIMARY KEY, v text);"
    ))
    .await
    .unwrap();
    let first = messages(&[json!({"id": 1, "v": "a"}), json!({"id": 2, "v": "b"})]);
    let replay = messages(&[json!({"id": 2, "v": "B"}), json!({"id": 3, "v": "c"})]);
    let skipping = sink(&skip, json!({})).await;
    let upserting = sink(&upsert, json!({"upsertMode": true, "conflictKey": "id"})).await;
    for batch in [&first, &replay, &replay] {
        skipping.write(batch).await.unwrap();
        upserting.write(batch).await.unwrap();
    }
    // After the conflicts the next batches go by statement; a later batch
    // without conflicts is written all the same.
    let later = messages(&[json!({"id": 4, "v": "d"})]);
    skipping.write(&later).await.unwrap();
    upserting.write(&later).await.unwrap();
    let values = |rows: Vec<Value>| {
        rows.iter()
            .map(|r| r["v"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(values(contents(&db, &skip).await), ["a", "b", "c", "d"]);
    assert_eq!(values(contents(&db, &upsert).await), ["a", "B", "c", "d"]);
    // One batch naming a key twice (a row changed twice between two reads):
    // the last one is written, where one statement would refuse to update
    // a row twice (and was retried for ever).
    let twice = messages(&[
        json!({"id": 5, "v": "e"}),
        json!({"id": 5, "v": "E"}),
        json!({"id": 1, "v": "A"}),
    ]);
    skipping.write(&twice).await.unwrap();
    upserting.write(&twice).await.unwrap();
    assert_eq!(values(contents(&db, &skip).await), ["a", "b", "c", "d", "e"]);
    assert_eq!(values(contents(&db, &upsert).await), ["A", "B", "c", "d", "E"]);
    // A nullable unique key: rows with a NULL key conflict with none, so
    // all of them are written; the key named twice still keeps its last.
    let nullable = unique("sink_nullable");
    db.batch_execute(&format!(
        "CREATE TABLE {nullable} (id serial PRIMARY KEY, k int UNIQUE, v text)"
    ))
    .await
    .unwrap();
    let by_k = sink(&nullable, json!({"upsertMode": true, "conflictKey": "k"})).await;
    let rows = messages(&[
        json!({"v": "x"}),
        json!({"k": null, "v": "y"}),
        json!({"k": 7, "v": "first"}),
        json!({"k": 7, "v": "last"}),
    ]);
    by_k.write(&rows).await.unwrap();
    let mut got = values(contents(&db, &nullable).await);
    got.sort();
    assert_eq!(got, ["last", "x", "y"]);
    db.batch_execute(&format!("DROP TABLE {nullable}")).await.unwrap();
    db.batch_execute(&format!("DROP TABLE {skip}, {upsert}")).await.unwrap();
}

#[tokio::test]
async fn raw_mode_copies_whole_messages_and_arrays_and_identities_take_the_statement() {
    let db = db().await;
    let (raw, arrays) = (unique("sink_raw"), unique("sink_arrays"));
    db.batch_execute(&format!(
        "CREATE TABLE {arrays} (id int PRIMARY KEY, tags text[], pair int[]);"
    ))
    .await
    .unwrap();
    let whole = messages(&[
        json!({"a": "tab\t\\", "n": [1, {"b": null}]}),
        json!("just a string"),
        Value::Null,
    ]);
    sink(&raw, json!({"autoCreateTable": true}))
        .await
        .write(&whole)
        .await
        .unwrap();
    let stored: Vec<Value> = db
        .query(&format!("SELECT data::text FROM {raw} ORDER BY id"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_str(r.get(0)).unwrap())
        .collect();
    assert_eq!(stored, whole.iter().map(|m| m.data.clone()).collect::<Vec<_>>());
    // A JSON array into an array column is converted only by the statement.
    sink(&arrays, json!({}))
        .await
        .write(&messages(&[
            json!({"id": 1, "tags": ["x", "y,z", "\""], "pair": [1, 2]}),
        ]))
        .await
        .unwrap();
    let row = db
        .query_one(&format!("SELECT tags, pair FROM {arrays}"), &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, Vec<String>>(0), ["x", "y,z", "\""]);
    assert_eq!(row.get::<_, Vec<i32>>(1), [1, 2]);
    // A value for an identity column GENERATED ALWAYS is refused, as
    // INSERT refuses it (COPY would store it); without one the server
    // numbers the row.
    let identity = unique("sink_identity");
    db.batch_execute(&format!(
        "CREATE TABLE {identity} (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);"
    ))
    .await
    .unwrap();
    let sink = sink(&identity, json!({})).await;
    let error = sink
        .write(&messages(&[json!({"id": 100, "v": "given"})]))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("non-DEFAULT"), "{error}");
    sink.write(&messages(&[json!({"v": "numbered"})])).await.unwrap();
    assert_eq!(contents(&db, &identity).await, [json!({"id": 1, "v": "numbered"})]);
    db.batch_execute(&format!("DROP TABLE {raw}, {arrays}, {identity}"))
        .await
        .unwrap();
}

/// `applyChanges` keys by the primary key's own columns: those an
/// `INCLUDE` adds to its index are not part of it (an upsert on them
/// names no constraint the server has).
#[tokio::test]
async fn applied_changes_key_by_the_primary_key_without_its_included_columns() {
    let db = db().await;
    let table = unique("apply_include");
    db.batch_execute(&format!(
        "CREATE TABLE {table} (id int, note text, v int, PRIMARY KEY (id) INCLUDE (note))"
    ))
    .await
    .unwrap();
    let sink = sink(&table, json!({"applyChanges": true})).await;
    let events = [
        json!({"op": "c", "after": {"id": 1, "note": "a", "v": 1}}),
        json!({"op": "u", "before": null, "after": {"id": 1, "note": "b", "v": 2}}),
        json!({"op": "c", "after": {"id": 2, "note": "c", "v": 3}}),
        json!({"op": "d", "before": {"id": 2}}),
    ];
    let messages: Vec<Message> = events.into_iter().map(Message::new).collect();
    sink.write(&messages).await.unwrap();
    assert_eq!(
        row_to_json(&db, &format!("SELECT * FROM {table} ORDER BY id")).await,
        vec![json!({"id": 1, "note": "b", "v": 2})]
    );
    db.batch_execute(&format!("DROP TABLE {table}")).await.unwrap();
}

/// `applyChanges` writes JSON's `null` where the event names it (`nulls`)
/// and the value is `null`, NULL where it does not: through an upsert, a
/// merge of two events of one key, a key change, and a key change whose
/// old row is not there (written whole); json, jsonb, a domain over jsonb,
/// and a column name with a quote and a backslash in it. A name given a
/// value is written as the value; one given a column that cannot hold
/// JSON is refused with the server's reason.
#[tokio::test]
async fn applied_changes_keep_json_null_apart_from_sql_null() {
    let db = db().await;
    let table = unique("apply_json_null");
    let domain = format!("{table}_doc");
    db.batch_execute(&format!(
        "CREATE DOMAIN {domain} AS jsonb;
         CREATE TABLE {table} (id int PRIMARY KEY, j json, b jsonb, d {domain}, \"it's\\\" jsonb, n int)"
    ))
    .await
    .unwrap();
    let sink = sink(&table, json!({"applyChanges": true})).await;
    let odd = "it's\\";
    let all = json!({"j": "json", "b": "json", "d": "json", odd: "json"});
    let events = [
        json!({"op": "c", "after": {"id": 1, "j": null, "b": null, "d": null, odd: null, "n": null}, "nulls": all}),
        json!({"op": "c", "after": {"id": 2, "j": null, "b": null, "d": null, odd: null, "n": 1}}),
        json!({"op": "c", "after": {"id": 3, "j": null, "b": null, "d": null, odd: null, "n": 2}, "nulls": {"b": "json"}}),
        json!({"op": "u", "before": null, "after": {"id": 3, "b": {"x": null}, "d": null, "j": [2]}, "nulls": {"d": "json", "j": "json"}}),
        json!({"op": "u", "before": {"id": 2}, "after": {"id": 4, "j": null, "b": null, "d": null, odd: null, "n": 1},
               "nulls": {"j": "json", odd: "json"}}),
        json!({"op": "u", "before": {"id": 99}, "after": {"id": 5, "j": [1], "b": null, "d": null, odd: null, "n": 3},
               "nulls": {"b": "json"}}),
    ];
    let messages: Vec<Message> = events.into_iter().map(Message::new).collect();
    sink.write(&messages).await.unwrap();
    let rows = db
        .query(
            &format!(
                "SELECT id, (j IS NULL, b IS NULL, d IS NULL, \"it's\\\" IS NULL)::text, j::text, b::text FROM {table} ORDER BY id"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let j: Option<String> = r.get(2);
            (r.get::<_, i32>(0), r.get::<_, String>(1), j, r.get::<_, Option<String>>(3))
        })
        .collect::<Vec<_>>();
    let null = || Some("null".to_owned());
    assert_eq!(
        rows,
        [
            (1, "(f,f,f,f)".to_owned(), null(), null()),
            (
                3,
                "(f,f,f,t)".to_owned(),
                Some("[2]".to_owned()),
                Some("{\"x\": null}".to_owned())
            ),
            (4, "(f,t,t,f)".to_owned(), null(), None),
            (5, "(f,f,t,t)".to_owned(), Some("[1]".to_owned()), null()),
        ]
    );
    let wrong = json!({"op": "c", "after": {"id": 6, "n": null}, "nulls": {"n": "json"}});
    let error = sink.write(&[Message::new(wrong)]).await.unwrap_err();
    assert!(error.to_string().contains("integer"), "{error}");
    db.batch_execute(&format!("DROP TABLE {table}; DROP DOMAIN {domain}"))
        .await
        .unwrap();
}
