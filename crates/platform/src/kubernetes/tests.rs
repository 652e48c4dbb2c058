//! The REST backend on custom resources. kube-fake-client stands in for the
//! kube-apiserver (none runs here); it cannot route Namespace objects, so
//! tenant namespaces are taken as provisioned (`create_namespaces: false`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use super::*;
use sless_model::dataflow::DataFlowRequest;
use sless_operator::dataflow::builders::processor_labels;

fn label(s: &str) -> DnsLabel {
    DnsLabel::parse(s, "name").unwrap()
}

async fn platform() -> (KubePlatform, Client) {
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<QueueService>()
        .with_status_subresource::<QueueService>()
        .with_resource::<DataFlow>()
        .with_status_subresource::<DataFlow>()
        .build()
        .await
        .unwrap();
    (KubePlatform::new(client.clone(), false, "ru-msk-1".into()), client)
}

fn flow(table: &str) -> DataFlowSpec {
    serde_json::from_value::<DataFlowRequest>(serde_json::json!({
        "source": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": "a"}},
        "sink": {"type": "postgresql", "config": {"connectionString": "postgres://db/x", "table": table}}
    }))
    .unwrap()
    .into_spec(&sless_dataflow::registry::Registry)
    .unwrap()
}

#[tokio::test]
async fn a_queue_service_is_a_resource_in_the_tenant_namespace_with_its_keys() {
    let (p, client) = platform().await;
    let (acme, main) = (label("acme"), label("main"));
    let view = p
        .create_queue_service(&acme, &main, QueueServiceSpec::default())
        .await
        .unwrap();
    assert_eq!(
        (view.phase, view.access_key.as_deref()),
        (QueueServicePhase::Pending, None)
    );
    let stored = Api::<QueueService>::namespaced(client.clone(), "sless-fn-acme")
        .get("main")
        .await
        .unwrap();
    assert_eq!(stored.spec.tenant_id, "acme");
    assert_eq!(stored.spec.memory_mb, 64);
    // A second queue service of the tenant is refused, the same name is 409.
    assert!(matches!(
        p.create_queue_service(&acme, &label("other"), QueueServiceSpec::default())
            .await,
        Err(PlatformError::Conflict(_))
    ));
    assert!(matches!(
        p.create_queue_service(&acme, &main, QueueServiceSpec::default()).await,
        Err(PlatformError::AlreadyExists)
    ));
    // What the operator does: the Secret and a Ready status.
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("sqs-creds-acme".into()),
            namespace: Some("sless-fn-acme".into()),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([
            ("accessKey".to_owned(), "SQSAKacme_abcdefgh".to_owned()),
            ("secretKey".to_owned(), "c2VjcmV0".to_owned()),
        ])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), "sless-fn-acme")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let status = serde_json::json!({"status": {
        "phase": "Ready", "endpoint": "https://sqs.kube5s.ru/sqs/acme", "observedGeneration": 1
    }});
    let queues = Api::<QueueService>::namespaced(client.clone(), "sless-fn-acme");
    queues
        .patch_status("main", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // Its engine is ready, but not every gateway routes it yet.
    let unrouted = p.get_queue_service(&acme, &main).await.unwrap();
    assert_eq!(unrouted.phase, QueueServicePhase::Provisioning);
    let routed = serde_json::json!({"status": {"routed": true}});
    queues
        .patch_status("main", &PatchParams::default(), &Patch::Merge(&routed))
        .await
        .unwrap();
    let ready = p.get_queue_service(&acme, &main).await.unwrap();
    assert_eq!(ready.phase, QueueServicePhase::Ready);
    assert_eq!(ready.endpoint.as_deref(), Some("https://sqs.kube5s.ru/sqs/acme"));
    assert_eq!(ready.access_key.as_deref(), Some("SQSAKacme_abcdefgh"));

    // The operator reconciled generation 1 (its status says so, as the
    // operator's reconcile writes it); a spec of generation 2 it has not
    // seen is not Ready yet, whatever the status says. (The fake does not
    // count generations: the test sets them as the API server would.)
    let api = Api::<QueueService>::namespaced(client.clone(), "sless-fn-acme");
    let reconciled = serde_json::json!({"status": {"observedGeneration": 1}});
    api.patch_status("main", &PatchParams::default(), &Patch::Merge(&reconciled))
        .await
        .unwrap();
    let mut qs = api.get("main").await.unwrap();
    qs.metadata.generation = Some(1);
    assert_eq!(
        p.queue_view(&acme, qs.clone()).await.unwrap().phase,
        QueueServicePhase::Ready
    );
    qs.metadata.generation = Some(2);
    assert_eq!(
        p.queue_view(&acme, qs).await.unwrap().phase,
        QueueServicePhase::Provisioning
    );

    // Another tenant sees nothing of it.
    let beta = label("beta");
    assert!(matches!(
        p.get_queue_service(&beta, &main).await,
        Err(PlatformError::NotFound)
    ));
    assert!(p.list_queue_services(&beta).await.unwrap().is_empty());
    assert!(matches!(
        p.delete_queue_service(&beta, &main).await,
        Err(PlatformError::NotFound)
    ));

    let grown = QueueServiceSpec {
        memory_mb: 256,
        ..QueueServiceSpec::default()
    };
    assert_eq!(
        p.update_queue_service(&acme, &main, grown).await.unwrap().memory_mb,
        256
    );
    // Three replicas by default here; one grows to three in place and
    // three lower to one (the operator carries both out).
    assert_eq!(p.default_queue_spec().replicas, 3);
    assert_eq!(view.replicas, 1);
    let three = QueueServiceSpec {
        replicas: 3,
        ..QueueServiceSpec::default()
    };
    let three_now = p.update_queue_service(&acme, &main, three).await.unwrap();
    assert_eq!(three_now.replicas, 3);
    let stored = Api::<QueueService>::namespaced(client.clone(), "sless-fn-acme")
        .get("main")
        .await
        .unwrap();
    assert_eq!(stored.spec.replicas, Some(3));
    let one = p
        .update_queue_service(&acme, &main, QueueServiceSpec::default())
        .await
        .unwrap();
    assert_eq!(one.replicas, 1);
    // The volumes' size is fixed here (a StatefulSet's claim template).
    let larger = QueueServiceSpec {
        replicas: 3,
        storage_mb: 1024,
        ..QueueServiceSpec::default()
    };
    match p.update_queue_service(&acme, &main, larger).await {
        Err(PlatformError::Invalid(errors)) => assert_eq!(errors.0[0].field, "storageMB"),
        other => panic!("not refused: {other:?}"),
    }

    p.delete_queue_service(&acme, &main).await.unwrap();
    assert!(p.list_queue_services(&acme).await.unwrap().is_empty());
}

