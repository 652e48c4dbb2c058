//! Reconcile tests. kube-fake-client stands in for the kube-apiserver (none
//! runs here); the test plays the Deployment controller by setting
//! `readyReplicas`.
//!
//! Over 500 lines: one reconciler's behaviours, each test a scenario
//! that shares the setup above.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::*;
use crate::config::OperatorConfig;

/// A tenant's namespace, where REST puts its DataFlows and QueueService.
const NS: &str = "sless-fn-acme";
/// See queue_service/tests.rs: the fake refuses kube's first-finalizer patch.
const OTHER: &str = "example.com/backup";

async fn setup(spec: Value) -> (Api<DataFlow>, Arc<Context>) {
    setup_with(spec, kube_fake_client::ClientBuilder::new()).await
}

async fn setup_with(spec: Value, builder: kube_fake_client::ClientBuilder) -> (Api<DataFlow>, Arc<Context>) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("pg".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "dsn".to_owned(),
            ByteString(b"postgres://etl:pw@db/dwh".to_vec()),
        )])),
        ..Default::default()
    };
    let tls = Secret {
        metadata: ObjectMeta {
            name: Some("kafka-tls".into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "ca.crt".to_owned(),
            ByteString(b"-----BEGIN CERTIFICATE-----".to_vec()),
        )])),
        ..Default::default()
    };
    let client = builder
        .with_resource::<DataFlow>()
        .with_status_subresource::<DataFlow>()
        .with_status_subresource::<Deployment>()
        .with_object(secret)
        .with_object(tls)
        .build()
        .await
        .unwrap();
    let api: Api<DataFlow> = Api::namespaced(client.clone(), NS);
    let mut df = DataFlow::new("orders", serde_json::from_value(spec).unwrap());
    df.metadata.finalizers = Some(vec![OTHER.into()]);
    api.create(&PostParams::default(), &df).await.unwrap();
    let ctx = Arc::new(Context::new(client, OperatorConfig::default(), None));
    (api, ctx)
}

fn flow(sink_config: Value) -> Value {
    json!({
        "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "orders"}},
        "sink": {"type": "postgresql", "config": sink_config},
        "transformations": [{"type": "mask", "config": {"fields": ["card"]}}]
    })
}

/// The Events published on the DataFlow, oldest first: (type, reason, count).
async fn events(ctx: &Context) -> Vec<(String, String, i32)> {
    let events = crate::context::published_events(&ctx.client, NS, "DataFlow").await;
    events
        .into_iter()
        .map(|(type_, reason, count, _)| (type_, reason, count))
        .collect()
}

