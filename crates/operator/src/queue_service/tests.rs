//! Reconcile tests. kube-fake-client stands in for the kube-apiserver (none
//! runs here): an in-memory API with resource versions, status
//! subresources, server-side apply (as a merge) and finalizers. The
//! Deployment controller is played by the test, which sets its rollout
//! status as the controller and the kubelet's reports would.
//!
//! Over 500 lines: one reconciler's behaviours, each test a scenario
//! that shares the setup above.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

use super::*;
use crate::config::OperatorConfig;
use crate::crd::queue_service::{QueueEngine, QueueServiceSpec};

const NS: &str = "sless-fn-acme";
const OTHER: &str = "example.com/backup";

async fn setup() -> (Api<QueueService>, Arc<Context>) {
    setup_with(QueueEngine::Elasticmq).await
}

async fn setup_with(engine: QueueEngine) -> (Api<QueueService>, Arc<Context>) {
    let client = kube_fake_client::ClientBuilder::new()
        .with_resource::<QueueService>()
        .with_status_subresource::<QueueService>()
        .with_status_subresource::<Deployment>()
        .build()
        .await
        .unwrap();
    let api: Api<QueueService> = Api::namespaced(client.clone(), NS);
    let qs = QueueService::new(
        "main",
        QueueServiceSpec {
            tenant_id: "acme".into(),
            memory_mb: 64,
            storage_mb: 512,
            persistence: true,
            engine,
            durability: Default::default(),
            replicas: None,
            requests_per_second: None,
            bytes_per_second: None,
        },
    );
    // Another controller's finalizer is there already. (Adding the first
    // finalizer makes kube send a JSON-patch `test` of the missing list
    // against null, which the apiserver accepts and the fake refuses.)
    let mut qs = qs;
    qs.metadata.finalizers = Some(vec![OTHER.into()]);
    api.create(&PostParams::default(), &qs).await.unwrap();
    let ctx = Arc::new(Context::new(
        client,
        // The fake cannot route Namespace objects (/api/v1/namespaces is
        // read as a namespaced path): the tenant namespace is taken as
        // provisioned, as on platforms that make it themselves.
        OperatorConfig {
            create_namespaces: false,
            ..OperatorConfig::default()
        },
        Some("sless-operator-0".into()),
    ));
    (api, ctx)
}

/// The Events published on the QueueService, oldest first: (type, reason, count).
async fn events(ctx: &Context) -> Vec<(String, String, i32)> {
    let events = crate::context::published_events(&ctx.client, NS, "QueueService").await;
    events
        .into_iter()
        .inspect(|(.., instance)| assert_eq!(instance, "sless-operator-0"))
        .map(|(type_, reason, count, _)| (type_, reason, count))
        .collect()
}

/// One reconcile of the object as it is stored now.
async fn run(api: &Api<QueueService>, ctx: &Arc<Context>) -> Action {
    let qs = api.get("main").await.unwrap();
    reconcile(Arc::new(qs), ctx.clone()).await.unwrap()
}

async fn status(api: &Api<QueueService>) -> QueueServiceStatus {
    api.get("main").await.unwrap().status.unwrap_or_default()
}

