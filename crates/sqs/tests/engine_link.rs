//! The engine link over real loopback sockets: the gateway's side opens a
//! link to a sless engine and falls back to HTTP at once for a server that
//! speaks only HTTP (as ElasticMQ does); the engine answers many requests
//! in flight on one connection by their ids, refuses a wrong token as it
//! does over HTTP, and cuts off a peer that sends what the link does not
//! allow while serving everyone else on; one that stops answers every
//! request in flight, and runs none it answers "closing".

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, Method};
use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};
use sless_sqs::engine::server::{EngineServer, router};
use sless_sqs::engine::{Engine, EngineConfig};
use sless_sqs::gateway::link::{LinkError, Links, Way};
use sless_sqs::link::{self, FrameReader, HELLO, MAX_ANSWER, MAX_REQUEST};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "the-engines-token";

fn engine() -> Arc<Engine> {
    Engine::in_memory(EngineConfig {
        account_id: "000000000042".into(),
        region: "ru-msk-1".into(),
        base_url: "http://gateway/sqs/acme".into(),
    })
}

async fn started() -> EngineServer {
    EngineServer::start(engine(), "127.0.0.1:0".parse().unwrap(), Some(TOKEN.into()))
        .await
        .unwrap()
}

/// A JSON-protocol request's frame.
fn json_frame(action: &str, input: &Value) -> BytesMut {
    let json = HeaderValue::from_static("application/x-amz-json-1.0");
    let target = HeaderValue::from_str(&format!("AmazonSQS.{action}")).unwrap();
    let headers = [("content-type", &json), ("x-amz-target", &target)];
    link::request_frame(&Method::POST, "/", headers.into_iter(), input.to_string().as_bytes()).unwrap()
}

fn body(answer: &link::Answer) -> Value {
    serde_json::from_slice(&answer.body).unwrap()
}

/// A link connection made by hand, hello answered.
async fn raw_link(addr: std::net::SocketAddr, token: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(&link::hello_with(token.as_bytes())).await.unwrap();
    assert_eq!(
        link::read_hello(&mut stream).await.unwrap(),
        link::Greeting::Hello,
        "the engine answers the hello"
    );
    stream
}

/// Whether the peer closes the connection within two seconds (a link
/// peer that broke the rules is cut off, not left waiting).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut rest)).await,
        Ok(Ok(_) | Err(_))
    )
}

#[tokio::test]
async fn the_gateway_links_to_an_engine_and_speaks_http_to_anything_else() {
    let server = started().await;
    let token = HeaderValue::from_static(TOKEN);
    let links = Links::default();
    let Way::Link(engine_link) = links.way(&server.addr.to_string(), Some(&token)).await.unwrap() else {
        panic!("a sless engine speaks the link");
    };
    let created = engine_link
        .call(json_frame("CreateQueue", &json!({"QueueName": "jobs"})))
        .await
        .unwrap();
    assert_eq!(created.status, 200, "{:?}", created.body);
    assert_eq!(body(&created)["QueueUrl"], "http://gateway/sqs/acme/000000000042/jobs");
    // Known now: the same link, without a second hello.
    assert!(matches!(
        links.way(&server.addr.to_string(), Some(&token)).await.unwrap(),
        Way::Link(_)
    ));

    // The engine's router served over plain HTTP stands in for ElasticMQ:
    // it answers the hello as a bad HTTP request, and the gateway speaks
    // HTTP to it from the first request on, without waiting out a timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_only = listener.local_addr().unwrap().to_string();
    let app = router(engine(), Some(TOKEN.into()));
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });
    let asked = Instant::now();
    assert!(matches!(links.way(&http_only, Some(&token)).await.unwrap(), Way::Http));
    assert!(asked.elapsed() < Duration::from_secs(2), "took {:?}", asked.elapsed());
    serving.abort();

    // A link opened with another token is refused at its hello.
    let refused = Links::default()
        .way(&server.addr.to_string(), Some(&HeaderValue::from_static("guess")))
        .await;
    assert!(matches!(refused, Err(LinkError::Denied)), "{:?}", refused.err());

    // With the engine stopped, its link closes and no request waits: the
    // link reports it ("closing" while the engine waits for this side to
    // close, which this held link never does, then closed), and opening a
    // new one finds nothing listening.
    let addr = server.addr.to_string();
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match engine_link.call(json_frame("ListQueues", &json!({}))).await {
            Err(LinkError::Closed) => break,
            Err(LinkError::Closing) => {}
            Ok(answer) => assert_eq!(answer.status, 200),
            Err(e) => panic!("{e}"),
        }
        assert!(Instant::now() < deadline, "the link outlived its engine");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(matches!(
        links.way(&addr, Some(&token)).await,
        Err(LinkError::Connect(_))
    ));
}