/// The processor loads the spec the operator wrote.
fn processor_accepts(written: &Value) {
    let dir = std::env::temp_dir().join(format!("sless-op-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("spec.json"), written.to_string()).unwrap();
    sless_dataflow::processor::load_spec(&dir.join("spec.json")).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

async fn run(api: &Api<DataFlow>, ctx: &Arc<Context>) {
    let df = api.get("orders").await.unwrap();
    reconcile(Arc::new(df), ctx.clone()).await.unwrap();
}

async fn status(api: &Api<DataFlow>) -> DataFlowStatus {
    api.get("orders").await.unwrap().status.unwrap_or_default()
}

async fn set_ready(ctx: &Context, replicas: i32) {
    let status = DeploymentStatus {
        ready_replicas: Some(replicas),
        ..Default::default()
    };
    Api::<Deployment>::namespaced(ctx.client.clone(), NS)
        .patch_status(
            "dataflow-orders",
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn children_with_resolved_secrets_then_running_and_a_rerun_writes_nothing() {
    let (api, ctx) = setup(flow(
        json!({"connectionStringSecretRef": {"name": "pg", "key": "dsn"}, "table": "t"}),
    ))
    .await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    assert_eq!(status(&api).await.phase, Some(DataFlowPhase::Pending));
    let client = ctx.client.clone();
    // The resolved spec holds the password: a Secret, never a ConfigMap.
    let spec = Api::<Secret>::namespaced(client.clone(), NS)
        .get("dataflow-orders-spec")
        .await
        .unwrap();
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get_opt("dataflow-orders-spec")
            .await
            .unwrap()
            .is_none()
    );
    let written: Value = serde_json::from_slice(&spec.data.unwrap()["spec.json"].0).unwrap();
    assert_eq!(
        written["sink"]["config"],
        json!({"connectionString": "postgres://etl:pw@db/dwh", "table": "t"})
    );
    // The processor accepts what the operator wrote.
    processor_accepts(&written);
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get("dataflow-orders-checkpoint")
        .await
        .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .get("dataflow-orders-processor")
        .await
        .unwrap();
    Api::<Role>::namespaced(client.clone(), NS)
        .get("dataflow-orders-processor")
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), NS)
        .get("dataflow-orders-processor")
        .await
        .unwrap();

    set_ready(&ctx, 1).await;
    run(&api, &ctx).await;
    let running = status(&api).await;
    assert_eq!(running.phase, Some(DataFlowPhase::Running));
    assert_eq!(running.conditions[0].status, "True");
    assert_eq!(
        running.observed_generation,
        api.get("orders").await.unwrap().metadata.generation
    );
    let version = api.get("orders").await.unwrap().resource_version();
    run(&api, &ctx).await;
    assert_eq!(api.get("orders").await.unwrap().resource_version(), version);
}

#[tokio::test]
async fn a_lost_processor_is_an_error_until_it_is_back() {
    let (api, ctx) = setup(flow(json!({"connectionString": "postgres://db/x", "table": "t"}))).await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    set_ready(&ctx, 1).await;
    run(&api, &ctx).await;
    Api::<Deployment>::namespaced(ctx.client.clone(), NS)
        .delete("dataflow-orders", &DeleteParams::default())
        .await
        .unwrap();
    run(&api, &ctx).await;
    let lost = status(&api).await;
    assert_eq!(lost.phase, Some(DataFlowPhase::Error));
    assert_eq!(lost.message.as_deref(), Some("the processor has no ready replica"));
    set_ready(&ctx, 1).await;
    run(&api, &ctx).await;
    assert_eq!(status(&api).await.phase, Some(DataFlowPhase::Running));
    let events = events(&ctx).await;
    let (normal, warning) = ("Normal".to_owned(), "Warning".to_owned());
    assert_eq!(
        events,
        [
            (normal.clone(), "Starting".into(), 1),
            (normal, "Running".into(), 2),
            (warning, "Unavailable".into(), 1),
        ]
    );
}

#[tokio::test]
async fn a_secret_of_another_namespace_or_an_invalid_spec_is_an_error_with_the_reason() {
    let (api, ctx) = setup(flow(json!({
        "connectionStringSecretRef": {"name": "pg", "key": "dsn", "namespace": "team-b"}, "table": "t"
    })))
    .await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    let refused = status(&api).await;
    assert_eq!(refused.phase, Some(DataFlowPhase::Error));
    assert!(refused.message.as_deref().unwrap().contains("team-b"), "{refused:?}");
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), NS);
    assert!(deployments.get_opt("dataflow-orders").await.unwrap().is_none());

    let bad = json!({"spec": {"transformations": [{"type": "explode", "config": {}}]}});
    api.patch("orders", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .unwrap();
    run(&api, &ctx).await;
    let message = status(&api).await.message.unwrap_or_default();
    assert!(
        message.starts_with("invalid spec: transformations[0].type"),
        "{message}"
    );
    // Each new reason to fail is published again.
    assert_eq!(events(&ctx).await, [("Warning".into(), "Invalid".into(), 2)]);
}

#[tokio::test]
async fn without_checkpoint_persistence_and_on_delete_nothing_is_left() {
    let mut spec = flow(json!({"connectionString": "postgres://db/x", "table": "t"}));
    spec["checkpointPersistence"] = json!(false);
    let (api, ctx) = setup(spec).await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    let client = ctx.client.clone();
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), NS);
    assert!(
        configmaps
            .get_opt("dataflow-orders-checkpoint")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .get_opt("dataflow-orders-processor")
            .await
            .unwrap()
            .is_none()
    );
    // Marked for deletion as the apiserver would (the fake deletes at once).
    let mut marked = api.get("orders").await.unwrap();
    marked.metadata.deletion_timestamp = Some(crate::objects::now());
    reconcile(Arc::new(marked), ctx.clone()).await.unwrap();
    assert!(configmaps.get_opt("dataflow-orders-spec").await.unwrap().is_none());
    assert!(
        Api::<Secret>::namespaced(client.clone(), NS)
            .get_opt("dataflow-orders-spec")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Deployment>::namespaced(client, NS)
            .get_opt("dataflow-orders")
            .await
            .unwrap()
            .is_none()
    );
    let left = api.get("orders").await.unwrap();
    assert_eq!(left.finalizers(), [OTHER]);
    assert_eq!(
        left.status.unwrap().phase,
        Some(DataFlowPhase::Stopped),
        "seed 001's last status"
    );
}