/// The Deployment controller's report: its one replica rolled out, and
/// `available` of them available. kube-fake-client bumps a Deployment's
/// generation at every apply, even an unchanged one (the API server does
/// not), so the report claims every generation seen; rollouts are checked
/// on `Rollout::of` itself.
async fn set_available(ctx: &Context, available: i32) {
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), NS);
    let status = DeploymentStatus {
        observed_generation: Some(i64::MAX),
        replicas: Some(1),
        updated_replicas: Some(1),
        available_replicas: Some(available),
        ..Default::default()
    };
    deployments
        .patch_status(
            "sqs-acme",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn create_then_available_then_ready_and_a_rerun_changes_nothing() {
    let (api, ctx) = setup().await;
    // The first pass only adds the finalizer.
    run(&api, &ctx).await;
    assert_eq!(api.get("main").await.unwrap().finalizers(), [OTHER, FINALIZER]);
    run(&api, &ctx).await;
    let s = status(&api).await;
    assert_eq!(s.phase, Some(QueueServicePhase::Provisioning));
    assert_eq!(s.secret_name.as_deref(), Some("sqs-creds-acme"));
    assert_eq!(s.endpoint, None);
    assert_eq!(s.conditions[0].status, "False");

    let client = ctx.client.clone();
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get("sqs-creds-acme")
        .await
        .unwrap();
    let keys = secret.string_data.clone().or(secret.data.clone().map(|d| {
        d.into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect()
    }));
    let keys = keys.expect("the secret has keys");
    assert!(keys["accessKey"].starts_with("SQSAKacme_"), "{keys:?}");
    for name in ["sqs-cfg-acme"] {
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get(name)
            .await
            .unwrap();
    }
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .get("sqs-data-acme")
        .await
        .unwrap();
    let deployment = Api::<Deployment>::namespaced(client.clone(), NS)
        .get("sqs-acme")
        .await
        .unwrap();
    assert_eq!(deployment.owner_references()[0].name, "main");
    Api::<Service>::namespaced(client.clone(), NS)
        .get("sqs-svc-acme")
        .await
        .unwrap();
    Api::<Ingress>::namespaced(client.clone(), NS)
        .get("sqs-ing-acme")
        .await
        .unwrap();

    set_available(&ctx, 1).await;
    let action = run(&api, &ctx).await;
    assert_eq!(action, Action::requeue(Duration::from_secs(300)));
    let ready = status(&api).await;
    assert_eq!(ready.phase, Some(QueueServicePhase::Ready));
    // No TLS configured: the endpoint says so.
    assert_eq!(ready.endpoint.as_deref(), Some("http://sqs.kube5s.ru/sqs/acme"));
    assert!(ready.ready_at.is_some());
    assert_eq!(ready.conditions[0].status, "True");

    // Idempotent: the status is not rewritten and the keys are not rotated.
    let version = api.get("main").await.unwrap().resource_version();
    run(&api, &ctx).await;
    assert_eq!(api.get("main").await.unwrap().resource_version(), version);
    assert_eq!(status(&api).await, ready);
    let again = Api::<Secret>::namespaced(client, NS)
        .get("sqs-creds-acme")
        .await
        .unwrap();
    assert_eq!(again.string_data, secret.string_data);
    assert_eq!(again.data, secret.data);
    // One Event per phase change, none for the re-run.
    assert_eq!(
        events(&ctx).await,
        [
            ("Normal".into(), "Provisioning".into(), 1),
            ("Normal".into(), "Available".into(), 1)
        ]
    );
}

#[tokio::test]
async fn a_lost_deployment_fails_and_recovers() {
    let (api, ctx) = setup().await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    set_available(&ctx, 1).await;
    run(&api, &ctx).await;
    let ready_at = status(&api).await.ready_at;
    // The Deployment disappears (deleted by hand): re-created, not yet available.
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), NS);
    deployments.delete("sqs-acme", &DeleteParams::default()).await.unwrap();
    run(&api, &ctx).await;
    let failed = status(&api).await;
    assert_eq!(failed.phase, Some(QueueServicePhase::Failed));
    assert_eq!(failed.conditions[0].reason, "Unavailable");
    deployments.get("sqs-acme").await.expect("re-created");
    set_available(&ctx, 1).await;
    run(&api, &ctx).await;
    let recovered = status(&api).await;
    assert_eq!(recovered.phase, Some(QueueServicePhase::Ready));
    assert_eq!(recovered.ready_at, ready_at, "readyAt is the first time it was Ready");
    // Ready twice: one Event, seen twice.
    assert_eq!(
        events(&ctx).await,
        [
            ("Normal".into(), "Provisioning".into(), 1),
            ("Normal".into(), "Available".into(), 2),
            ("Warning".into(), "Unavailable".into(), 1)
        ]
    );
}

