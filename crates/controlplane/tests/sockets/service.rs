//! The worker control plane over real gRPC sockets with the generated client
//! (in-memory store; the Redis store passes the same contract suite).

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use sha2::{Digest, Sha256};
use sless_controlplane::proto::{self, RoutingSnapshot};
use sless_controlplane::store::memory::MemoryStore;
use sless_testkit::cp::{Harness, ack_of, config, next, register, register_request, report, watch};
use tonic::Code;

async fn harness() -> Harness {
    Harness::start(Arc::new(MemoryStore::new()), config(None)).await
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    r.expect_err("call must fail").code()
}

const WAIT: Duration = Duration::from_secs(3);
const QUIET: Duration = Duration::from_millis(400);

#[tokio::test]
async fn register_validates_and_opens_a_session() {
    let h = harness().await;
    let mut c = h.client().await;
    let ok = register(&mut c, "gw-1").await;
    assert_eq!(ok.session_id.len(), 32);
    assert!(ok.session_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(ok.ownership_epoch >= 1);
    assert_eq!(
        (ok.heartbeat_interval_ms, ok.max_stale_age_ms, ok.protocol_version),
        (1000, 2000, 1)
    );
    assert_ne!(
        register(&mut c, "gw-1").await.session_id,
        ok.session_id,
        "every registration gets a new session"
    );

    let label = |k: &str, v: &str| proto::Label {
        key: k.into(),
        value: v.into(),
    };
    let bad: Vec<(&str, proto::RegisterWorkerRequest)> = vec![
        (
            "protocol 2",
            proto::RegisterWorkerRequest {
                supported_protocol_version: 2,
                ..register_request("gw")
            },
        ),
        ("empty id", register_request("")),
        ("bad id", register_request("gw/1")),
        ("long id", register_request(&"g".repeat(129))),
        (
            "bad instance",
            proto::RegisterWorkerRequest {
                instance_id: " p".into(),
                ..register_request("gw")
            },
        ),
        (
            "bad zone",
            proto::RegisterWorkerRequest {
                zone: "z z".into(),
                ..register_request("gw")
            },
        ),
        (
            "dup labels",
            proto::RegisterWorkerRequest {
                labels: vec![label("a", "1"), label("a", "2")],
                ..register_request("gw")
            },
        ),
        (
            "space label",
            proto::RegisterWorkerRequest {
                labels: vec![label("a", " 1")],
                ..register_request("gw")
            },
        ),
        (
            "33 labels",
            proto::RegisterWorkerRequest {
                labels: (0..33).map(|i| label(&format!("k{i}"), "v")).collect(),
                ..register_request("gw")
            },
        ),
    ];
    for (what, request) in bad {
        assert_eq!(code(c.register_worker(request).await), Code::InvalidArgument, "{what}");
    }
}

#[tokio::test]
async fn snapshot_ack_and_runtime_semantics() {
    let h = harness().await;
    let mut c = h.client().await;
    let s = register(&mut c, "gw-1").await.session_id;
    let mut stream = watch(&mut c, "gw-1", &s).await;
    h.publish(&["tenant-a", "tenant-b"]);
    let d = next(&mut stream, WAIT).await.expect("a delivery").unwrap();
    let snap = d.snapshot.clone().unwrap();
    assert_eq!(
        snap.checksum,
        Sha256::digest(&d.payload).to_vec(),
        "checksum is SHA-256 of the payload"
    );
    let table = RoutingSnapshot::decode(&d.payload[..]).unwrap();
    assert_eq!(
        table.routes.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
        ["tenant-a", "tenant-b"]
    );
    assert!(!d.nonce.is_empty());

    // No runtime before a positive ACK.
    assert_eq!(
        code(c.report_runtime(report("gw-1", &s, 1, &d, 0)).await),
        Code::FailedPrecondition
    );
    // Checksums are 32 raw bytes; a wrong one is refused.
    let mut short = ack_of("gw-1", &s, &d, true);
    short.snapshot.as_mut().unwrap().checksum.truncate(31);
    assert_eq!(code(c.acknowledge_snapshot(short).await), Code::InvalidArgument);
    let mut wrong = ack_of("gw-1", &s, &d, true);
    wrong.snapshot.as_mut().unwrap().checksum[0] ^= 0xff;
    assert_eq!(code(c.acknowledge_snapshot(wrong).await), Code::FailedPrecondition);
    let mut bad_code = ack_of("gw-1", &s, &d, false);
    bad_code.error_code = "bad-code".into();
    assert_eq!(code(c.acknowledge_snapshot(bad_code).await), Code::InvalidArgument);
    let mut long_message = ack_of("gw-1", &s, &d, false);
    long_message.error_message = "x".repeat(513);
    assert_eq!(code(c.acknowledge_snapshot(long_message).await), Code::InvalidArgument);
    let no_snapshot = proto::AcknowledgeSnapshotRequest {
        snapshot: None,
        ..ack_of("gw-1", &s, &d, true)
    };
    assert_eq!(code(c.acknowledge_snapshot(no_snapshot).await), Code::InvalidArgument);

    c.acknowledge_snapshot(ack_of("gw-1", &s, &d, true)).await.unwrap();
    c.acknowledge_snapshot(ack_of("gw-1", &s, &d, true))
        .await
        .expect("an identical ACK replays");

    // An empty report is a heartbeat; then sequences fence.
    let r = c
        .report_runtime(report("gw-1", &s, 1, &d, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.require_full_snapshot);
    assert_eq!(r.ownership_epoch, h.epoch);
    c.report_runtime(report("gw-1", &s, 2, &d, 7)).await.unwrap();
    c.report_runtime(report("gw-1", &s, 2, &d, 7))
        .await
        .expect("a replay is idempotent");
    assert_eq!(
        code(c.report_runtime(report("gw-1", &s, 2, &d, 8)).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(c.report_runtime(report("gw-1", &s, 1, &d, 7)).await),
        Code::Aborted
    );

    let mut other = report("gw-1", &s, 3, &d, 7);
    other.snapshot_version += 1;
    let r = c.report_runtime(other).await.unwrap().into_inner();
    assert!(
        r.require_full_snapshot,
        "a report for another snapshot asks for a full resync"
    );

    let mut negative = report("gw-1", &s, 3, &d, 7);
    negative.counters[0].errors = -1;
    assert_eq!(code(c.report_runtime(negative).await), Code::InvalidArgument);
    let mut duplicate = report("gw-1", &s, 3, &d, 7);
    duplicate.counters.push(duplicate.counters[0].clone());
    assert_eq!(code(c.report_runtime(duplicate).await), Code::InvalidArgument);
    let mut too_many = report("gw-1", &s, 3, &d, 7);
    too_many.counters = (0..101)
        .map(|i| proto::ProxyCounters {
            proxy_id: format!("p{i}"),
            ..too_many.counters[0].clone()
        })
        .collect();
    assert_eq!(code(c.report_runtime(too_many).await), Code::InvalidArgument);
    assert_eq!(
        code(c.report_runtime(report("gw-1", &s, 0, &d, 7)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.report_runtime(report("gw-1", "nope", 9, &d, 7)).await),
        Code::FailedPrecondition
    );
    c.report_runtime(report("gw-1", &s, 3, &d, 9))
        .await
        .expect("refused reports wrote nothing");
}

#[tokio::test]
async fn one_unacked_delivery_and_nacks_are_not_resent() {
    let h = harness().await;
    let mut c = h.client().await;
    let s = register(&mut c, "gw-1").await.session_id;
    let mut stream = watch(&mut c, "gw-1", &s).await;
    h.publish(&["a"]);
    let d1 = next(&mut stream, WAIT).await.unwrap().unwrap();
    h.publish(&["a", "b"]);
    h.publish(&["a", "b", "c"]);
    assert!(
        next(&mut stream, QUIET).await.is_none(),
        "nothing more while v1 is un-ACKed"
    );

    c.acknowledge_snapshot(ack_of("gw-1", &s, &d1, true)).await.unwrap();
    let d2 = next(&mut stream, WAIT).await.unwrap().unwrap();
    let v1 = d1.snapshot.as_ref().unwrap().version;
    let v2 = d2.snapshot.as_ref().unwrap().version;
    assert!(v2 > v1);
    assert_eq!(
        RoutingSnapshot::decode(&d2.payload[..]).unwrap().routes.len(),
        3,
        "the newest table, not each one"
    );
    // The ACK of v1 is stale now that v2 is issued.
    assert_eq!(
        code(c.acknowledge_snapshot(ack_of("gw-1", &s, &d1, true)).await),
        Code::FailedPrecondition
    );

    c.acknowledge_snapshot(ack_of("gw-1", &s, &d2, false)).await.unwrap();
    assert!(
        next(&mut stream, QUIET).await.is_none(),
        "a NACKed version is not resent"
    );
    // Reports still refer to the last applied snapshot, v1.
    c.report_runtime(report("gw-1", &s, 1, &d1, 1)).await.unwrap();

    h.publish(&["a", "b", "c", "d"]);
    let d3 = next(&mut stream, WAIT).await.unwrap().unwrap();
    assert!(d3.snapshot.as_ref().unwrap().version > v2);
    assert_ne!(d3.nonce, d2.nonce);
    c.acknowledge_snapshot(ack_of("gw-1", &s, &d3, true)).await.unwrap();
    assert!(
        c.report_runtime(report("gw-1", &s, 2, &d1, 1))
            .await
            .unwrap()
            .into_inner()
            .require_full_snapshot
    );
    c.report_runtime(report("gw-1", &s, 2, &d3, 1)).await.unwrap();
}

#[tokio::test]
async fn a_new_registration_replaces_the_old_session_and_stream() {
    let h = harness().await;
    let mut c = h.client().await;
    let old = register(&mut c, "gw-1").await.session_id;
    let mut stream = watch(&mut c, "gw-1", &old).await;
    h.publish(&["a"]);
    let d = next(&mut stream, WAIT).await.unwrap().unwrap();
    c.acknowledge_snapshot(ack_of("gw-1", &old, &d, true)).await.unwrap();
    c.report_runtime(report("gw-1", &old, 1, &d, 1)).await.unwrap();

    let new = register(&mut c, "gw-1").await.session_id;
    let ended = next(&mut stream, WAIT).await.expect("the old stream ends");
    assert_eq!(ended.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!(
        code(c.report_runtime(report("gw-1", &old, 2, &d, 1)).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(c.acknowledge_snapshot(ack_of("gw-1", &old, &d, true)).await),
        Code::FailedPrecondition
    );

    // The new session starts over: no runtime until it ACKs its own delivery.
    assert_eq!(
        code(c.report_runtime(report("gw-1", &new, 2, &d, 1)).await),
        Code::FailedPrecondition
    );
    let mut stream = watch(&mut c, "gw-1", &new).await;
    let d = next(&mut stream, WAIT)
        .await
        .expect("the current snapshot is delivered in full")
        .unwrap();
    c.acknowledge_snapshot(ack_of("gw-1", &new, &d, true)).await.unwrap();
    c.report_runtime(report("gw-1", &new, 1, &d, 1)).await.unwrap();

    // A second stream of the same worker replaces the first.
    let mut second = watch(&mut c, "gw-1", &new).await;
    assert_eq!(
        next(&mut stream, WAIT).await.unwrap().unwrap_err().code(),
        Code::Aborted
    );
    assert!(
        next(&mut second, QUIET).await.is_none(),
        "already acknowledged: nothing to send"
    );
    let mut unknown = watch(&mut c, "gw-9", &new).await;
    assert_eq!(
        next(&mut unknown, WAIT).await.unwrap().unwrap_err().code(),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn outcome_batches_are_deduplicated() {
    let h = harness().await;
    let mut c = h.client().await;
    let s = register(&mut c, "gw-1").await.session_id;
    let batch = |id: &str, kind: proto::OutcomeKind| proto::ReportOutcomesRequest {
        worker_id: "gw-1".into(),
        session_id: s.clone(),
        batch_id: id.into(),
        outcomes: vec![proto::Outcome {
            proxy_id: "tenant-a".into(),
            kind: kind as i32,
            count: 4,
        }],
    };
    assert!(
        !c.report_outcomes(batch("b-1", proto::OutcomeKind::Ok))
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    assert!(
        c.report_outcomes(batch("b-1", proto::OutcomeKind::Ok))
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    assert!(
        !c.report_outcomes(batch("b-2", proto::OutcomeKind::Ok))
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    assert_eq!(
        code(c.report_outcomes(batch("b-3", proto::OutcomeKind::Unspecified)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(c.report_outcomes(batch("bad id", proto::OutcomeKind::Ok)).await),
        Code::InvalidArgument
    );
    let mut negative = batch("b-4", proto::OutcomeKind::Ok);
    negative.outcomes[0].count = -1;
    assert_eq!(code(c.report_outcomes(negative).await), Code::InvalidArgument);
    register(&mut c, "gw-1").await;
    assert_eq!(
        code(c.report_outcomes(batch("b-5", proto::OutcomeKind::Ok)).await),
        Code::FailedPrecondition
    );
}

#[tokio::test]
async fn oversized_messages_are_refused() {
    let h = harness().await;
    let mut c = h.client().await.max_encoding_message_size(64 * 1024 * 1024);
    let mut request = register_request("gw-1");
    request.instance_id = "i".repeat(5 * 1024 * 1024);
    let status = c.register_worker(request).await.unwrap_err();
    assert!(
        matches!(
            status.code(),
            Code::OutOfRange | Code::ResourceExhausted | Code::Internal
        ),
        "{status:?}"
    );
    register(&mut c, "gw-1").await;
}

/// Bytes that are not a RegisterWorkerRequest (field 1 is a varint there,
/// length-delimited here) are the caller's fault: INVALID_ARGUMENT, not
/// INTERNAL.
#[tokio::test]
async fn a_malformed_message_is_invalid_argument() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct NotARegistration {
        #[prost(string, tag = "1")]
        junk: String,
    }
    let h = harness().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", h.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let status = grpc
        .unary::<_, proto::RegisterWorkerResponse, _>(
            tonic::Request::new(NotARegistration { junk: "x".repeat(40) }),
            "/sless.controlplane.v1.WorkerControlPlane/RegisterWorker"
                .parse()
                .unwrap(),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}