#[tokio::test]
async fn dataflows_round_trip_and_keep_kubectl_only_fields_on_update() {
    let (p, client) = platform().await;
    let (acme, name) = (label("acme"), label("copy"));
    let view = p.create_dataflow(&acme, &name, flow("b"), 100).await.unwrap();
    assert_eq!(view.phase, DataFlowPhase::Pending);
    let api = Api::<DataFlow>::namespaced(client, "sless-fn-acme");
    let image = serde_json::json!({"spec": {"processorImage": "my/proc:2"}});
    api.patch("copy", &PatchParams::default(), &Patch::Merge(&image))
        .await
        .unwrap();
    let status = serde_json::json!({"status": {"phase": "Running", "message": "the processor is running"}});
    api.patch_status("copy", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let updated = p.update_dataflow(&acme, &name, flow("c")).await.unwrap();
    assert_eq!(updated.sink.config.unwrap()["table"], "c");
    assert_eq!(updated.phase, DataFlowPhase::Running);
    assert_eq!(
        api.get("copy").await.unwrap().spec.processor_image.as_deref(),
        Some("my/proc:2")
    );
    // The operator ran generation 1; a spec of generation 2 it has not
    // taken up is Pending, whatever the status says. (The fake does not
    // count generations: the test sets them as the API server would.)
    let observed = serde_json::json!({"status": {"observedGeneration": 1}});
    api.patch_status("copy", &PatchParams::default(), &Patch::Merge(&observed))
        .await
        .unwrap();
    let mut df = api.get("copy").await.unwrap();
    df.metadata.generation = Some(1);
    assert_eq!(flow_view(&acme, df.clone()).phase, DataFlowPhase::Running);
    df.metadata.generation = Some(2);
    let behind = flow_view(&acme, df);
    assert_eq!(behind.phase, DataFlowPhase::Pending);
    assert_eq!(behind.message.as_deref(), Some("restarting with the new spec"));
    assert_eq!(p.list_dataflows(&acme).await.unwrap().len(), 1);
    assert!(matches!(
        p.get_dataflow(&label("beta"), &name).await,
        Err(PlatformError::NotFound)
    ));
    p.delete_dataflow(&acme, &name).await.unwrap();
    assert!(matches!(
        p.get_dataflow(&acme, &name).await,
        Err(PlatformError::NotFound)
    ));
}

/// What the admission webhook would deny never reaches the API server:
/// the REST API refuses it at its field (the fake has no admission, so a
/// request that got through would be stored).
#[tokio::test]
async fn a_secret_reference_outside_the_tenants_namespace_is_refused_at_its_field() {
    let (p, client) = platform().await;
    let (acme, name) = (label("acme"), label("copy"));
    let mut spec = flow("b");
    spec.sink.config = Some(serde_json::json!({
        "connectionStringSecretRef": {"name": "db", "namespace": "sless-fn-beta", "key": "url"},
        "table": "b"
    }));
    let Err(PlatformError::Invalid(errors)) = p.create_dataflow(&acme, &name, spec.clone(), 100).await else {
        panic!("another tenant's namespace is refused");
    };
    assert_eq!(errors.0[0].field, "sink.config.connectionStringSecretRef");
    assert!(errors.0[0].message.contains("sless-fn-beta"), "{errors}");
    let stored = Api::<DataFlow>::namespaced(client, "sless-fn-acme");
    assert!(stored.get_opt("copy").await.unwrap().is_none(), "nothing was written");

    p.create_dataflow(&acme, &name, flow("b"), 100).await.unwrap();
    assert!(matches!(
        p.update_dataflow(&acme, &name, spec).await,
        Err(PlatformError::Invalid(_))
    ));
    // The tenant's own namespace, named or implied, is accepted.
    let mut own = flow("b");
    own.sink.config = Some(serde_json::json!({
        "connectionStringSecretRef": {"name": "db", "namespace": "sless-fn-acme", "key": "url"},
        "table": "b"
    }));
    p.update_dataflow(&acme, &name, own).await.unwrap();
}

/// The fake keeps one store per API group, so the test writes the core/v1
/// Events that the real API server serves for the operator's events.k8s.io
/// ones (one store, two views).
#[tokio::test]
async fn a_dataflows_events_are_its_own_newest_first() {
    use k8s_openapi::api::core::v1::{EventSeries, ObjectReference};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    let (p, client) = platform().await;
    let (acme, name) = (label("acme"), label("copy"));
    p.create_dataflow(&acme, &name, flow("b"), 100).await.unwrap();
    let uid = Api::<DataFlow>::namespaced(client.clone(), "sless-fn-acme")
        .get("copy")
        .await
        .unwrap()
        .metadata
        .uid;
    assert!(uid.is_some(), "the fake gives objects a uid");
    let at = |s: &str| MicroTime(s.parse().unwrap());
    let event = |ns: &str, object: &str, uid: Option<String>, reason: &str, time: &str, series: Option<i32>| Event {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{reason}.{time}").to_lowercase().replace(':', "-")),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("DataFlow".into()),
            name: Some(object.into()),
            namespace: Some(ns.into()),
            uid,
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(format!("{reason} message")),
        type_: Some(if reason == "Unavailable" { "Warning" } else { "Normal" }.into()),
        event_time: Some(at(time)),
        series: series.map(|count| EventSeries {
            count: Some(count),
            last_observed_time: Some(at("2026-12-03T10:05:00Z")),
        }),
        ..Default::default()
    };
    let seeded = [
        event(
            "sless-fn-acme",
            "copy",
            uid.clone(),
            "Starting",
            "2026-12-03T10:00:00Z",
            None,
        ),
        event(
            "sless-fn-acme",
            "copy",
            uid.clone(),
            "Unavailable",
            "2026-12-03T10:01:00Z",
            Some(3),
        ),
        event(
            "sless-fn-acme",
            "copy",
            uid.clone(),
            "Running",
            "2026-12-03T10:02:00Z",
            None,
        ),
        // The same name before it was deleted and made again.
        event(
            "sless-fn-acme",
            "copy",
            Some("an-older-uid".into()),
            "Invalid",
            "2026-12-03T09:00:00Z",
            None,
        ),
        event("sless-fn-acme", "other", None, "Running", "2026-12-03T10:03:00Z", None),
    ];
    for e in &seeded {
        Api::<Event>::namespaced(client.clone(), e.metadata.namespace.as_deref().unwrap())
            .create(&PostParams::default(), e)
            .await
            .unwrap();
    }
    let events = p.dataflow_events(&acme, &name).await.unwrap();
    let seen: Vec<_> = events
        .iter()
        .map(|e| (e.reason.as_str(), e.kind, e.count, e.at.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            ("Unavailable", EventKind::Warning, 3, "2026-12-03T10:05:00Z"),
            ("Running", EventKind::Normal, 1, "2026-12-03T10:02:00Z"),
            ("Starting", EventKind::Normal, 1, "2026-12-03T10:00:00Z"),
        ]
    );
    assert_eq!(events[0].message, "Unavailable message");
    // Another tenant cannot read them, not even by the same name.
    assert!(matches!(
        p.dataflow_events(&label("beta"), &name).await,
        Err(PlatformError::NotFound)
    ));
}

/// Serves `body` as the answer to every HTTP request on 127.0.0.1 (a
/// processor's `/metrics`); returns the port.
async fn metrics_server(body: String) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
        }
    });
    port
}