#[tokio::test]
async fn delete_removes_the_children_keeps_the_pvc_and_releases_the_finalizer() {
    let (api, ctx) = setup().await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    // A delete of an object with finalizers only marks it. The fake would
    // remove it at once and refuses to set the mark, so the reconciler gets
    // the object as the watch would deliver it after the apiserver's mark.
    let mut marked = api.get("main").await.unwrap();
    marked.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    reconcile(Arc::new(marked), ctx.clone()).await.unwrap();
    let client = ctx.client.clone();
    assert!(
        Api::<Deployment>::namespaced(client.clone(), NS)
            .get_opt("sqs-acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Service>::namespaced(client.clone(), NS)
            .get_opt("sqs-svc-acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Ingress>::namespaced(client.clone(), NS)
            .get_opt("sqs-ing-acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get_opt("sqs-cfg-acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<Secret>::namespaced(client.clone(), NS)
            .get_opt("sqs-creds-acme")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<PersistentVolumeClaim>::namespaced(client, NS)
            .get_opt("sqs-data-acme")
            .await
            .unwrap()
            .is_some()
    );
    // Ours is released; the other controller's keeps the object for now,
    // and its status says it is going (seed 000's Deleting).
    let left = api.get("main").await.unwrap();
    assert_eq!(left.finalizers(), [OTHER]);
    assert_eq!(
        left.status.unwrap().phase,
        Some(sless_model::queue_service::QueueServicePhase::Deleting)
    );
}

#[tokio::test]
async fn the_sless_engine_gets_a_token_a_fence_and_the_gateway_behind_its_ingress() {
    let (api, ctx) = setup_with(QueueEngine::Sless).await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    let client = ctx.client.clone();
    let secrets = Api::<Secret>::namespaced(client.clone(), NS);
    let values = crate::objects::secret_strings(secrets.get("sqs-creds-acme").await.unwrap());
    let token = values[builders::ENGINE_TOKEN_KEY].clone();
    assert_eq!(token.len(), 32, "{values:?}");
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), NS)
            .get_opt("sqs-cfg-acme")
            .await
            .unwrap()
            .is_none(),
        "no HOCON for sless queue"
    );
    Api::<NetworkPolicy>::namespaced(client.clone(), NS)
        .get("sqs-netpol-acme")
        .await
        .unwrap();
    let gateway = Api::<Service>::namespaced(client.clone(), NS)
        .get("sqs-gw-acme")
        .await
        .unwrap();
    assert_eq!(gateway.spec.unwrap().type_.as_deref(), Some("ExternalName"));
    let set = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get("sqs")
        .await
        .unwrap()
        .spec
        .unwrap();
    // Three replicas by default, with a persistent store.
    assert_eq!(set.replicas, Some(3));
    let container = &set.template.spec.unwrap().containers[0];
    assert_eq!(container.args.as_ref().unwrap()[0], "queue");
    assert_eq!(values[builders::PEER_TOKEN_KEY].len(), 32);
    assert_ne!(values[builders::PEER_TOKEN_KEY], token);
    Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
        .get("sqs-pdb-acme")
        .await
        .unwrap();
    Api::<Service>::namespaced(client.clone(), NS)
        .get("sqs-peers")
        .await
        .unwrap();

    // A Secret from before engine tokens (its token removed here) gets one;
    // the keys stay.
    let mut old = secrets.get("sqs-creds-acme").await.unwrap();
    old.string_data = None;
    old.data = Some(
        values
            .iter()
            .filter(|(k, _)| k.as_str() != builders::ENGINE_TOKEN_KEY)
            .map(|(k, v)| (k.clone(), k8s_openapi::ByteString(v.clone().into_bytes())))
            .collect(),
    );
    secrets
        .replace("sqs-creds-acme", &PostParams::default(), &old)
        .await
        .unwrap();
    run(&api, &ctx).await;
    let renewed = crate::objects::secret_strings(secrets.get("sqs-creds-acme").await.unwrap());
    assert_eq!(renewed["accessKey"], values["accessKey"]);
    assert_eq!(renewed[builders::ENGINE_TOKEN_KEY].len(), 32);
    assert_ne!(
        renewed[builders::ENGINE_TOKEN_KEY],
        token,
        "a new token, since the old one was gone"
    );

    // Switching to ElasticMQ brings its HOCON; cleanup removes the fence.
    let patch = serde_json::json!({"spec": {"engine": "elasticmq"}});
    api.patch("main", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    run(&api, &ctx).await;
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get("sqs-cfg-acme")
        .await
        .unwrap();
    // ... and sless queue's replicas go.
    for gone in [
        Api::<StatefulSet>::namespaced(client.clone(), NS)
            .get_opt("sqs")
            .await
            .unwrap()
            .is_none(),
        Api::<PodDisruptionBudget>::namespaced(client.clone(), NS)
            .get_opt("sqs-pdb-acme")
            .await
            .unwrap()
            .is_none(),
        Api::<Service>::namespaced(client.clone(), NS)
            .get_opt("sqs-peers")
            .await
            .unwrap()
            .is_none(),
    ] {
        assert!(gone);
    }
    let mut marked = api.get("main").await.unwrap();
    marked.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    reconcile(Arc::new(marked), ctx.clone()).await.unwrap();
    for gone in [
        Api::<NetworkPolicy>::namespaced(client.clone(), NS)
            .get_opt("sqs-netpol-acme")
            .await
            .unwrap()
            .is_none(),
        Api::<Service>::namespaced(client, NS)
            .get_opt("sqs-gw-acme")
            .await
            .unwrap()
            .is_none(),
    ] {
        assert!(gone);
    }
}

/// A QueueService in one tenant's namespace that names another tenant
/// (made where the webhook does not run) makes nothing, in neither
/// namespace, and says why.
#[tokio::test]
async fn a_queue_service_naming_another_tenant_makes_nothing() {
    let (api, ctx) = setup().await;
    let patch = serde_json::json!({"spec": {"tenantId": "beta"}});
    api.patch("main", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    let status = api.get("main").await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(QueueServicePhase::Failed));
    assert!(status.message.unwrap().contains("sless-fn-beta"));
    for ns in [NS, "sless-fn-beta"] {
        let made = Api::<Deployment>::namespaced(ctx.client.clone(), ns)
            .list(&Default::default())
            .await
            .unwrap();
        assert!(made.items.is_empty(), "{ns}");
        let keys = Api::<Secret>::namespaced(ctx.client.clone(), ns)
            .list(&Default::default())
            .await
            .unwrap();
        assert!(keys.items.is_empty(), "{ns}");
    }
}

/// A reconcile that fails (here the API server refusing a volume's growth)
/// is shown on the QueueService, as a Warning Event and its `Reconciled`
/// condition with the reason, not only in the operator's log; the next
/// reconcile that succeeds clears it.
#[tokio::test]
async fn a_failed_reconcile_shows_on_the_object_until_one_succeeds() {
    let (api, ctx) = setup().await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    let refusal =
        "persistentvolumeclaims \"sqs-data-acme\" is forbidden: only dynamically provisioned pvc can be resized";
    let failed = crate::context::reconcile_finalized(
        Arc::new(api.get("main").await.unwrap()),
        &ctx,
        FINALIZER,
        |_, _| async {
            Err(Error::Kube(kube::Error::Api(Box::new(kube::core::Status::failure(
                refusal,
                "Forbidden",
            )))))
        },
    )
    .await;
    assert!(failed.is_err());
    let reconciled = |qs: QueueService| {
        qs.status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.type_ == crate::context::RECONCILED)
            .map(|c| (c.status, c.reason, c.message))
    };
    let (status, reason, message) = reconciled(api.get("main").await.unwrap()).unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "ReconcileFailed"));
    assert!(message.contains("only dynamically provisioned"), "{message}");
    assert!(
        events(&ctx)
            .await
            .contains(&("Warning".into(), "ReconcileFailed".into(), 1)),
        "{:?}",
        events(&ctx).await
    );
    // The Ready condition the reconciler wrote is kept beside it.
    let conditions = api.get("main").await.unwrap().status.unwrap().conditions;
    assert!(conditions.iter().any(|c| c.type_ == "Ready"), "{conditions:?}");

    run(&api, &ctx).await;
    let (status, ..) = reconciled(api.get("main").await.unwrap()).unwrap();
    assert_eq!(status, "True");
}

