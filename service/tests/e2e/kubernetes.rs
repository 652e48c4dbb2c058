//! The production path of `sless serve` on one machine. There is no
//! kube-apiserver here: `sless_testkit::kube_api` stands in for it (the
//! route publisher's watches go over HTTP). It has no garbage collector
//! and no admission, so this test drives the QueueService reconciler by
//! calling it (as the controller would on each event) and plays the kubelet
//! and the Service controller itself: it starts a real `sless queue` for
//! each engine StatefulSet the operator writes (of one replica), reports
//! the StatefulSet available and gives the engine's Service a ClusterIP (a loopback address
//! of its own). tests/cluster runs the same path on a real cluster.
//!
//! Everything else is real: two controller replicas, each on a Tokio
//! runtime of its own (so killing one drops all its tasks and sockets at
//! once, as a dead pod would), competing for the Lease and serving the
//! worker control plane on Redis (a `redis-server` of this test, restarted
//! with its data lost); two `sless gateway` processes with SPIFFE client
//! certificates made here, over mTLS; real engines with journals; boto3.
//!
//! Over 500 lines: one scenario, the whole production path, step by step.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use sless_controlplane::config::{ControlPlaneConfig, TlsMaterial};
use sless_controlplane::identity::IdentityPolicy;
use sless_controlplane::publisher::Debounce;
use sless_controlplane::store::redis::RedisStore;
use sless_operator::config::OperatorConfig;
use sless_operator::crd::queue_service::{QueueService, QueueServiceSpec};
use sless_operator::queue_service::{self, Context};
use sless_testkit::kube_api::KubeApi;
use sless_testkit::redis::RedisServer;
use sless_testkit::tls::Ca;
use sless_testkit::{TempDir, free_port};
use tokio::sync::watch;

const TRUST_DOMAIN: &str = "sless.test";
const ENVIRONMENT: &str = "ci";
/// A finalizer of another controller, there from the start: a deleted
/// QueueService stays, marked, after the operator's cleanup.
const KEEP: &str = "example.com/keep";
const LEASE: Duration = Duration::from_secs(3);
const FAST: Debounce = Debounce {
    quiet: Duration::from_millis(50),
    max_delay: Duration::from_millis(300),
};

fn sless() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sless"));
    command
        .env("SLESS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    command
}