/// The fake has no kubelet: the test writes the processor pod a ready
/// status with the loopback address, where its `/metrics` is served.
async fn processor_pod(client: &Client, dataflow: &str, ready: bool) {
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(format!("dataflow-{dataflow}-abc")),
            namespace: Some("sless-fn-acme".into()),
            labels: Some(processor_labels(dataflow)),
            ..Default::default()
        },
        status: Some(PodStatus {
            pod_ip: Some("127.0.0.1".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(client.clone(), "sless-fn-acme")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dataflows_counters_are_read_from_its_ready_processor() {
    let exposition = "# TYPE sless_dataflow_messages_read counter\n\
        sless_dataflow_messages_read_total{namespace=\"sless-fn-acme\",dataflow=\"copy\"} 50\n\
        sless_dataflow_messages_written_total{namespace=\"sless-fn-acme\",dataflow=\"copy\"} 45\n\
        sless_dataflow_messages_failed_total{namespace=\"sless-fn-acme\",dataflow=\"copy\"} 0\n\
        sless_dataflow_messages_filtered_total{namespace=\"sless-fn-acme\",dataflow=\"copy\"} 5\n\
        # EOF\n";
    let port = metrics_server(exposition.into()).await;
    let (p, client) = platform().await;
    let p = p.with_processor_metrics_port(port);
    let (acme, copy, idle) = (label("acme"), label("copy"), label("idle"));
    p.create_dataflow(&acme, &copy, flow("b"), 100).await.unwrap();
    p.create_dataflow(&acme, &idle, flow("c"), 100).await.unwrap();
    assert_eq!(p.get_dataflow(&acme, &copy).await.unwrap().counters, None, "no pod yet");
    processor_pod(&client, "copy", true).await;
    processor_pod(&client, "idle", false).await;
    let counters = p.get_dataflow(&acme, &copy).await.unwrap().counters.unwrap();
    assert_eq!(
        (counters.read, counters.written, counters.failed, counters.filtered),
        (50, 45, 0, 5)
    );
    assert_eq!(
        p.get_dataflow(&acme, &idle).await.unwrap().counters,
        None,
        "a pod not ready is not asked"
    );
    assert!(
        p.list_dataflows(&acme)
            .await
            .unwrap()
            .iter()
            .all(|d| d.counters.is_none())
    );

    // A processor answering more than the bound is not read whole.
    let huge = metrics_server(format!("{exposition}{}", "# x\n".repeat(MAX_EXPOSITION_BYTES / 4))).await;
    let (p, client) = platform().await;
    let p = p.with_processor_metrics_port(huge);
    p.create_dataflow(&acme, &copy, flow("b"), 100).await.unwrap();
    processor_pod(&client, "copy", true).await;
    assert_eq!(p.get_dataflow(&acme, &copy).await.unwrap().counters, None);
}