/// With the SQS host's certificate configured, each tenant's namespace
/// gets a copy (no hand copying), its Ingress serves TLS with it and the
/// endpoint says https; a renewed certificate is copied again; while the
/// certificate is missing, the endpoint says http.
#[tokio::test]
async fn the_hosts_certificate_is_copied_to_the_tenant_and_the_endpoint_says_https() {
    let (api, ctx) = setup().await;
    let tls = OperatorConfig {
        sqs_tls_secret: Some("sless-sqs-tls".into()),
        create_namespaces: false,
        ..OperatorConfig::default()
    };
    let ctx = Arc::new(Context::new(ctx.client.clone(), tls, None));
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    set_available(&ctx, 1).await;
    run(&api, &ctx).await;
    assert_eq!(
        status(&api).await.endpoint.as_deref(),
        Some("http://sqs.kube5s.ru/sqs/acme"),
        "configured but not there yet"
    );
    let source = |crt: &str| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("sless-sqs-tls".into()),
            namespace: Some("sless-system".into()),
            ..Default::default()
        },
        data: Some(std::collections::BTreeMap::from([
            ("tls.crt".to_owned(), k8s_openapi::ByteString(crt.as_bytes().to_vec())),
            ("tls.key".to_owned(), k8s_openapi::ByteString(b"KEY".to_vec())),
            ("ca.crt".to_owned(), k8s_openapi::ByteString(b"CA".to_vec())),
        ])),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    };
    let system: Api<Secret> = Api::namespaced(ctx.client.clone(), "sless-system");
    system.create(&PostParams::default(), &source("CERT-1")).await.unwrap();
    run(&api, &ctx).await;
    let copied = Api::<Secret>::namespaced(ctx.client.clone(), NS)
        .get("sqs-tls-acme")
        .await
        .unwrap();
    let data = copied.data.unwrap();
    assert_eq!(data["tls.crt"].0, b"CERT-1");
    assert!(!data.contains_key("ca.crt"), "only the pair an Ingress reads");
    let ingress = Api::<Ingress>::namespaced(ctx.client.clone(), NS)
        .get("sqs-ing-acme")
        .await
        .unwrap();
    assert_eq!(
        ingress.spec.unwrap().tls.unwrap()[0].secret_name.as_deref(),
        Some("sqs-tls-acme")
    );
    assert_eq!(
        status(&api).await.endpoint.as_deref(),
        Some("https://sqs.kube5s.ru/sqs/acme")
    );

    // cert-manager renews it: the next reconcile copies the new one.
    system
        .replace("sless-sqs-tls", &PostParams::default(), &{
            let mut renewed = source("CERT-2");
            renewed.metadata.resource_version = system.get("sless-sqs-tls").await.unwrap().metadata.resource_version;
            renewed
        })
        .await
        .unwrap();
    run(&api, &ctx).await;
    let copied = Api::<Secret>::namespaced(ctx.client.clone(), NS)
        .get("sqs-tls-acme")
        .await
        .unwrap();
    assert_eq!(copied.data.unwrap()["tls.crt"].0, b"CERT-2");
}

