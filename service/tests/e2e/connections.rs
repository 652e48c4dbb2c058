//! Anonymous clients against the bounds of a real `sless dev`: thousands of
//! idle and half-sent connections, bodies declared too long, and large
//! bodies behind a signature that cannot be valid. Before the bounds,
//! 20,000 idle sockets made the API and the gateway unreachable for every
//! tenant, and 40 unauthenticated 8 MiB bodies pinned 395 MB. The attackers
//! connect from 127.0.0.2–127.0.0.4, the tenant from 127.0.0.1: everything
//! stays on loopback. Counts and times are bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{DevServer, TOKEN_A, TempDir, sqs};

/// A connection to `to` from the loopback address `from`, as a plain
/// non-blocking socket.
async fn connect_from(from: &str, to: SocketAddr) -> std::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap().into_std().unwrap();
    stream.set_nonblocking(true).unwrap();
    stream
}

/// Whether the server has closed `stream` (a read finds its end, or a reset).
fn closed(mut stream: &std::net::TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // An answer (a 408 or 400 for a half request): read on.
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

fn addr(url: &str) -> SocketAddr {
    let rest = url.trim_start_matches("http://");
    rest.split('/').next().unwrap().parse().unwrap()
}

/// The slowest of `n` SendMessage calls of the tenant, each of which must succeed.
async fn slowest_send(endpoint: &str, view: &serde_json::Value, queue_url: &str, n: usize) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let started = Instant::now();
        let (status, text) = sqs::call(
            endpoint,
            view,
            "SendMessage",
            json!({"QueueUrl": queue_url, "MessageBody": format!("m{i}")}),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        slowest = slowest.max(started.elapsed());
    }
    slowest
}

/// The header timeout of the attack test: long enough that opening its
/// 4,500 connections (slow on a machine running the other tests beside it)
/// ends before the first of them times out.
const ATTACK_HEADER_TIMEOUT: Duration = Duration::from_secs(12);

#[tokio::test]
async fn idle_half_sent_and_oversized_connections_leave_tenants_served() {
    let dir = TempDir::new("connections");
    let header_timeout = format!("{}s", ATTACK_HEADER_TIMEOUT.as_secs());
    let server = DevServer::start_with(
        &dir.0,
        "127.0.0.1:0",
        &[
            "--header-timeout",
            &header_timeout,
            "--body-timeout",
            "4s",
            "--max-connections-per-client",
            "300",
        ],
    );
    let a = server.client(TOKEN_A);
    let (status, body) = a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    assert_eq!(status, 201, "{body}");
    let view = sqs::ready_queue_service(&a).await;
    let endpoint = view["endpoint"].as_str().unwrap().to_owned();
    let (status, created) = sqs::call(&endpoint, &view, "CreateQueue", json!({"QueueName": "jobs"})).await;
    assert_eq!(status, 200, "{created}");
    let queue_url = serde_json::from_str::<serde_json::Value>(&created).unwrap()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = slowest_send(&endpoint, &view, &queue_url, 20).await;
    let rss_before = server.rss();
    let gateway = addr(&endpoint);
    let api = addr(&server.endpoint);

    // 1,500 idle connections to each server from one address, 1,500
    // half-sent requests to the gateway from another.
    let mut idle = Vec::new();
    for _ in 0..1_500 {
        idle.push(connect_from("127.0.0.2", gateway).await);
        idle.push(connect_from("127.0.0.2", api).await);
    }
    let mut half = Vec::new();
    for _ in 0..1_500 {
        let mut stream = connect_from("127.0.0.3", gateway).await;
        let _ = stream.write_all(b"POST /sqs/a HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Amz-Da");
        half.push(stream);
    }
    // 40 bodies of 8 MiB behind a well-formed signature of an unknown key,
    // each but its last byte sent, and held.
    let mut pinned = Vec::new();
    for _ in 0..40 {
        let stream = connect_from("127.0.0.4", gateway).await;
        stream.set_nonblocking(false).unwrap();
        pinned.push(tokio::task::spawn_blocking(move || {
            let mut stream = stream;
            let head = format!(
                "POST /sqs/a HTTP/1.1\r\nHost: {gateway}\r\nContent-Type: application/x-amz-json-1.0\r\n\
                 X-Amz-Target: AmazonSQS.SendMessage\r\nX-Amz-Date: 20260101T000000Z\r\n\
                 Authorization: AWS4-HMAC-SHA256 Credential=AKIANOBODY/20260101/us-east-1/sqs/aws4_request, \
                 SignedHeaders=host;x-amz-date, Signature=00\r\nContent-Length: {}\r\n\r\n",
                8 << 20
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&vec![b'x'; (8 << 20) - 1]);
            let mut answer = Vec::new();
            stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let _ = stream.read_to_end(&mut answer);
            String::from_utf8_lossy(&answer).into_owned()
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let grown = server.rss().saturating_sub(rss_before);
    assert!(
        grown < 100 << 20,
        "{} MB more resident while 40 unauthenticated 8 MiB bodies are held",
        grown >> 20
    );

    // Each address holds at most its cap; the rest were closed at once.
    let held = |streams: &[std::net::TcpStream]| streams.iter().filter(|s| !closed(s)).count();
    let (idle_held, half_held) = (held(&idle), held(&half));
    assert!(
        idle_held <= 600,
        "{idle_held} idle connections held (cap 300 per server)"
    );
    assert!(half_held <= 300, "{half_held} half-sent connections held");
    assert!(
        idle_held >= 300 && half_held >= 100,
        "{idle_held} {half_held}: the caps hold too few"
    );

    // The tenant is served meanwhile, at both servers.
    let during = slowest_send(&endpoint, &view, &queue_url, 20).await;
    assert_eq!(a.get("/api/v1/queue-services/main").await.0, 200);
    assert!(
        during < Duration::from_secs(2),
        "slowest send {during:?} under attack ({before:?} before)"
    );
    for answer in pinned {
        let answer = answer.await.unwrap();
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 403"), "{answer}");
    }

    // A declared body over the limit is refused before it is sent.
    let mut stream = connect_from("127.0.0.1", gateway).await;
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
        .write_all(format!("POST /sqs/a HTTP/1.1\r\nHost: {gateway}\r\nContent-Length: 9000000\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = [0u8; 512];
    let n = stream.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // After the header timeout nothing idle or half-sent is left open.
    tokio::time::sleep(ATTACK_HEADER_TIMEOUT + Duration::from_secs(1)).await;
    assert_eq!(held(&idle), 0, "idle connections outlived the header timeout");
    assert_eq!(held(&half), 0, "half-sent requests outlived the header timeout");
    slowest_send(&endpoint, &view, &queue_url, 1).await;
}

/// A body that stops arriving is cut off at the body timeout, and its
/// connection freed.
#[tokio::test]
async fn a_body_that_stops_arriving_is_cut_off() {
    let dir = TempDir::new("slow-body");
    let server = DevServer::start_with(&dir.0, "127.0.0.1:0", &["--body-timeout", "2s"]);
    let mut stream = connect_from("127.0.0.2", addr(&server.endpoint)).await;
    stream.set_nonblocking(false).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    stream
        .write_all(
            format!(
                "POST /api/v1/queue-services HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN_A}\r\n\
                 Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"name\""
            )
            .as_bytes(),
        )
        .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
}