/// A child process killed (SIGKILL) on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until something accepts connections on `addr`.
async fn listening(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One `sless serve` replica's leader part, on a runtime of its own.
struct Replica {
    runtime: Option<tokio::runtime::Runtime>,
    address: String,
}

impl Replica {
    fn start(name: &str, client: Client, redis_port: u16, control_plane: ControlPlaneConfig) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let address = format!("https://{}", control_plane.listen);
        let identity = name.to_owned();
        runtime.spawn(async move {
            let store: Arc<dyn sless_controlplane::store::ControlStore> = Arc::new(
                RedisStore::new(
                    &format!("redis://127.0.0.1:{redis_port}"),
                    "k8s-e2e",
                    Duration::from_secs(1),
                )
                .unwrap(),
            );
            let lease = Api::<Lease>::namespaced(client.clone(), "sless-system");
            let (_keep, shutdown) = watch::channel(false);
            let _ = sless_operator::runner::lead(lease, &identity, LEASE, shutdown, move |stopped| {
                sless_operator::routes::serve_control_plane(
                    control_plane.clone(),
                    store.clone(),
                    client.clone(),
                    FAST,
                    stopped,
                )
            })
            .await;
        });
        Self {
            runtime: Some(runtime),
            address,
        }
    }

    /// As a killed pod: every task and socket gone at once, nothing released.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The cluster as far as this test plays it: the API stand-in, the operator's
/// reconciler, and the kubelet running engines.
struct Cluster {
    client: Client,
    ctx: Arc<Context>,
    dir: PathBuf,
    /// Per tenant: its engine's loopback address and process.
    engines: BTreeMap<String, (String, Option<Process>)>,
}

impl Cluster {
    fn namespace(tenant: &str) -> String {
        format!("sless-fn-{tenant}")
    }

    async fn create(&self, tenant: &str) {
        let mut qs = QueueService::new(
            "main",
            QueueServiceSpec {
                tenant_id: tenant.into(),
                memory_mb: 64,
                storage_mb: 512,
                persistence: true,
                engine: Default::default(),
                durability: Default::default(),
                // The test's kubelet runs one engine per StatefulSet.
                replicas: Some(1),
                requests_per_second: None,
                bytes_per_second: None,
            },
        );
        qs.metadata.finalizers = Some(vec![KEEP.into()]);
        Api::<QueueService>::namespaced(self.client.clone(), &Self::namespace(tenant))
            .create(&PostParams::default(), &qs)
            .await
            .unwrap();
    }

    /// One reconcile of every QueueService, as the controller would run.
    async fn reconcile(&self) {
        for qs in Api::<QueueService>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            queue_service::reconcile(Arc::new(qs), self.ctx.clone()).await.unwrap();
        }
    }

    /// Whether the route publisher marked `tenant`'s QueueService routed.
    async fn routed(&self, tenant: &str) -> bool {
        self.route(tenant).await.0 == Some(true)
    }

    /// Where the route publisher says `tenant`'s route stands: `routed`,
    /// and why it is left out.
    async fn route(&self, tenant: &str) -> (Option<bool>, Option<String>) {
        let qs = Api::<QueueService>::namespaced(self.client.clone(), &Self::namespace(tenant))
            .get("main")
            .await
            .unwrap();
        let status = qs.status.unwrap_or_default();
        (status.routed, status.route_left_out)
    }

    /// Sets `tenant`'s secret key in its Secret, as a hand edit would (as
    /// `stringData`, which the operator wrote and the stand-in keeps).
    async fn set_secret_key(&self, tenant: &str, secret_key: &str) {
        let patch = json!({"stringData": {"secretKey": secret_key}});
        Api::<Secret>::namespaced(self.client.clone(), &Self::namespace(tenant))
            .patch(
                &format!("sqs-creds-{tenant}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap();
    }

    async fn secret(&self, tenant: &str) -> BTreeMap<String, String> {
        let secret = Api::<Secret>::namespaced(self.client.clone(), &Self::namespace(tenant))
            .get(&format!("sqs-creds-{tenant}"))
            .await
            .unwrap();
        sless_operator::objects::secret_strings(secret)
    }

    /// The kubelet's part for `tenant`: runs the engine the StatefulSet
    /// describes (on its own loopback address, its volume a directory
    /// here), reports it available and gives its Service that address.
    async fn run_engine(&mut self, tenant: &str, ip: &str) {
        let ns = Self::namespace(tenant);
        let set = Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
            .get("sqs")
            .await
            .unwrap();
        let container = set.spec.unwrap().template.spec.unwrap().containers.remove(0);
        let volume = self.dir.join(format!("volume-{tenant}"));
        std::fs::create_dir_all(&volume).unwrap();
        let listen = format!("{ip}:9324");
        let args: Vec<String> = container
            .args
            .unwrap()
            .into_iter()
            .map(|a| match a.as_str() {
                "0.0.0.0:9324" => listen.clone(),
                "/data" => volume.display().to_string(),
                _ => a,
            })
            .collect();
        let token = self.secret(tenant).await["engineToken"].clone();
        let child = sless().args(&args).env("SLESS_ENGINE_TOKEN", token).spawn().unwrap();
        listening(&listen).await;
        self.engines.insert(tenant.to_owned(), (listen, Some(Process(child))));
        // A kubelet that keeps up: the report claims every generation.
        let available = json!({"status": {
            "observedGeneration": i64::MAX, "replicas": 1, "updatedReplicas": 1,
            "availableReplicas": 1, "readyReplicas": 1,
            "currentRevision": "sqs-1", "updateRevision": "sqs-1"
        }});
        Api::<StatefulSet>::namespaced(self.client.clone(), &ns)
            .patch_status("sqs", &PatchParams::default(), &Patch::Merge(&available))
            .await
            .unwrap();
        let address = json!({"spec": {"clusterIP": ip}});
        Api::<Service>::namespaced(self.client.clone(), &ns)
            .patch(
                &format!("sqs-svc-{tenant}"),
                &PatchParams::default(),
                &Patch::Merge(&address),
            )
            .await
            .unwrap();
    }

    /// kill -9 of `tenant`'s engine, then the kubelet starts it again on
    /// the same volume.
    async fn crash_engine(&mut self, tenant: &str) {
        let (listen, process) = self.engines.get_mut(tenant).unwrap();
        let mut child = process.take().unwrap();
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        let ip = listen.split(':').next().unwrap().to_owned();
        self.run_engine(tenant, &ip).await;
    }

    async fn delete(&self, tenant: &str) {
        let api = Api::<QueueService>::namespaced(self.client.clone(), &Self::namespace(tenant));
        // Marked by the API server, kept by its finalizers; the controller
        // would get the marked object from its watch.
        api.delete("main", &DeleteParams::default()).await.unwrap();
        let marked = api.get("main").await.unwrap();
        assert!(marked.metadata.deletion_timestamp.is_some());
        queue_service::reconcile(Arc::new(marked), self.ctx.clone())
            .await
            .unwrap();
        // The other controller lets it go too, and the API server removes it.
        let released = json!({"metadata": {"finalizers": []}});
        api.patch("main", &PatchParams::default(), &Patch::Merge(&released))
            .await
            .unwrap();
        assert!(api.get_opt("main").await.unwrap().is_none());
    }
}

/// Runs a boto3 round trip against `endpoint` with `keys`: create a queue,
/// send `body`, receive; prints JSON `{"ok": …}` or `{"error": code}`.
const BOTO3: &str = r#"
import json, sys, boto3, botocore.config, botocore.exceptions
endpoint, key, secret, action, queue, body = sys.argv[1:7]
sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="ru-msk-1", aws_access_key_id=key,
                   aws_secret_access_key=secret,
                   config=botocore.config.Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30))