/// A Deployment of `generation` whose controller reports `status`
/// (observedGeneration, replicas, updatedReplicas, availableReplicas).
fn deployment_at(generation: i64, status: Option<(i64, i32, i32, i32)>) -> Deployment {
    let mut d = Deployment::default();
    d.metadata.generation = Some(generation);
    d.status = status.map(|(observed, replicas, updated, available)| DeploymentStatus {
        observed_generation: Some(observed),
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        available_replicas: Some(available),
        ..Default::default()
    });
    d
}

/// After a memory or durability change the old engine is still available
/// while the Deployment controller has not taken up the new template (or
/// while `Recreate` stops it): that is a rollout, not Ready, and not a
/// failure either.
#[test]
fn ready_only_once_the_new_template_runs() {
    let of = |generation, status| Rollout::of_deployment(&deployment_at(generation, status));
    assert_eq!(of(1, Some((1, 1, 1, 1))), Rollout::Done);
    // Not yet seen by the Deployment controller; the old pod answers.
    assert_eq!(of(2, Some((1, 1, 1, 1))), Rollout::InProgress);
    // Seen, the old pod still there (replicas counts it, updated not).
    assert_eq!(of(2, Some((2, 1, 0, 1))), Rollout::InProgress);
    // Recreate: the old pod gone, the new one not available yet.
    assert_eq!(of(2, Some((2, 1, 1, 0))), Rollout::Unavailable);
    assert_eq!(of(2, None), Rollout::Unavailable);

    let ready = observed_status(
        &QueueServiceStatus::default(),
        Rollout::Done,
        "https://e/sqs/acme",
        "acme",
    );
    assert_eq!(ready.phase, Some(QueueServicePhase::Ready));
    let rolling = observed_status(&ready, Rollout::InProgress, "https://e/sqs/acme", "acme");
    assert_eq!(rolling.phase, Some(QueueServicePhase::Provisioning));
    assert_eq!(rolling.conditions[0].reason, "RollingOut");
    assert_eq!(rolling.conditions[0].status, "False");
    let failed = observed_status(&ready, Rollout::Unavailable, "https://e/sqs/acme", "acme");
    assert_eq!(failed.phase, Some(QueueServicePhase::Failed));
}