/// N3 of the attack run: a hello with a wrong or empty token got HELLO,
/// then an AccessDenied per frame on a connection kept for ever, with
/// 128 KiB allocated for it and frames of up to 10 MiB buffered.
#[tokio::test]
async fn a_hello_without_the_token_is_refused_and_closed_at_once() {
    let server = started().await;
    for token in [&b""[..], b"guess", &TOKEN.as_bytes()[..TOKEN.len() - 1]] {
        // The hello alone: DENIED, then the end of the connection.
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let started = Instant::now();
        stream.write_all(&link::hello_with(token)).await.unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "{token:?}: left open");
        assert_eq!(answer, link::DENIED, "{token:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{token:?}: {:?}",
            started.elapsed()
        );
        // A frame sent behind the hello is never read: closed at once too.
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        let mut sent = link::hello_with(token);
        sent.extend_from_slice(&u32::try_from(MAX_REQUEST).unwrap().to_be_bytes());
        stream.write_all(&sent).await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "{token:?}: left open with a frame behind the hello");
    }
    // The right token is linked to as before.
    raw_link(server.addr, TOKEN).await;
}

/// A link nothing is sent on for two minutes is closed by the engine.
/// (Time is paused once the link is open: it passes at once.)
#[tokio::test]
async fn an_idle_link_is_closed() {
    let server = started().await;
    let mut idle = raw_link(server.addr, TOKEN).await;
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(600), idle.read_to_end(&mut rest))
        .await
        .expect("the idle link is closed")
        .unwrap();
    let idle_for = started.elapsed();
    assert!(idle_for >= sless_sqs::link::IDLE_TIMEOUT, "{idle_for:?}");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn one_link_carries_thousands_of_requests_in_flight_each_answered_by_its_id() {
    let server = started().await;
    let mut stream = raw_link(server.addr, TOKEN).await;
    let created = json_frame("CreateQueue", &json!({"QueueName": "jobs"}));
    let url = "http://gateway/sqs/acme/000000000042/jobs";
    let mut all = BytesMut::new();
    let mut frame = created;
    link::set_id(&mut frame, 1);
    all.extend_from_slice(&frame);
    // Written at once, more than the engine takes in flight (1024): the
    // rest wait unread, and every one is answered.
    const SENDS: u32 = 3000;
    for id in 2..=SENDS + 1 {
        let mut frame = json_frame(
            "SendMessage",
            &json!({"QueueUrl": url, "MessageBody": format!("message {id}")}),
        );
        link::set_id(&mut frame, id);
        all.extend_from_slice(&frame);
    }
    let (read, mut write) = stream.split();
    let writing = async {
        write.write_all(&all).await.unwrap();
    };
    let reading = async {
        let mut frames = FrameReader::new(read, MAX_ANSWER);
        let mut seen = std::collections::HashSet::new();
        while seen.len() < SENDS as usize + 1 {
            let answer = link::read_answer(frames.next().await.unwrap().unwrap()).unwrap();
            assert_eq!(answer.status, 200, "{:?}", answer.body);
            if answer.id > 1 {
                // Each answer is its own request's: the digest of its body.
                let expected = format!("message {}", answer.id);
                let digest = sless_runtime::hex::encode(&md5_of(expected.as_bytes()));
                assert_eq!(body(&answer)["MD5OfMessageBody"], digest.as_str(), "id {}", answer.id);
            }
            assert!(seen.insert(answer.id), "id {} answered twice", answer.id);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(writing, reading) })
        .await
        .expect("every request answered");
}