try:
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    if action == "send":
        sqs.send_message(QueueUrl=url, MessageBody=body)
        print(json.dumps({"ok": "sent"}))
    else:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2, MaxNumberOfMessages=10)
        print(json.dumps({"ok": [m["Body"] for m in got.get("Messages", [])]}))
except botocore.exceptions.ClientError as e:
    print(json.dumps({"error": e.response["Error"]["Code"]}))
"#;

async fn boto3(gateway: &str, tenant: &str, keys: &BTreeMap<String, String>, action: &str, body: &str) -> Value {
    let mut command = Command::new("python3");
    command
        .args(["-c", BOTO3, &format!("http://{gateway}/sqs/{tenant}")])
        .args([&keys["accessKey"], &keys["secretKey"], action, "orders", body]);
    let out = tokio::task::spawn_blocking(move || command.output().expect("python3"))
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)))
}

/// Retries `check` until it holds, for at most `within`.
async fn eventually<F: std::future::Future<Output = bool>>(within: Duration, what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn control_plane_config(listen: SocketAddr, material: &TlsMaterial) -> ControlPlaneConfig {
    let identity = IdentityPolicy::Spiffe {
        trust_domain: TRUST_DOMAIN.into(),
        environment: ENVIRONMENT.into(),
    };
    let mut config = sless_testkit::cp::config(Some((material.clone(), identity)));
    config.listen = listen;
    config
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_path_routes_fences_and_survives_failures() {
    sless_runtime::tls::install_default_provider();
    let dir = TempDir::new("k8s");
    let mut redis = RedisServer::start();
    let api_server = KubeApi::start().await;
    let client = Client::try_from(kube::Config::new(api_server.url().parse().unwrap())).unwrap();
    let config = OperatorConfig {
        // Tenant namespaces are taken as provisioned.
        create_namespaces: false,
        ..OperatorConfig::default()
    };
    let mut cluster = Cluster {
        client: client.clone(),
        ctx: Arc::new(Context::new(client.clone(), config, None)),
        dir: dir.0.clone(),
        engines: BTreeMap::new(),
    };

    // The PKI: the control plane's serving certificate, one SPIFFE client
    // certificate per gateway (no key shared).
    let ca = Ca::new("sless test CA");
    let (cert, key) = ca.issue(&["localhost"], &[]);
    let material = TlsMaterial {
        cert: cert.into_bytes(),
        key: key.into_bytes(),
        client_ca: ca.pem.clone().into_bytes(),
    };
    let ca_file = write(&dir.0, "ca.pem", &ca.pem);

    let mut replicas = [
        Replica::start(
            "replica-1",
            client.clone(),
            redis.port,
            control_plane_config(format!("127.0.0.1:{}", free_port()).parse().unwrap(), &material),
        ),
        Replica::start(
            "replica-2",
            client.clone(),
            redis.port,
            control_plane_config(format!("127.0.0.1:{}", free_port()).parse().unwrap(), &material),
        ),
    ];
    let control_planes = format!("{},{}", replicas[0].address, replicas[1].address);

    let (mut gateways, mut metrics) = (Vec::new(), Vec::new());
    let spiffe = |worker: &str| format!("spiffe://{TRUST_DOMAIN}/{ENVIRONMENT}/worker/{worker}");
    for worker in ["gw-1", "gw-2"] {
        let (cert, key) = ca.issue(&[], &[&spiffe(worker)]);
        let cert = write(&dir.0, &format!("{worker}.pem"), &cert);
        let key = write(&dir.0, &format!("{worker}.key"), &key);
        let listen = format!("127.0.0.1:{}", free_port());
        let metrics_listen = format!("127.0.0.1:{}", free_port());
        let child = sless()
            .args([
                "gateway",
                "--listen",
                &listen,
                "--metrics-listen",
                &metrics_listen,
                "--control-plane",
                &control_planes,
                "--worker-id",
                worker,
            ])
            .arg("--tls-ca")
            .arg(&ca_file)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--tls-domain", "localhost"])
            .spawn()
            .unwrap();
        listening(&listen).await;
        gateways.push((listen, Process(child)));
        metrics.push(metrics_listen);
    }

    // Two tenants, each with its engine on a loopback address of its own.
    let base = 2 + (rand::random::<u8>() % 120);
    for (i, tenant) in ["a", "b"].into_iter().enumerate() {
        cluster.create(tenant).await;
        cluster.reconcile().await;
        cluster.reconcile().await;
        cluster.run_engine(tenant, &format!("127.0.0.{}", base + i as u8)).await;
    }
    cluster.reconcile().await;
    let keys_a = cluster.secret("a").await;
    let keys_b = cluster.secret("b").await;

    // boto3 through each gateway, once the leader's routes reach it; both
    // queue services are then marked routed (the REST API's Ready).
    for (gateway, _) in &gateways {
        eventually(Duration::from_secs(30), "tenant a served through a gateway", || async {
            boto3(gateway, "a", &keys_a, "send", "first").await == json!({"ok": "sent"})
        })
        .await;
    }
    for tenant in ["a", "b"] {
        eventually(Duration::from_secs(10), "the queue service marked routed", || async {
            cluster.routed(tenant).await
        })
        .await;
    }
    assert_eq!(
        boto3(&gateways[1].0, "b", &keys_b, "send", "b1").await,
        json!({"ok": "sent"})
    );

    // A route the gateways cannot use is left out alone: tenant b's Secret
    // edited by hand (its secret key emptied) takes b's route out, b's
    // QueueService says why, with a Warning Event, and a is still served.
    cluster.set_secret_key("b", "").await;
    eventually(Duration::from_secs(30), "b's route left out, and said so", || async {
        cluster.route("b").await == (Some(false), Some("an access key is empty".into()))
    })
    .await;
    assert_eq!(
        boto3(&gateways[0].0, "a", &keys_a, "send", "while b is out").await,
        json!({"ok": "sent"})
    );
    let events = Api::<Event>::namespaced(client.clone(), &Cluster::namespace("b"))
        .list(&ListParams::default())
        .await
        .unwrap();
    let left_out = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("RouteLeftOut"))
        .expect("a RouteLeftOut Event on b's QueueService");
    assert_eq!(left_out.type_.as_deref(), Some("Warning"));
    assert!(
        left_out
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("an access key is empty"),
        "{left_out:?}"
    );
    // Mended, the route comes back and b is routed again.
    cluster.set_secret_key("b", &keys_b["secretKey"]).await;
    eventually(Duration::from_secs(30), "b routed again", || async {
        cluster.route("b").await == (Some(true), None)
    })
    .await;
    assert_eq!(
        boto3(&gateways[1].0, "b", &keys_b, "send", "b2").await,
        json!({"ok": "sent"})
    );

    // Keys are checked: another tenant's keys and made-up keys are refused.
    let mut forged = keys_a.clone();
    forged.insert("secretKey".into(), "bm90IHRoZSBzZWNyZXQ=".into());
    for (keys, what) in [(&keys_b, "tenant b's keys on tenant a"), (&forged, "a wrong secret")] {
        let refused = boto3(&gateways[0].0, "a", keys, "send", "x").await;
        assert!(refused.get("error").is_some(), "{what} refused: {refused}");
    }
    // The gateway counts tenant a's requests by action and outcome on its
    // internal /metrics; tenant b's keys sent to /sqs/a name no tenant, so
    // they add no series.
    let text = reqwest::get(format!("http://{}/metrics", metrics[0]))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"sless_gateway_requests_total{tenant="a",action="SendMessage",outcome="ok"}"#,
        // The forged secret fails at the script's first call, CreateQueue.
        r#"sless_gateway_requests_total{tenant="a",action="CreateQueue",outcome="auth_failed"}"#,
        r#"sless_gateway_request_duration_seconds_count{tenant="a"}"#,
        r#"sless_gateway_received_bytes_total{tenant="a"}"#,
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
    assert!(!text.contains(r#"tenant="b""#), "{text}");
    // An engine refuses whoever lacks its token (the gateway has it).
    let engine_a = cluster.engines["a"].0.clone();
    let direct = reqwest::Client::new()
        .post(format!("http://{engine_a}/"))
        .header("x-amz-target", "AmazonSQS.ListQueues")
        .header("content-type", "application/x-amz-json-1.0")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status().as_u16(), 403);

    // cert-manager renews gw-1's identity with a new key in place: its next
    // connection (after the failover below) must use the new files.
    let (cert, key) = ca.issue(&[], &[&spiffe("gw-1")]);
    write(&dir.0, "gw-1.pem", &cert);
    write(&dir.0, "gw-1.key", &key);

    // kill -9 of the leading replica: the other takes the Lease, claims a
    // new epoch and serves; traffic flows all along.
    let leader = Api::<Lease>::namespaced(client.clone(), "sless-system")
        .get(sless_operator::runner::LEASE_NAME)
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let index = usize::from(leader == "replica-2");
    replicas[index].kill();
    assert_eq!(
        boto3(&gateways[0].0, "a", &keys_a, "send", "during failover").await,
        json!({"ok": "sent"})
    );

    // Redis dies and comes back empty: gateways keep serving from their
    // tables meanwhile.
    redis.kill();
    assert_eq!(
        boto3(&gateways[1].0, "a", &keys_a, "send", "after redis").await,
        json!({"ok": "sent"})
    );
    redis.restart();

    // The engine's journal survives kill -9.
    cluster.crash_engine("a").await;
    let received = boto3(&gateways[0].0, "a", &keys_a, "receive", "").await;
    let bodies: Vec<&str> = received["ok"]
        .as_array()
        .unwrap_or_else(|| panic!("{received}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for body in ["first", "during failover", "after redis"] {
        assert!(bodies.contains(&body), "{body} survived: {received}");
    }

    // Deleting tenant b's QueueService: the new leader, on the restarted
    // Redis, takes its route away from both gateways within seconds.
    cluster.delete("b").await;
    for (gateway, _) in &gateways {
        eventually(Duration::from_secs(30), "tenant b's keys refused", || async {
            boto3(gateway, "b", &keys_b, "send", "late")
                .await
                .get("error")
                .is_some()
        })
        .await;
    }
    // …and tenant a is still served.
    assert_eq!(
        boto3(&gateways[1].0, "a", &keys_a, "send", "still").await,
        json!({"ok": "sent"})
    );
    // A gateway that stops answering is waited for until its session's
    // TTL (35 s) passes: a new queue service served by the other one is
    // not marked routed meanwhile. Every look at `routed` is judged by the
    // time since the gateway stopped (taken after the look, so a slow
    // machine cannot make a correct mark look early).
    let session_ttl = Duration::from_secs(35);
    drop(gateways.pop());
    let stopped = Instant::now();
    cluster.create("c").await;
    cluster.reconcile().await;
    cluster.reconcile().await;
    cluster.run_engine("c", &format!("127.0.0.{}", base + 2)).await;
    let keys_c = cluster.secret("c").await;
    let not_marked_early = async || {
        let routed = cluster.routed("c").await;
        let since = stopped.elapsed();
        assert!(
            !routed || since >= session_ttl,
            "marked routed {since:?} after a gateway stopped, before its session's TTL passed"
        );
    };
    eventually(
        Duration::from_secs(30),
        "tenant c served through the live gateway",
        || async {
            not_marked_early().await;
            boto3(&gateways[0].0, "c", &keys_c, "send", "c1").await == json!({"ok": "sent"})
        },
    )
    .await;
    for _ in 0..6 {
        not_marked_early().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    drop(replicas);
    assert!(
        Api::<QueueService>::all(client)
            .list(&ListParams::default())
            .await
            .unwrap()
            .iter()
            .all(|q| q.name_any() == "main" && q.spec.tenant_id != "b")
    );
}
