//! The HTTP connectors (SQS, ClickHouse, Trino, the Nessie catalog, the schema registry) against
//! hostile servers on loopback: a permitted host that redirects to a denied
//! one, answers that never end or declare a gigabyte, and error bodies that
//! carry another server's secrets. Everything binds to loopback: the
//! permitted servers to 127.0.0.1, the "denied" one to 127.0.0.2, which
//! the policy under test denies, so no packet can leave 127.0.0.0/8 even if
//! a connector followed the redirect (and the test would see it arrive).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sless_dataflow::ConnectorError;
use sless_dataflow::avro::schema_registry::{RegistryConfig, SchemaRegistry};
use sless_dataflow::clickhouse_client::ClickHouse;
use sless_dataflow::context::PipelineContext;
use sless_dataflow::egress::EgressPolicy;
use sless_dataflow::sqs_client::{SqsClient, SqsConfig};
use sless_dataflow::trino_client::{Trino, TrinoConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const SECRET: &str = "metadata-secret-AKIA-hunter2";

/// A server on 127.0.0.1 answering every request with `head` and then
/// `repeat` times `body_part` (raw HTTP), counting connections.
async fn server(head: String, body_part: Vec<u8>, repeat: usize) -> (u16, Arc<AtomicUsize>) {
    server_on("127.0.0.1", head, body_part, repeat).await
}

async fn server_on(ip: &str, head: String, body_part: Vec<u8>, repeat: usize) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let (head, body_part) = (head.clone(), body_part.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut buf).await;
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                for _ in 0..repeat {
                    if socket.write_all(&body_part).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, hits)
}

/// A server answering `status` with `body` and a Content-Length.
async fn answering(status: &str, extra: &str, body: &str) -> (u16, Arc<AtomicUsize>) {
    answering_on("127.0.0.1", status, extra, body).await
}

