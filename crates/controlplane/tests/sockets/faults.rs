//! Faults against real Redis: a restart under a live stream, and two
//! controller replicas sharing one Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sless_controlplane::store::redis::RedisStore;
use sless_testkit::cp::{Harness, ack_of, config, next, register, report, watch};
use sless_testkit::redis::RedisServer;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(3);

fn store(url: &str, namespace: &str) -> Arc<RedisStore> {
    Arc::new(RedisStore::new(url, namespace, Duration::from_millis(300)).unwrap())
}

#[tokio::test]
async fn redis_restart_gives_unavailable_then_recovers_without_stale_writes() {
    let mut redis = RedisServer::start();
    let h = Harness::start(store(&redis.url(), "faults"), config(None)).await;
    let mut c = h.client().await;
    let s = register(&mut c, "gw-1").await.session_id;
    let mut stream = watch(&mut c, "gw-1", &s).await;
    h.publish(&["tenant-a"]);
    let d = next(&mut stream, WAIT).await.unwrap().unwrap();
    c.acknowledge_snapshot(ack_of("gw-1", &s, &d, true)).await.unwrap();
    c.report_runtime(report("gw-1", &s, 1, &d, 1)).await.unwrap();

    redis.kill();
    let status = c.report_runtime(report("gw-1", &s, 2, &d, 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let message = status.message().to_lowercase();
    for leak in ["redis", "connection", "refused", "127.0.0.1", "os error"] {
        assert!(!message.contains(leak), "backend text leaked: {message}");
    }
    let ended = next(&mut stream, WAIT).await.expect("the stream ends");
    assert_eq!(ended.unwrap_err().code(), Code::Unavailable);
    assert_eq!(
        c.register_worker(sless_testkit::cp::register_request("gw-1"))
            .await
            .unwrap_err()
            .code(),
        Code::Unavailable
    );

    redis.restart();
    // The client recovers: calls succeed again once Redis is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let fresh = loop {
        match c.register_worker(sless_testkit::cp::register_request("gw-1")).await {
            Ok(r) => break r.into_inner().session_id,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable);
                assert!(Instant::now() < deadline, "no recovery");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Redis lost the old session, so its writes are refused, not accepted.
    assert_eq!(
        c.report_runtime(report("gw-1", &s, 3, &d, 1)).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    assert_eq!(
        c.acknowledge_snapshot(ack_of("gw-1", &s, &d, true))
            .await
            .unwrap_err()
            .code(),
        Code::FailedPrecondition
    );
    let mut stream = watch(&mut c, "gw-1", &fresh).await;
    let d = next(&mut stream, WAIT).await.unwrap().unwrap();
    c.acknowledge_snapshot(ack_of("gw-1", &fresh, &d, true)).await.unwrap();
    c.report_runtime(report("gw-1", &fresh, 1, &d, 1)).await.unwrap();
}

#[tokio::test]
async fn two_controllers_share_state_and_the_stale_owner_is_fenced() {
    let url = std::env::var("SLESS_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let namespace = format!("two-{}", sless_runtime::random::id());
    let a = Harness::start(store(&url, &namespace), config(None)).await;
    let b = Harness::start(store(&url, &namespace), config(None)).await;
    assert!(b.epoch > a.epoch, "the later controller owns a newer epoch");
    let (mut ca, mut cb) = (a.client().await, b.client().await);

    // A session made on A is served by B.
    let s = register(&mut ca, "gw-1").await.session_id;
    let mut on_b = watch(&mut cb, "gw-1", &s).await;
    b.publish(&["tenant-a"]);
    let d = next(&mut on_b, WAIT).await.unwrap().unwrap();
    assert_eq!(d.snapshot.as_ref().unwrap().ownership_epoch, b.epoch);
    ca.acknowledge_snapshot(ack_of("gw-1", &s, &d, true)).await.unwrap();
    let r = ca
        .report_runtime(report("gw-1", &s, 1, &d, 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.ownership_epoch, b.epoch);
    assert_eq!(
        cb.report_runtime(report("gw-1", &s, 1, &d, 4))
            .await
            .unwrap_err()
            .code(),
        Code::AlreadyExists
    );

    // A, fenced by B's newer epoch, cannot issue snapshots any more.
    let s2 = register(&mut ca, "gw-2").await.session_id;
    let mut on_a = watch(&mut ca, "gw-2", &s2).await;
    a.publish(&["tenant-a"]);
    let refused = next(&mut on_a, WAIT).await.expect("the stream ends").unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("epoch"), "{}", refused.message());
}