/// A Kafka TLS `…SecretRef` could not work before (resolved to a key the
/// TLS config refuses, nothing mounted): it becomes a file the processor's
/// pod mounts from the Secret, and the spec names that file.
#[tokio::test]
async fn kafka_tls_secret_refs_become_mounted_files() {
    let mut spec = flow(json!({"connectionString": "postgres://db/x", "table": "t"}));
    spec["source"]["config"]["tls"] = json!({"caSecretRef": {"name": "kafka-tls", "key": "ca.crt"}});
    let (api, ctx) = setup(spec).await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    assert_eq!(
        status(&api).await.phase,
        Some(DataFlowPhase::Pending),
        "{:?}",
        status(&api).await
    );
    let client = ctx.client.clone();
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get("dataflow-orders-spec")
        .await
        .unwrap();
    let written: Value = serde_json::from_slice(&secret.data.unwrap()["spec.json"].0).unwrap();
    assert_eq!(
        written["source"]["config"]["tls"],
        json!({"caFile": "kafka-tls/ca.crt"})
    );
    // The processor accepts what the operator wrote.
    processor_accepts(&written);
    let deployment = Api::<Deployment>::namespaced(client, NS)
        .get("dataflow-orders")
        .await
        .unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    let volume = pod
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("kafka-tls"))
        .expect("the TLS Secret is a volume");
    let mount = pod.containers[0]
        .volume_mounts
        .as_ref()
        .unwrap()
        .iter()
        .find(|m| m.name == volume.name)
        .expect("and is mounted")
        .clone();
    assert_eq!(mount.mount_path, "/etc/dataflow-tls/kafka-tls");
    assert!(
        pod.containers[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--tls-dir=/etc/dataflow-tls".to_owned())
    );
}

/// A QueueService in `namespace` for `tenant`, Ready or not, and its keys
/// where the operator keeps them.
fn queue_service(
    builder: kube_fake_client::ClientBuilder,
    namespace: &str,
    name: &str,
    tenant: &str,
    ready: bool,
) -> kube_fake_client::ClientBuilder {
    use crate::crd::queue_service::{QueueService, QueueServiceStatus};
    let mut qs = QueueService::new(name, serde_json::from_value(json!({"tenantId": tenant})).unwrap());
    qs.metadata.namespace = Some(namespace.into());
    qs.status = Some(QueueServiceStatus {
        phase: Some(if ready {
            QueueServicePhase::Ready
        } else {
            QueueServicePhase::Provisioning
        }),
        endpoint: ready.then(|| format!("https://sqs.example/sqs/{tenant}")),
        ..Default::default()
    });
    let keys = Secret {
        metadata: ObjectMeta {
            name: Some(qs_builders::secret_name(tenant)),
            namespace: Some(qs_builders::namespace_name(tenant)),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("accessKey".to_owned(), ByteString(format!("AK-{tenant}").into_bytes())),
            ("secretKey".to_owned(), ByteString(format!("SK-{tenant}").into_bytes())),
        ])),
        ..Default::default()
    };
    builder
        .with_resource::<QueueService>()
        .with_status_subresource::<QueueService>()
        .with_object(qs)
        .with_object(keys)
}