async fn answering_on(ip: &str, status: &str, extra: &str, body: &str) -> (u16, Arc<AtomicUsize>) {
    let head = format!(
        "HTTP/1.1 {status}\r\n{extra}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    server_on(ip, head, body.as_bytes().to_vec(), 1).await
}

/// The policy under test: everything but 127.0.0.2, where redirects lead.
fn policy() -> Arc<EgressPolicy> {
    Arc::new(EgressPolicy {
        deny: vec!["127.0.0.2/32".parse().unwrap()],
        ..EgressPolicy::default()
    })
}

/// A permitted server that redirects every request to the denied one, and
/// the denied one, which holds the secret and counts what reaches it.
async fn redirecting() -> (u16, Arc<AtomicUsize>) {
    let (denied, denied_hits) = answering_on("127.0.0.2", "200 OK", "", &format!("{{\"secret\": \"{SECRET}\"}}")).await;
    let (permitted, _) = answering(
        "307 Temporary Redirect",
        &format!("Location: http://127.0.0.2:{denied}/latest/meta-data\r\n"),
        "",
    )
    .await;
    (permitted, denied_hits)
}

fn context() -> PipelineContext {
    PipelineContext {
        id: "acme/flow".into(),
        checkpoint: None,
        egress: policy(),
        queue_services: None,
        resume: None,
        snapshots: Vec::new(),
        positions_key: None,
        budget: sless_dataflow::budget::FlowBudget::temporary(),
    }
}

fn sqs_config(port: u16) -> SqsConfig {
    SqsConfig {
        queue_url: Some(format!("http://127.0.0.1:{port}/000000000000/q")),
        access_key_id: Some("AKIDEXAMPLE".into()),
        secret_access_key: Some("secret".into()),
        ..SqsConfig::default()
    }
}

async fn sqs_error(port: u16) -> ConnectorError {
    match SqsClient::connect(&sqs_config(port), &context()).await {
        Ok(_) => panic!("the SQS connector accepted a hostile server"),
        Err(e) => e,
    }
}

async fn clickhouse_error(port: u16) -> ConnectorError {
    match ClickHouse::connect(&format!("http://127.0.0.1:{port}/db"), &policy()).await {
        Ok(_) => panic!("the ClickHouse connector accepted a hostile server"),
        Err(e) => e,
    }
}

async fn trino_error(port: u16) -> ConnectorError {
    let config: TrinoConfig = serde_json::from_value(serde_json::json!({
        "serverURL": format!("http://127.0.0.1:{port}"), "catalog": "c", "schema": "s", "table": "t"
    }))
    .unwrap();
    match Trino::connect(&config, &policy()).await {
        Ok(_) => panic!("the Trino connector accepted a hostile server"),
        Err(e) => e,
    }
}

async fn registry_error(port: u16) -> ConnectorError {
    let config = RegistryConfig {
        url: format!("http://127.0.0.1:{port}"),
        username: None,
        password: None,
        password_secret_ref: None,
    };
    let registry = SchemaRegistry::connect(&config, &policy()).await.unwrap();
    match registry.schema(1).await {
        Ok(_) => panic!("the schema registry client accepted a hostile server"),
        Err(e) => e,
    }
}

#[tokio::test]
async fn no_connector_follows_a_redirect_to_a_denied_address() {
    let (permitted, denied_hits) = redirecting().await;
    // A redirect at connect is not the server's answer (see the test
    // below); in use, it is refused by name.
    let (sqs, clickhouse, trino, registry) = tokio::join!(
        sqs_error(permitted),
        clickhouse_error(permitted),
        trino_error(permitted),
        registry_error(permitted)
    );
    for (what, e, says) in [
        ("sqs", sqs, "did not answer as SQS"),
        ("clickhouse", clickhouse, "did not answer as ClickHouse"),
        ("trino", trino, "did not answer as Trino"),
        ("registry", registry, "redirect (HTTP 307)"),
    ] {
        let text = e.to_string();
        assert!(text.contains(says), "{what}: {text}");
        assert!(!text.contains(SECRET) && !text.contains("127.0.0.2"), "{what}: {text}");
    }
    assert_eq!(
        denied_hits.load(Ordering::SeqCst),
        0,
        "a connector reached the denied server"
    );
}

#[tokio::test]
async fn an_error_body_is_never_passed_on() {
    // Shaped as each protocol's error, with the secret where a message goes.
    let sqs_body = format!("{{\"__type\": \"com.amazonaws.sqs#QueueDoesNotExist\", \"message\": \"{SECRET}\"}}");
    let (port, _) = answering("400 Bad Request", "", &sqs_body).await;
    let e = sqs_error(port).await.to_string();
    assert_eq!(e, "SQS GetQueueAttributes answered HTTP 400 QueueDoesNotExist");
    // A code that is not the shape of one is not passed on either: the
    // server does not answer as SQS.
    let (port, _) = answering("400 Bad Request", "", &format!("{{\"__type\": \"{SECRET} x\"}}")).await;
    let e = sqs_error(port).await.to_string();
    assert!(!e.contains(SECRET) && e.contains("did not answer as SQS"), "{e}");

    let clickhouse_body = format!("Code: 60, e.displayText() = DB::Exception: {SECRET}, e.what() = DB::Exception");
    let (port, _) = answering("404 Not Found", "", &clickhouse_body).await;
    assert_eq!(
        clickhouse_error(port).await.to_string(),
        "ClickHouse error 60 (UNKNOWN_TABLE): no such table"
    );
    // Not ClickHouse's error: as if nothing answered.
    let (port, _) = answering("500 Internal Server Error", "", SECRET).await;
    let e = clickhouse_error(port).await.to_string();
    assert!(!e.contains(SECRET) && e.contains("did not answer as ClickHouse"), "{e}");

    let trino_body = format!(
        "{{\"id\": \"q\", \"error\": {{\"message\": \"{SECRET}\", \"errorName\": \"TABLE_NOT_FOUND\", \"errorType\": \"USER_ERROR\"}}}}"
    );
    let (port, _) = answering("200 OK", "", &trino_body).await;
    assert_eq!(
        trino_error(port).await.to_string(),
        "Trino error TABLE_NOT_FOUND: no such table"
    );

    let registry_body = format!("{{\"error_code\": 40403, \"message\": \"{SECRET}\"}}");
    let (port, _) = answering("404 Not Found", "", &registry_body).await;
    assert_eq!(
        registry_error(port).await.to_string(),
        "data refused: the schema registry answered HTTP 404, error 40403 (no such schema)"
    );
}

/// Every connector stops reading the answer at `port` at its cap, well
/// before it could have read it whole: the schema registry says it was too
/// long; the SQS and ClickHouse connectors, whose first exchange this is,
/// say that nothing answered as their server (in the connect window).
async fn every_connector_refuses_as_too_long(port: u16) {
    let window = sless_dataflow::egress::CONNECT_WINDOW;
    let started = Instant::now();
    let timed = |e: ConnectorError| (e.to_string(), started.elapsed());
    let (sqs, clickhouse, trino, registry) = tokio::join!(
        async { timed(sqs_error(port).await) },
        async { timed(clickhouse_error(port).await) },
        async { timed(trino_error(port).await) },
        async { timed(registry_error(port).await) },
    );
    assert!(sqs.0.contains("did not answer as SQS"), "{sqs:?}");
    assert!(clickhouse.0.contains("did not answer as ClickHouse"), "{clickhouse:?}");
    assert!(trino.0.contains("did not answer as Trino"), "{trino:?}");
    assert!(registry.0.contains("answered with more than"), "{registry:?}");
    for (_, took) in [&sqs, &clickhouse, &trino, &registry] {
        assert!(*took < window + Duration::from_secs(5), "{took:?}");
    }
}

#[tokio::test]
async fn a_declared_gigabyte_is_refused_before_it_is_read() {
    // Declares 1 GiB and sends 1 MiB of it, then holds the connection.
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n".to_owned();
    let (port, _) = server(head, vec![b' '; 1 << 20], 1).await;
    every_connector_refuses_as_too_long(port).await;
}

#[tokio::test]
async fn an_endless_answer_is_cut_off_at_the_cap() {
    // Chunked, with no declared length: 64 KiB chunks, 2 GiB in all.
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_owned();
    let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
    chunk.extend(std::iter::repeat_n(b' ', 64 * 1024));
    chunk.extend_from_slice(b"\r\n");
    let (port, _) = server(head, chunk, 32 * 1024).await;
    // Reading 2 GiB over loopback would take far longer than the caps.
    every_connector_refuses_as_too_long(port).await;
}

/// Whatever listens at a port, or nothing: a connector says the same in
/// the same time. Before, an SQS endpoint that accepted and stayed silent
/// left the source Pending for 40 s where a closed port failed at once: a
/// tenant could scan ports through a dataflow by timing it.
#[tokio::test]
async fn every_unreachable_endpoint_fails_alike_and_in_the_same_time() {
    // An SSH-like banner, then the connection closes.
    let (banner, _) = server("SSH-2.0-OpenSSH_9.2\r\n".into(), vec![], 0).await;
    // HTTP servers of another kind: one that is not there, one that
    // answers a page, one that redirects (as port 80 to https does).
    let (web, _) = answering("404 Not Found", "", "<html>not here</html>").await;
    let (page, _) = answering("200 OK", "", "<html>welcome</html>").await;
    let (moved, _) = answering("301 Moved Permanently", "Location: https://example.invalid/\r\n", "").await;
    // Accepts, reads, never answers.
    let silent = {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        port
    };
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let timed = |kind: &'static str, port: u16| async move {
        let started = Instant::now();
        let e = match kind {
            "sqs" => sqs_error(port).await,
            "trino" => trino_error(port).await,
            _ => clickhouse_error(port).await,
        };
        (kind, port, e.to_string(), started.elapsed())
    };
    let mut attempts = Vec::new();
    for kind in ["sqs", "clickhouse", "trino"] {
        for port in [closed, banner, web, page, moved, silent] {
            attempts.push(tokio::spawn(timed(kind, port)));
        }
    }
    let mut said = std::collections::BTreeMap::<&str, std::collections::BTreeSet<String>>::new();
    for attempt in attempts {
        let (kind, port, message, took) = attempt.await.unwrap();
        let window = sless_dataflow::egress::CONNECT_WINDOW;
        assert!(
            took >= window && took < window + Duration::from_secs(3),
            "{kind} at port {port}: {message} after {took:?}"
        );
        said.entry(kind).or_default().insert(message);
    }
    for (kind, messages) in said {
        assert_eq!(messages.len(), 1, "{kind} says different things: {messages:?}");
    }
}

