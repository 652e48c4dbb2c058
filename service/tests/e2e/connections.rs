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

use crate::common::{DevServer, TOKEN_A, TOKEN_B, TempDir, sqs};

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

/// Held by the tests that open thousands of connections: run side by side,
/// each made the other's connections take longer to open than the header
/// timeout they count on.
static FLOODS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The header timeout of the attack test: long enough that opening its
/// 4,500 connections and counting them (slow on a machine running the other
/// tests beside it: 12 s was once too short in CI) ends before the first of
/// them times out.
const ATTACK_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn idle_half_sent_and_oversized_connections_leave_tenants_served() {
    let _alone = FLOODS.lock().await;
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
    // Each address holds at most its cap; the rest are closed at once.
    // Counted as each kind is opened (and its closes have arrived), long
    // before the header timeout.
    let held = |streams: &[std::net::TcpStream]| streams.iter().filter(|s| !closed(s)).count();
    let mut idle = Vec::new();
    for _ in 0..1_500 {
        idle.push(connect_from("127.0.0.2", gateway).await);
        idle.push(connect_from("127.0.0.2", api).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_held = held(&idle);
    assert!(
        (300..=600).contains(&idle_held),
        "{idle_held} idle connections held (cap 300 per server)"
    );
    let mut half = Vec::new();
    for _ in 0..1_500 {
        let mut stream = connect_from("127.0.0.3", gateway).await;
        let _ = stream.write_all(b"POST /sqs/a HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Amz-Da");
        half.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let half_held = held(&half);
    assert!(
        (100..=300).contains(&half_held),
        "{half_held} half-sent connections held (cap 300)"
    );
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

/// The latencies of `n` SendMessage calls of a tenant, sorted; each must
/// succeed.
async fn send_latencies(endpoint: &str, view: &serde_json::Value, queue_url: &str, n: usize) -> Vec<Duration> {
    let mut taken = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        let (status, text) = sqs::call(
            endpoint,
            view,
            "SendMessage",
            json!({"QueueUrl": queue_url, "MessageBody": format!("m{i}")}),
        )
        .await;
        assert_eq!(status, 200, "send {i}: {text}");
        taken.push(started.elapsed());
    }
    taken.sort();
    taken
}

/// The head of a SendMessage to `endpoint` under tenant `view`'s access key
/// id with a signature of zeros (the scope and date are right: only the
/// signature, which needs the body, is wrong), declaring an 8 MiB body,
/// plainly or chunked.
fn zero_signed_head(endpoint: &str, view: &serde_json::Value, chunked: bool) -> String {
    use sless_sqs::sigv4;
    let access = view["accessKey"].as_str().unwrap();
    let headers =
        sigv4::signed_json_headers(endpoint, "SendMessage", b"{}", access, "not-the-secret", "ru-msk-1").unwrap();
    let authorization = headers["authorization"].to_str().unwrap();
    let (scope, _) = authorization.split_once("Signature=").unwrap();
    let path = endpoint.split_once("://").unwrap().1.split_once('/').unwrap().1;
    let length = if chunked {
        "Transfer-Encoding: chunked".to_owned()
    } else {
        format!("Content-Length: {}", 8 << 20)
    };
    format!(
        "POST /{path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         X-Amz-Target: AmazonSQS.SendMessage\r\nX-Amz-Date: {}\r\nAuthorization: {scope}Signature={}\r\n\
         {length}\r\n\r\n",
        addr(endpoint),
        headers["x-amz-date"].to_str().unwrap(),
        "0".repeat(64),
    )
}

/// N1 of the attack run: any client knows a tenant's access key id (it is in
/// every Authorization header), and the body must be read before the
/// signature can be checked. 40 connections under tenant a's key id declare
/// 8 MiB (half of them chunked), send 1 KiB and stall, and are opened again
/// as they close. Before, the gateway took room for the declared length
/// from one budget of all tenants, and tenant b's sends waited 10 s, then
/// got 503s for the whole attack. Now room follows the bytes that arrived,
/// each tenant has its own part, and an upload slower than 64 KiB/s after a
/// 2 s grace is answered 408 and closed.
#[tokio::test]
async fn a_known_key_id_without_its_secret_cannot_hold_room_others_need() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    // Its latencies are measured: not beside a flood of another test.
    let _alone = FLOODS.lock().await;
    let dir = TempDir::new("key-id-bodies");
    let server = DevServer::start(&dir.0);
    let mut views = Vec::new();
    for token in [TOKEN_A, TOKEN_B] {
        let client = server.client(token);
        let (status, body) = client.post("/api/v1/queue-services", json!({"name": "main"})).await;
        assert_eq!(status, 201, "{body}");
        views.push(sqs::ready_queue_service(&client).await);
    }
    let (view_a, view_b) = (views[0].clone(), views[1].clone());
    let endpoint_b = view_b["endpoint"].as_str().unwrap().to_owned();
    let (status, created) = sqs::call(&endpoint_b, &view_b, "CreateQueue", json!({"QueueName": "jobs"})).await;
    assert_eq!(status, 200, "{created}");
    let queue_url = serde_json::from_str::<serde_json::Value>(&created).unwrap()["QueueUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    let alone = send_latencies(&endpoint_b, &view_b, &queue_url, 200).await;

    let endpoint_a = view_a["endpoint"].as_str().unwrap().to_owned();
    let gateway = addr(&endpoint_a);
    let stop = Arc::new(AtomicBool::new(false));
    let (cut_off, other) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut attackers = Vec::new();
    for i in 0..40 {
        let head = zero_signed_head(&endpoint_a, &view_a, i % 2 == 1);
        let (stop, cut_off, other) = (stop.clone(), cut_off.clone(), other.clone());
        attackers.push(tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            // Opened again from the same address as each is closed.
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.4:0".parse().unwrap()).unwrap();
                let mut stream = socket.connect(gateway).await.unwrap();
                let mut sent = head.clone().into_bytes();
                if i % 2 == 1 {
                    sent.extend_from_slice(b"400\r\n");
                }
                sent.extend_from_slice(&[b'x'; 1024]);
                let _ = stream.write_all(&sent).await;
                let started = Instant::now();
                let mut answer = Vec::new();
                let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
                let answer = String::from_utf8_lossy(&answer);
                // Closed within the grace and a little, with a 408.
                if read.is_ok() && answer.starts_with("HTTP/1.1 408") && started.elapsed() < Duration::from_secs(4) {
                    cut_off.fetch_add(1, Ordering::Relaxed);
                } else {
                    eprintln!(
                        "attacker {i}: {:?} after {:?}",
                        answer.lines().next(),
                        started.elapsed()
                    );
                    other.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = send_latencies(&endpoint_b, &view_b, &queue_url, 200).await;
    // Long enough for every attacker to be cut off at least once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.await.unwrap();
    }

    let p50 = |taken: &[Duration]| taken[taken.len() / 2];
    let (alone_p50, during_p50, during_max) = (p50(&alone), p50(&during), during[during.len() - 1]);
    eprintln!("tenant b's sends: p50 {alone_p50:?} alone, {during_p50:?} under attack, max {during_max:?}");
    // A floor of 2 ms for the scheduling jitter of a loaded 2-core machine.
    assert!(
        during_p50 <= 2 * alone_p50.max(Duration::from_millis(2)),
        "p50 {during_p50:?} under attack, {alone_p50:?} alone"
    );
    assert!(
        during_max < Duration::from_secs(1),
        "slowest send {during_max:?} under attack"
    );
    let (cut_off, other) = (cut_off.load(Ordering::Relaxed), other.load(Ordering::Relaxed));
    assert!(
        cut_off >= 40,
        "{cut_off} stalled uploads answered 408 and closed in time"
    );
    assert_eq!(other, 0, "uploads not cut off in time");
}

/// N3 of the attack run: an engine's port in `sless dev` had no cap per
/// client and one of 16,384 in total beside the API's and the gateway's,
/// in a process allowed 20,000 descriptors; a hello with a wrong token got
/// HELLO and 128 KiB of buffers. 19,800 connections took RSS to 2.6 GB,
/// and at 20,200 the process ran out of descriptors and the REST API timed
/// out for every tenant. Now the engines share a quarter of the process's
/// descriptors, 256 per client address, and a wrong token is closed at its
/// hello. 20,000 connection attempts from 100 loopback addresses: idle,
/// a NUL and nothing more, or a wrong token's hello and the start of a
/// 10 MiB frame.
#[tokio::test]
async fn a_flood_at_an_engine_port_leaves_the_api_answering() {
    use sless_sqs::link;

    // A limit of its own, whatever the machine's: a quarter of it is the
    // engines' cap, which 20,000 attempts pass. The test's own sockets
    // need room too.
    sless_runtime::http::raise_descriptor_limit();
    let _alone = FLOODS.lock().await;
    let dir = TempDir::new("engine-flood");
    let server = DevServer::start_with_descriptors(&dir.0, 8_192);
    let a = server.client(TOKEN_A);
    let (status, body) = a.post("/api/v1/queue-services", json!({"name": "main"})).await;
    assert_eq!(status, 201, "{body}");
    let view = sqs::ready_queue_service(&a).await;
    let endpoint = view["endpoint"].as_str().unwrap().to_owned();
    let control_plane: SocketAddr = server.control_plane.parse().unwrap();
    let known = [
        addr(&server.endpoint).port(),
        addr(&endpoint).port(),
        control_plane.port(),
    ];
    let engines: Vec<u16> = server
        .listening_ports()
        .into_iter()
        .filter(|p| !known.contains(p))
        .collect();
    assert_eq!(engines.len(), 1, "one engine port besides {known:?}: {engines:?}");
    let engine = SocketAddr::from(([127, 0, 0, 1], engines[0]));
    let share = server.descriptor_limit() / 4;
    let rss_before = server.rss();

    let mut wrong_hello = link::hello_with(b"guess");
    wrong_hello.extend_from_slice(&u32::try_from(link::MAX_REQUEST).unwrap().to_be_bytes());
    wrong_hello.extend_from_slice(&[0; 16 * 1024]);
    let mut held: Vec<std::net::TcpStream> = Vec::new();
    let mut slowest_api = Duration::ZERO;
    for wave in 0..20 {
        let mut connecting = tokio::task::JoinSet::new();
        for i in 0..1_000 {
            let n = wave * 1_000 + i;
            let wrong_hello = wrong_hello.clone();
            connecting.spawn(async move {
                let mut stream = connect_from(&format!("127.0.0.{}", 2 + n % 100), engine).await;
                let _ = match n % 3 {
                    0 => Ok(()),
                    1 => stream.write_all(b"\0"),
                    _ => stream.write_all(&wrong_hello),
                };
                stream
            });
        }
        while let Some(stream) = connecting.join_next().await {
            held.push(stream.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.retain(|s| !closed(s));
        let started = Instant::now();
        let (status, body) = a.get("/api/v1/queue-services/main").await;
        assert_eq!(status, 200, "wave {wave}: {body}");
        slowest_api = slowest_api.max(started.elapsed());
    }
    let grown = server.rss().saturating_sub(rss_before);
    let descriptors = server.open_descriptors();
    eprintln!(
        "{} of 20,000 connections held (cap {share}), {descriptors} descriptors open, RSS {} MB more, \
         slowest API call {slowest_api:?}",
        held.len(),
        grown >> 20
    );
    assert!(slowest_api < Duration::from_secs(2), "{slowest_api:?}");
    assert!(grown < 100 << 20, "{} MB more resident", grown >> 20);
    // The engines' cap bounds what the flood holds (connections still in
    // the listen backlog look open to the client, so the server is asked).
    assert!(
        descriptors <= share + 200,
        "{descriptors} descriptors open over the engines' cap of {share}"
    );
    assert!(
        descriptors >= share / 2,
        "{descriptors}: the flood never reached the cap"
    );
    // The tenant's queues are served on.
    let (status, text) = sqs::call(&endpoint, &view, "ListQueues", json!({})).await;
    assert_eq!(status, 200, "{text}");
}
