//! The real `sless serve` binary, two replicas, against an HTTP Kubernetes
//! API: its controllers' watch streams, the leader Lease, server-side
//! apply, status patches and the REST API's custom resources all go over
//! the wire, as on a cluster.
//!
//! There is no kube-apiserver here. `sless_testkit::kube_api` stands in:
//! an in-memory store behind the API's HTTP paths (see its module doc).
//! It has no garbage collector, no admission (nothing calls the webhook;
//! the test calls it as the API server would), no schema checks and no
//! kubelet or scheduler: the test reports the engine's StatefulSet
//! available, as the StatefulSet controller would once its pods ran.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use sless_testkit::kube_api::KubeApi;
use sless_testkit::redis::RedisServer;
use sless_testkit::tls::Ca;
use sless_testkit::{TempDir, free_port};

const TOKEN: &str = "tenant-acme-token-0123456789";
const NS: &str = "sless-fn-acme";

/// One `sless serve` replica: REST API, metrics and probes, webhook.
struct Replica {
    child: Child,
    name: &'static str,
    api: String,
    probes: String,
    webhook: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Replica {
    fn start(name: &'static str, dir: &TempDir, redis: &str, cert: &str, key: &str) -> Self {
        let (api, probes, webhook, cp) = (free_port(), free_port(), free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_sless"))
            .args(["serve", "--redis-url", redis, "--tenant", &format!("acme={TOKEN}")])
            .arg("--kubeconfig")
            .arg(dir.0.join("kubeconfig"))
            .args(["--listen", &format!("127.0.0.1:{api}")])
            .args(["--metrics-listen", &format!("127.0.0.1:{probes}")])
            .args(["--control-plane-listen", &format!("127.0.0.1:{cp}")])
            .args(["--webhook-listen", &format!("127.0.0.1:{webhook}")])
            .args(["--webhook-cert", cert, "--webhook-key", key])
            .args(["--pod-name", name])
            .env("SLESS_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn sless serve");
        Self {
            child,
            name,
            api: format!("http://127.0.0.1:{api}"),
            probes: format!("http://127.0.0.1:{probes}"),
            webhook: format!("https://localhost:{webhook}/validate/dataflows"),
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn eventually<F: std::future::Future<Output = bool>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "never within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

async fn status_of(url: &str) -> u16 {
    match reqwest::get(url).await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

async fn rest(client: &reqwest::Client, method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = client.request(method, url).bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    match request.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// A DataFlow review as the API server sends it to the webhook.
fn review() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "4b1c9d2e-0000-4000-8000-000000000042",
            "kind": {"group": "dataflow.dataflow.io", "version": "v1", "kind": "DataFlow"},
            "resource": {"group": "dataflow.dataflow.io", "version": "v1", "resource": "dataflows"},
            "name": "copy", "namespace": NS, "operation": "CREATE", "userInfo": {"username": "alice"},
            "object": {"apiVersion": "dataflow.dataflow.io/v1", "kind": "DataFlow",
                       "metadata": {"name": "copy", "namespace": NS},
                       "spec": {"source": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "in"}},
                                "sink": {"type": "kafka", "config": {"brokers": ["k:9092"], "topic": "out"}}}},
            "dryRun": false
        }
    })
}

async fn leader(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt("sless-operator").await.ok()??.spec?.holder_identity
}

#[tokio::test]
async fn the_real_controllers_reconcile_over_http_survive_redis_and_fail_over() {
    sless_runtime::tls::install_default_provider();
    let cluster = KubeApi::start().await;
    let dir = TempDir::new("kube-wire");
    cluster.write_kubeconfig(&dir.0.join("kubeconfig"));
    let mut redis = RedisServer::start();
    let ca = Ca::new("webhook test CA");
    let (cert, key) = ca.issue(&["localhost"], &[]);
    let (cert_path, key_path) = (dir.0.join("webhook.pem"), dir.0.join("webhook.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    let (cert_path, key_path) = (cert_path.to_str().unwrap(), key_path.to_str().unwrap());
    let mut replicas = [
        Replica::start("replica-1", &dir, &redis.url(), cert_path, key_path),
        Replica::start("replica-2", &dir, &redis.url(), cert_path, key_path),
    ];
    for r in &replicas {
        let ready = format!("{}/readyz", r.probes);
        eventually(Duration::from_secs(30), "a replica is ready", || async {
            status_of(&ready).await == 200
        })
        .await;
    }
    let kube = kube::Client::try_from(kube::Config::new(cluster.url().parse().unwrap())).unwrap();
    let leases: Api<Lease> = Api::namespaced(kube.clone(), "sless-system");
    eventually(Duration::from_secs(20), "one replica leads", || async {
        leader(&leases).await.is_some()
    })
    .await;
    let http = reqwest::Client::new();

    // A QueueService through REST: a custom resource, reconciled by the
    // leader's controller, which applies the engine's StatefulSet.
    let created = rest(
        &http,
        reqwest::Method::POST,
        &format!("{}/api/v1/queue-services", replicas[0].api),
        Some(json!({"name": "main"})),
    )
    .await;
    assert_eq!(created.0, 201, "{created:?}");
    let sets: Api<StatefulSet> = Api::namespaced(kube.clone(), NS);
    eventually(
        Duration::from_secs(20),
        "the engine's StatefulSet is applied",
        || async { sets.get_opt("sqs").await.ok().flatten().is_some() },
    )
    .await;
    // The StatefulSet controller's part: the engine's pods of this template
    // run (three, Kubernetes' default).
    let set = sets.get("sqs").await.unwrap();
    assert_eq!(set.spec.and_then(|s| s.replicas), Some(3));
    sets.patch_status(
        "sqs",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "observedGeneration": set.metadata.generation, "replicas": 3, "updatedReplicas": 3,
            "availableReplicas": 3, "readyReplicas": 3,
            // Every pod runs the current template.
            "currentRevision": "sqs-1", "updateRevision": "sqs-1"
        }})),
    )
    .await
    .unwrap();
    // The API server's part: the engine's Service gets its address, which
    // the route publisher hands the gateways (none run here, so none is
    // waited for before the QueueService is marked routed).
    let services: Api<Service> = Api::namespaced(kube.clone(), NS);
    services
        .patch(
            "sqs-svc-acme",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.0.10"}})),
        )
        .await
        .unwrap();
    let view_url = format!("{}/api/v1/queue-services/main", replicas[1].api);
    let took = eventually(Duration::from_secs(20), "the QueueService turns Ready", || async {
        rest(&http, reqwest::Method::GET, &view_url, None).await.1["phase"] == "Ready"
    })
    .await;
    eprintln!("Ready through REST {took:?} after the StatefulSet became available");

    // The route publisher watches what the table is made of: the API
    // server lists nothing more while it rebuilds the table every 2 s.
    let collections = [
        "apis/sless.kube5s.ru/v1alpha1/queueservices",
        "api/v1/secrets",
        "api/v1/services",
    ];
    let before = collections.map(|c| cluster.lists(c));
    tokio::time::sleep(Duration::from_secs(7)).await;
    let after = collections.map(|c| cluster.lists(c));
    assert_eq!(before, after, "lists of {collections:?} in 7 s of steady state");

    // A child deleted by hand comes back at once: its controller watches it.
    services.delete("sqs-svc-acme", &DeleteParams::default()).await.unwrap();
    let back = eventually(Duration::from_secs(10), "the deleted Service is back", || async {
        services.get_opt("sqs-svc-acme").await.ok().flatten().is_some()
    })
    .await;
    assert!(back < Duration::from_secs(5), "back after {back:?}, not at a requeue");
    eprintln!("the deleted Service was back after {back:?}");

    // Redis down: the REST API and the webhook keep answering and every
    // replica stays ready; only the control plane's own probe says so.
    redis.kill();
    let webhook = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    for _ in 0..3 {
        for r in &replicas {
            let (listed, _) = rest(
                &http,
                reqwest::Method::GET,
                &format!("{}/api/v1/queue-services", r.api),
                None,
            )
            .await;
            assert_eq!(listed, 200, "{} lists while Redis is down", r.name);
            let answer: Value = webhook
                .post(&r.webhook)
                .json(&review())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(
                answer["response"]["allowed"], true,
                "{} reviews while Redis is down",
                r.name
            );
            assert_eq!(status_of(&format!("{}/readyz", r.probes)).await, 200, "{}", r.name);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        status_of(&format!("{}/readyz/control-plane", replicas[0].probes)).await,
        503
    );
    redis.restart();

    // The leader killed: the other replica takes the Lease when it expires
    // (15 s) and its controllers put a deleted child back.
    let first = leader(&leases).await.unwrap();
    let (dead, alive) = if first == replicas[0].name { (0, 1) } else { (1, 0) };
    replicas[dead].kill9();
    let policies: Api<NetworkPolicy> = Api::namespaced(kube.clone(), NS);
    policies
        .delete("sqs-netpol-acme", &DeleteParams::default())
        .await
        .unwrap();
    let taken = eventually(Duration::from_secs(40), "the other replica leads", || async {
        leader(&leases).await.as_deref() == Some(replicas[alive].name)
    })
    .await;
    eprintln!("the Lease changed hands {taken:?} after the leader was killed");
    eventually(
        Duration::from_secs(15),
        "the new leader puts the NetworkPolicy back",
        || async { policies.get_opt("sqs-netpol-acme").await.ok().flatten().is_some() },
    )
    .await;
    let (status, view) = rest(
        &http,
        reqwest::Method::GET,
        &format!("{}/api/v1/queue-services/main", replicas[alive].api),
        None,
    )
    .await;
    assert_eq!((status, view["phase"].as_str()), (200, Some("Ready")), "{view}");

    // The API server gone: the replica turns unready (it leaves the API's
    // and the webhook's Services) and the REST API says the platform is
    // unavailable, not a refusal.
    drop(cluster);
    let probe = format!("{}/readyz", replicas[alive].probes);
    eventually(Duration::from_secs(15), "unready without the API server", || async {
        status_of(&probe).await == 503
    })
    .await;
    let (status, body) = rest(
        &http,
        reqwest::Method::GET,
        &format!("{}/api/v1/queue-services", replicas[alive].api),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
}