/// A server that answers far more rows than a statement asked for (the
/// connect probe asks for one) is cut off at the bound while its answer is
/// parsed: as if nothing answered as Trino.
#[tokio::test]
async fn trino_rows_beyond_what_was_asked_are_not_parsed() {
    // 40 kB: within the probe's answer cap, 10,000 rows beyond its one.
    let rows = "[0],".repeat(10_000);
    let body = format!(
        "{{\"id\": \"q\", \"columns\": [{{\"name\": \"x\", \"type\": \"integer\"}}], \"data\": [{}[1]]}}",
        rows
    );
    let (port, _) = answering("200 OK", "", &body).await;
    let e = trino_error(port).await.to_string();
    assert!(e.contains("did not answer as Trino"), "{e}");
}

/// Trino names the next page of an answer (`nextUri`) itself: a server
/// that names another host there (here the denied 127.0.0.2) is refused
/// before anything is sent to it.
#[tokio::test]
async fn trinos_next_page_on_another_host_is_never_fetched() {
    let (denied, denied_hits) = answering_on("127.0.0.2", "200 OK", "", &format!("{{\"secret\": \"{SECRET}\"}}")).await;
    let body = format!("{{\"id\": \"q\", \"nextUri\": \"http://127.0.0.2:{denied}/v1/statement/q/1\"}}");
    let (port, _) = answering("200 OK", "", &body).await;
    let e = trino_error(port).await.to_string();
    assert!(e.contains("nextUri names another server"), "{e}");
    assert!(!e.contains(SECRET) && !e.contains("127.0.0.2"), "{e}");
    assert_eq!(
        denied_hits.load(Ordering::SeqCst),
        0,
        "the connector reached the denied server"
    );
}