/// Three replicas serve while two are available: one lost (evicted, or
/// on a dead node) is not a failure. A new template is a rollout until
/// the controller made every pod of it Ready once; more pods than there
/// are is one too.
#[test]
fn three_replicas_are_available_with_a_majority() {
    let of = |want: i32, observed: i64, pods: i32, revisions: (&str, &str), available: i32| {
        let mut set = StatefulSet::default();
        set.metadata.generation = Some(2);
        set.spec = Some(k8s_openapi::api::apps::v1::StatefulSetSpec {
            replicas: Some(want),
            ..Default::default()
        });
        set.status = Some(StatefulSetStatus {
            observed_generation: Some(observed),
            replicas: pods,
            current_revision: Some(revisions.0.into()),
            update_revision: Some(revisions.1.into()),
            available_replicas: Some(available),
            ..Default::default()
        });
        Rollout::of_stateful_set(&set)
    };
    assert_eq!(of(3, 2, 3, ("a", "a"), 3), Rollout::Done);
    assert_eq!(of(3, 2, 3, ("a", "a"), 2), Rollout::Done);
    assert_eq!(of(3, 2, 3, ("a", "a"), 1), Rollout::Unavailable);
    assert_eq!(of(1, 2, 1, ("a", "a"), 0), Rollout::Unavailable);
    // A new template not yet on every pod, or not yet seen.
    assert_eq!(of(3, 2, 3, ("a", "b"), 3), Rollout::InProgress);
    assert_eq!(of(3, 1, 3, ("a", "a"), 3), Rollout::InProgress);
    // Growing: the new pods not made yet.
    assert_eq!(of(3, 2, 1, ("a", "a"), 1), Rollout::InProgress);
    assert_eq!(Rollout::of_stateful_set(&StatefulSet::default()), Rollout::Unavailable);
}

/// The status names the generation it describes, the spec's own, as the
/// API's "not reconciled yet" check reads it.
#[tokio::test]
async fn the_status_names_the_generation_it_describes() {
    let (api, ctx) = setup().await;
    run(&api, &ctx).await;
    run(&api, &ctx).await;
    set_available(&ctx, 1).await;
    run(&api, &ctx).await;
    let qs = api.get("main").await.unwrap();
    assert_eq!(qs.status.unwrap().observed_generation, qs.metadata.generation);
}