fn md5_of(bytes: &[u8]) -> [u8; 16] {
    use md5::Digest;
    md5::Md5::digest(bytes).into()
}

#[tokio::test]
async fn a_peer_breaking_the_link_is_cut_off_and_the_engine_serves_on() {
    let server = started().await;
    // A length over the largest frame: cut off before anything is read.
    let mut stream = raw_link(server.addr, TOKEN).await;
    stream.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert!(closed(&mut stream).await, "an over-long frame");
    let mut stream = raw_link(server.addr, TOKEN).await;
    stream
        .write_all(&u32::try_from(MAX_REQUEST + 1).unwrap().to_be_bytes())
        .await
        .unwrap();
    assert!(closed(&mut stream).await, "one byte over the largest frame");
    // A frame whose inside is malformed: a header count over the cap.
    let mut stream = raw_link(server.addr, TOKEN).await;
    let mut frame = BytesMut::new();
    frame.put_u32(11);
    frame.put_u32(1);
    frame.put_slice(b"\x04POST\0\x01/\xff");
    stream.write_all(&frame).await.unwrap();
    assert!(closed(&mut stream).await, "a malformed frame");
    // Not the hello after the NUL, and a token longer than any.
    for opening in [
        &b"\0GET / HTTP/1.1\r\nHost: engine\r\n\r\n"[..],
        &[HELLO, &[0x10, 0x00]].concat(),
    ] {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream.write_all(opening).await.unwrap();
        assert!(closed(&mut stream).await, "{opening:?}");
    }
    // A peer that stops inside a frame and then goes: the engine lets go.
    let mut stream = raw_link(server.addr, TOKEN).await;
    stream
        .write_all(&json_frame("ListQueues", &json!({}))[..10])
        .await
        .unwrap();
    drop(stream);

    // Everyone else is served on, over the link and over HTTP.
    let mut stream = raw_link(server.addr, TOKEN).await;
    let mut frame = json_frame("ListQueues", &json!({}));
    link::set_id(&mut frame, 77);
    stream.write_all(&frame).await.unwrap();
    let mut frames = FrameReader::new(&mut stream, MAX_ANSWER);
    let answer = link::read_answer(frames.next().await.unwrap().unwrap()).unwrap();
    assert_eq!((answer.id, answer.status.as_u16()), (77, 200));
    let health = reqwest::get(format!("http://{}/health", server.addr)).await.unwrap();
    assert_eq!(health.status(), 200);
}

/// Ten messages of 1 MiB, each all quotes (two bytes a character once
/// JSON escapes them), come back in one answer of about 20 MiB: far more
/// than any request, and carried whole.
#[tokio::test]
async fn the_largest_answers_pass_whole() {
    let server = started().await;
    let Way::Link(engine) = Links::default()
        .way(&server.addr.to_string(), Some(&HeaderValue::from_static(TOKEN)))
        .await
        .unwrap()
    else {
        panic!("a sless engine speaks the link");
    };
    let created = engine
        .call(json_frame("CreateQueue", &json!({"QueueName": "big"})))
        .await
        .unwrap();
    let url = body(&created)["QueueUrl"].as_str().unwrap().to_owned();
    let quotes = "\"".repeat(1 << 20);
    for _ in 0..10 {
        let sent = engine
            .call(json_frame(
                "SendMessage",
                &json!({"QueueUrl": url, "MessageBody": quotes}),
            ))
            .await
            .unwrap();
        assert_eq!(
            sent.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&sent.body[..200.min(sent.body.len())])
        );
    }
    let mut received = 0;
    while received < 10 {
        let answer = engine
            .call(json_frame(
                "ReceiveMessage",
                &json!({"QueueUrl": url, "MaxNumberOfMessages": 10, "VisibilityTimeout": 60}),
            ))
            .await
            .unwrap();
        assert_eq!(answer.status, 200);
        let messages = body(&answer)["Messages"].as_array().cloned().unwrap_or_default();
        assert!(messages.iter().all(|m| m["Body"] == quotes.as_str()));
        received += messages.len();
    }
}