/// An SQS connector naming a queue service gets the queue's URL and the
/// service's keys in the resolved spec; only the DataFlow's own
/// namespace's services are found, and only once Ready.
#[tokio::test]
async fn a_queue_service_by_name_resolves_to_its_url_and_keys_in_its_namespace_only() {
    let builder = queue_service(kube_fake_client::ClientBuilder::new(), NS, "main", "acme", true);
    let builder = queue_service(builder, "team-b", "theirs", "beta", true);
    let builder = queue_service(builder, NS, "warming", "acme2", false);
    // In the tenant's namespace, but naming another tenant (made without
    // the webhook): its keys are that tenant's and are not handed out.
    let builder = queue_service(builder, NS, "foreign", "gamma", true);
    let spec = json!({
        "source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "orders"}},
        "sink": {"type": "sqs", "config": {"queueService": "main", "queueName": "orders.fifo"}},
    });
    let (api, ctx) = setup_with(spec, builder).await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    assert_eq!(
        status(&api).await.phase,
        Some(DataFlowPhase::Pending),
        "{:?}",
        status(&api).await
    );
    let spec = Api::<Secret>::namespaced(ctx.client.clone(), NS)
        .get("dataflow-orders-spec")
        .await
        .unwrap();
    let written: Value = serde_json::from_slice(&spec.data.unwrap()["spec.json"].0).unwrap();
    let config = &written["sink"]["config"];
    assert_eq!(
        config["queueUrl"],
        format!(
            "https://sqs.example/sqs/acme/{}/orders.fifo",
            sless_sqs::credentials::account_id("acme")
        )
    );
    assert_eq!(
        (&config["accessKeyId"], &config["secretAccessKey"]),
        (&json!("AK-acme"), &json!("SK-acme"))
    );
    assert!(
        config["queueService"].is_null() && config["queueName"].is_null(),
        "{config}"
    );
    processor_accepts(&written);

    for (service, reason) in [
        ("theirs", "not found in sless-fn-acme"),
        ("warming", "not Ready yet"),
        ("foreign", "names tenant gamma"),
    ] {
        let patch = json!({"spec": {"sink": {"type": "sqs", "config": {"queueService": service, "queueName": "q"}}}});
        api.patch("orders", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        run(&api, &ctx).await;
        let refused = status(&api).await;
        assert_eq!(refused.phase, Some(DataFlowPhase::Error), "{service}");
        assert!(
            refused.message.as_deref().unwrap_or_default().contains(reason),
            "{refused:?}"
        );
    }
}

/// A processor pod of `orders` on loopback, running but not ready, as the
/// kubelet reports a pod whose readiness fails.
async fn processor_pod(ctx: &Context) {
    let pod = k8s_openapi::api::core::v1::Pod {
        metadata: ObjectMeta {
            name: Some("dataflow-orders-5d9c-x7k2p".into()),
            namespace: Some(NS.into()),
            labels: Some(builders::processor_labels("orders")),
            ..Default::default()
        },
        status: Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("127.0.0.1".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::namespaced(ctx.client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// A stand-in processor whose `/status` says `said` (changed through the
/// returned handle); its port.
async fn saying(said: Value) -> (u16, Arc<std::sync::Mutex<Value>>) {
    let said = Arc::new(std::sync::Mutex::new(said));
    let shared = said.clone();
    let app = axum::Router::new().route(
        "/status",
        axum::routing::get(move || {
            let said = shared.lock().unwrap().clone();
            async move { axum::Json(said) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, said)
}

/// Why a processor fails reaches the DataFlow's status, its condition and
/// an Event, in the processor's own words (those `sless dev` shows), and a
/// new reason (a refused message counted again) replaces the old.
#[tokio::test]
async fn the_processors_reason_becomes_the_status_condition_and_event() {
    let (api, ctx) = setup(flow(json!({"connectionString": "postgres://db/x", "table": "t"}))).await;
    let wrong = "cannot connect: password authentication failed for user \"etl\"; retrying";
    let (port, said) = saying(json!({"phase": "Error", "message": wrong})).await;
    let ctx = Arc::new(
        Context::new(ctx.client.clone(), OperatorConfig::default(), None)
            .with_processors(processor::Processors::on_port(port)),
    );
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    assert_eq!(status(&api).await.phase, Some(DataFlowPhase::Pending), "no pod yet");
    processor_pod(&ctx).await;
    run(&api, &ctx).await;
    let now = status(&api).await;
    assert_eq!(
        (now.phase, now.message.as_deref()),
        (Some(DataFlowPhase::Error), Some(wrong))
    );
    assert_eq!(now.conditions[0].reason, "ProcessorFailing");
    assert_eq!(now.conditions[0].message, wrong);
    assert!(
        events(&ctx)
            .await
            .contains(&("Warning".into(), "ProcessorFailing".into(), 1)),
        "{:?}",
        events(&ctx).await
    );

    let refused = "postgresql table t refuses a message (null value in column \"id\") and there is no error sink: \
                   retrying it; refused 3 time(s) so far";
    *said.lock().unwrap() = json!({"phase": "Error", "message": refused});
    run(&api, &ctx).await;
    assert_eq!(status(&api).await.message.as_deref(), Some(refused));
    *said.lock().unwrap() = json!({"phase": "Running", "message": "running"});
    run(&api, &ctx).await;
    assert_eq!(status(&api).await.phase, Some(DataFlowPhase::Running));
}