/// An IPv6 literal URL (`http://[::1]:port/`) failed with `cannot resolve
/// the host "[::1]"`. Now it is reached as the address it is, and the
/// egress policy checks it as any other: denying ::1 refuses it.
#[tokio::test]
async fn an_ipv6_literal_is_reached_and_checked_by_the_policy() {
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n1\n")
                    .await;
            });
        }
    });
    let url = format!("http://[::1]:{port}/");
    let open = EgressPolicy::default();
    let client = open.http_client(&url, Duration::from_secs(5)).await.unwrap();
    let answer = client.get(&url).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "1\n");
    let closed = EgressPolicy {
        deny: vec!["::1/128".parse().unwrap()],
        ..EgressPolicy::default()
    };
    let refused = closed.http_client(&url, Duration::from_secs(5)).await.unwrap_err();
    assert!(refused.to_string().contains("egress"), "{refused}");
}

/// A client of the policy sends requests only to the host and port it was
/// made for: another port, another name for the same address, another
/// address (where a library the client is lent to might be sent) never see
/// a connection.
#[tokio::test]
async fn a_client_of_the_policy_reaches_only_the_host_and_port_it_checked() {
    let (port, _) = answering("200 OK", "", "{}").await;
    let (other, other_hits) = answering("200 OK", "", "{}").await;
    let (denied, denied_hits) = answering_on("127.0.0.2", "200 OK", "", "{}").await;
    let url = format!("http://127.0.0.1:{port}/");
    let client = policy().http_client(&url, Duration::from_secs(5)).await.unwrap();
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    for elsewhere in [
        format!("http://127.0.0.1:{other}/"),
        format!("http://localhost:{other}/"),
        format!("http://127.0.0.2:{denied}/"),
        format!("http://[::1]:{port}/"),
    ] {
        assert!(client.get(&elsewhere).send().await.is_err(), "{elsewhere} was reached");
    }
    assert_eq!(other_hits.load(Ordering::SeqCst), 0);
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0);
}

/// An Iceberg REST catalog whose `/v1/config` names another `uri` (which
/// Iceberg's client follows for every later request): the Nessie sink's
/// requests never get there, and the catalog's answer is not passed on.
#[tokio::test]
async fn a_catalog_that_names_another_uri_is_not_followed() {
    let (denied, denied_hits) = answering_on("127.0.0.2", "200 OK", "", "{}").await;
    let config = format!(
        r#"{{"defaults": {{}}, "overrides": {{"uri": "http://127.0.0.2:{denied}/iceberg/main", "note": "{SECRET}"}}}}"#
    );
    let (catalog, _) = answering("200 OK", "", &config).await;
    let spec: sless_model::dataflow::ConnectorSpec = serde_json::from_value(serde_json::json!({
        "type": "nessie",
        "config": {"nessieUrl": format!("http://127.0.0.1:{catalog}"), "namespace": "n", "table": "t",
                   "autoCreateTable": true}
    }))
    .unwrap();
    let error = sless_dataflow::registry::connect_sink(&spec, &context())
        .await
        .err()
        .unwrap();
    assert!(!error.to_string().contains(SECRET), "{error}");
    assert_eq!(denied_hits.load(Ordering::SeqCst), 0, "the overriding uri was reached");
}