/// An engine that stops under load closes its links as the link protocol
/// says: every request in flight is answered, and each one it did not run
/// is answered "closing" (sent nothing else could have run it) rather
/// than cut off with its fate unknown. The queue ends holding exactly the
/// messages whose sends were answered 200: none of the refused ones ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_engine_runs_nothing_it_answers_closing_and_cuts_off_no_request() {
    let engine = engine();
    let server = EngineServer::start(engine.clone(), "127.0.0.1:0".parse().unwrap(), Some(TOKEN.into()))
        .await
        .unwrap();
    let addr = server.addr.to_string();
    let token = HeaderValue::from_static(TOKEN);
    let links = Links::default();
    let Way::Link(link) = links.way(&addr, Some(&token)).await.unwrap() else {
        panic!("no link to a sless engine");
    };
    let created = link
        .call(json_frame("CreateQueue", &json!({"QueueName": "jobs"})))
        .await
        .unwrap();
    let url = body(&created)["QueueUrl"].as_str().unwrap().to_owned();
    // Held, it would keep the link open past the engine's notice.
    drop(link);
    let senders: Vec<_> = (0..8)
        .map(|s| {
            let (links, addr, token, url) = (links.clone(), addr.clone(), token.clone(), url.clone());
            tokio::spawn(async move {
                let (mut sent, mut refused, mut unreachable) = (Vec::new(), 0, 0);
                for n in 0.. {
                    let body = format!("s{s}-{n}");
                    let frame = json_frame("SendMessage", &json!({"QueueUrl": url, "MessageBody": body}));
                    let answer = match links.way(&addr, Some(&token)).await {
                        Ok(Way::Link(link)) => link.call(frame).await,
                        Ok(Way::Http) => panic!("the engine was taken for an HTTP server"),
                        Err(e) => Err(e),
                    };
                    match answer {
                        Ok(answer) => {
                            assert_eq!(answer.status, 200, "{:?}", answer.body);
                            sent.push(body);
                        }
                        Err(LinkError::Closing) => refused += 1,
                        // The listener is gone: nothing was sent.
                        Err(LinkError::Connect(_) | LinkError::Down) => {
                            unreachable += 1;
                            if unreachable > 20 {
                                break;
                            }
                        }
                        Err(e) => panic!("a request's fate is unknown: {e}"),
                    }
                }
                (sent, refused)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    server.stop().await;
    let stopped_in = stopping.elapsed();
    let (mut sent, mut refused) = (Vec::new(), 0);
    for sender in senders {
        let (s, r) = sender.await.unwrap();
        sent.extend(s);
        refused += r;
    }
    // What the queue holds, read from the engine itself.
    let attributes = engine
        .handle(
            "GetQueueAttributes",
            &json!({"QueueUrl": url, "AttributeNames": ["ApproximateNumberOfMessages"]}),
        )
        .await
        .unwrap();
    eprintln!(
        "{} sends answered 200, {refused} answered closing; stopped in {stopped_in:?}",
        sent.len()
    );
    assert!(!sent.is_empty());
    assert_eq!(
        attributes["Attributes"]["ApproximateNumberOfMessages"],
        sent.len().to_string().as_str(),
        "the queue holds the sends answered 200 and none of the refused ones"
    );
}
