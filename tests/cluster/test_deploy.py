"""deploy/ as a platform team installs it, on the real cluster: `kubectl
apply -k` (through tests/cluster/deploy, which only swaps the image tag, the
cluster's networks and the public ACME issuer), cert-manager issuing every
certificate and injecting the webhook's CA, `sless serve` and the gateways
as pods. Then a tenant's whole path: Terraform against the API Service,
boto3 through the gateways, the engine's three replicas each on its volume,
the webhook called by the API server, and faults an operator meets: the
leading replica's pod force-deleted under a producer, a rolling update of
the replicas and a rolling restart of every platform Deployment under load.

The host reaches Services by their cluster addresses (kube-proxy's rules);
Redis and PostgreSQL run on the host, reached by the pods through
forwarders on the cluster bridge's address."""

import datetime
import hashlib
import json
import re
import subprocess
import threading
import time
import uuid

import boto3
import botocore.config
import pytest
import requests

from tests.conftest import REGION, TOKENS
from tests.cluster.conftest import BRIDGE, ROOT, forward, psql, reaches, stop, wait_for
from tests.terraform_cli import QUEUE, Terraform

OVERLAY = ROOT / "tests" / "cluster" / "deploy"
# A Redis database of its own: the host's Redis serves other tests too.
REDIS_DB = 11
SYSTEM = "sless-system"
PLATFORM_DEPLOYMENTS = ("sless-operator", "sless-gateway-a", "sless-gateway-b")


class Platform:
    def __init__(self, cluster):
        self.cluster = cluster
        ip = lambda svc: cluster.kubectl("-n", SYSTEM, "get", "service", svc,
                                         "-o", "jsonpath={.spec.clusterIP}").stdout
        self.api = f"http://{ip('sless-api')}"
        self.gateway = f"http://{ip('sless-gateway')}:9324"

    def rest(self, tenant, method, path, body=None, timeout=30):
        return requests.request(method, f"{self.api}/api/v1{path}", json=body, timeout=timeout,
                                headers={"Authorization": f"Bearer {TOKENS[tenant]}"})

    def sqs(self, view, retries=None):
        """boto3 at the gateway Service, with the keys of a queue service's
        view (REST or Terraform outputs)."""
        path = view["endpoint"].split("://", 1)[1].split("/", 1)[1]
        config = botocore.config.Config(retries=retries or {"mode": "standard"}, connect_timeout=5, read_timeout=20)
        return boto3.client("sqs", endpoint_url=f"{self.gateway}/{path}", region_name=REGION,
                            aws_access_key_id=view["accessKey"], aws_secret_access_key=view["secretKey"],
                            config=config)

    def terraform(self, tenant):
        """The Terraform CLI against the API Service, as `tenant`."""
        return Terraform(self.api, TOKENS[tenant], timeout=600)

    def logs(self):
        out = []
        for deployment in PLATFORM_DEPLOYMENTS:
            done = self.cluster.kubectl("-n", SYSTEM, "logs", f"deployment/{deployment}", "--tail=40", check=False)
            out.append(f"--- {deployment}\n{done.stdout}{done.stderr}")
        return "\n".join(out)


def secrets(cluster):
    tenants = "".join(f'[[tenant]]\nid = "{t}"\ntoken_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
                      for t, token in TOKENS.items())
    for name, key, value in (("sless-redis", "url", f"redis://{BRIDGE}:6379/{REDIS_DB}"),
                             ("sless-tenants", "tenants.toml", tenants)):
        made = cluster.kubectl("-n", SYSTEM, "create", "secret", "generic", name, f"--from-literal={key}={value}",
                               "--dry-run=client", "-o", "json").stdout
        cluster.kubectl("apply", "-f", "-", input=made)


@pytest.fixture(scope="module")
def platform(cluster, sless_image):
    forwarders = [forward(6379, 6379), forward(5432, 5432)]
    try:
        subprocess.run(["redis-cli", "-n", str(REDIS_DB), "FLUSHDB"], check=True, capture_output=True)
        cluster.kubectl("create", "namespace", SYSTEM, check=False)
        secrets(cluster)
        started = time.time()
        cluster.kubectl("apply", "-k", str(OVERLAY))
        cluster.kubectl("-n", SYSTEM, "wait", "--for=condition=Ready", "certificate", "--all", "--timeout=120s")
        for deployment in PLATFORM_DEPLOYMENTS:
            cluster.kubectl("-n", SYSTEM, "rollout", "status", f"deployment/{deployment}", "--timeout=300s")
        wait_for("cert-manager's CA in the webhook configuration", lambda: cluster.kubectl(
            "get", "validatingwebhookconfiguration", "sless-dataflow",
            "-o", "jsonpath={.webhooks[*].clientConfig.caBundle}").stdout.strip(), 60)
        platform = Platform(cluster)
        print(f"deploy/ applied and Ready in {time.time() - started:.0f} s")
        yield platform
    finally:
        remove(cluster)
        for forwarder in forwarders:
            stop(forwarder)


def remove(cluster):
    """Tenants' objects first (their finalizers need the operator), then
    the platform, so that later modules' own `sless serve` holds the Lease
    and no webhook answers for a Service with no pods."""
    for kind in ("dataflows.dataflow.dataflow.io", "queueservices.sless.kube5s.ru"):
        cluster.kubectl("delete", kind, "--all", "--all-namespaces", "--timeout=120s", check=False)
    cluster.kubectl("delete", "validatingwebhookconfiguration", "sless-dataflow", check=False)
    # Foreground: done once the pods are gone too. A Deployment deleted in
    # the background leaves its pods running for a while, and an operator
    # pod still leading reconciled the next module's DataFlows beside that
    # module's own `sless serve`, flipping their processors' Deployments
    # (their pods were gone when the test looked for one).
    cluster.kubectl("-n", SYSTEM, "delete", "deployment", *PLATFORM_DEPLOYMENTS, "--cascade=foreground",
                    "--wait=true", "--timeout=120s", check=False)
    for name in ("sless-operator", "sless-gateway"):
        cluster.kubectl("-n", SYSTEM, "wait", "--for=delete", "pod", "-l", f"app.kubernetes.io/name={name}",
                        "--timeout=120s", check=False)
    cluster.kubectl("-n", SYSTEM, "delete", "lease", "sless-operator", check=False)


@pytest.fixture(scope="module")
def queue_service(platform):
    """Tenant a's queue service, ordered with `terraform apply`: its view."""
    tf = platform.terraform("a")
    # A pod on a volume: more room to start than `sless dev` needs.
    tf.write((QUEUE % ("main", 128)).replace('create = "2m"', 'create = "5m"'))
    tf.apply()
    out = {name: output["value"] for name, output in tf.outputs().items()}
    view = {"endpoint": out["endpoint"], "accessKey": out["access_key"], "secretKey": out["secret_key"], "tf": tf}
    # The tenant's first call, the moment apply returns, without the SDK's
    # retries: Ready waits until every gateway routes the queue service.
    try:
        platform.sqs(view, retries={"total_max_attempts": 1}).list_queues()
        view["first_call"] = "ok"
    except Exception as e:  # judged by the test, with the reason
        view["first_call"] = repr(e)
    yield view
    tf.remove()


def engine_pods(cluster):
    """Tenant a's engine pods not being deleted, by name."""
    pods = json.loads(cluster.kubectl("-n", "sless-fn-a", "get", "pods", "-l",
                                      "app.kubernetes.io/name=sqs,app.kubernetes.io/instance=a",
                                      "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}


def ready(pod):
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def raft_status(cluster, pod):
    """What replica `pod` knows of its queue service (its peer port's
    /raft/status, asked from inside the pod with its own peer token): None
    when it does not answer."""
    script = ('exec 3<>/dev/tcp/127.0.0.1/9325 && printf "GET /raft/status HTTP/1.1\\r\\nHost: x\\r\\n'
              'Connection: close\\r\\nx-sless-peer-token: %s\\r\\n\\r\\n" "$SLESS_PEER_TOKEN" >&3 && cat <&3')
    done = cluster.kubectl("-n", "sless-fn-a", "exec", pod, "--", "bash", "-c", script, check=False)
    # kubectl's output is read as text: its line ends are "\n" by then.
    head, _, body = done.stdout.replace("\r\n", "\n").partition("\n\n")
    if done.returncode != 0 or " 200 " not in head.split("\n", 1)[0]:
        return None
    return json.loads(body)


def settled_leader(cluster, pods=("sqs-1", "sqs-2", "sqs-3")):
    """The pod of the leader every replica names, once all three are voters
    of a settled membership."""
    statuses = [raft_status(cluster, p) for p in pods]
    if any(s is None or s["voters"] != [1, 2, 3] or s["joint"] for s in statuses):
        return None
    leaders = {s["leader"] for s in statuses}
    return f"sqs-{leaders.pop()}" if len(leaders) == 1 and None not in leaders else None


def test_deploy_comes_up_with_its_certificates_and_serves_the_api(platform):
    """Every platform pod runs as 65532 from the image; the REST API answers
    through its Service; the gateways hold a routing table (their readiness)."""
    cluster = platform.cluster
    pods = json.loads(cluster.kubectl("-n", SYSTEM, "get", "pods", "-o", "json").stdout)["items"]
    assert len([p for p in pods if p["status"]["phase"] == "Running"]) == 4, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        assert pod["spec"]["containers"][0]["image"] == "ghcr.io/kube5s/sless:test"
    listed = platform.rest("a", "GET", "/queue-services")
    assert listed.status_code == 200, listed.text
    assert platform.rest("a", "GET", "/queue-services", timeout=10).json() == listed.json()
    unknown = requests.get(f"{platform.api}/api/v1/queue-services", headers={"Authorization": "Bearer nope-nope"},
                           timeout=10)
    assert unknown.status_code == 401


def test_terraform_orders_a_queue_service_that_boto3_uses_through_the_gateways(platform, queue_service):
    assert queue_service["first_call"] == "ok", f"the first call after apply: {queue_service['first_call']}"
    cluster = platform.cluster
    # Three replicas by default, each on a volume of its own.
    pods = engine_pods(cluster)
    assert sorted(pods) == ["sqs-1", "sqs-2", "sqs-3"], sorted(pods)
    for name, pod in pods.items():
        assert pod["spec"]["securityContext"]["runAsUser"] == 65532
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [f"data-{name}"], claims
        phase = cluster.kubectl("-n", "sless-fn-a", "get", "pvc", claims[0], "-o", "jsonpath={.status.phase}").stdout
        assert phase == "Bound"
    assert wait_for("the replicas settled on a leader", lambda: settled_leader(cluster), 60)
    sqs = platform.sqs(queue_service)
    url = sqs.create_queue(QueueName="orders")["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
    got = []
    while len(got) < 3:
        for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2).get("Messages", []):
            got.append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert sorted(got) == ["m0", "m1", "m2"]
    plan = queue_service["tf"].run("plan", "-detailed-exitcode", check=False)
    assert plan.returncode == 0, f"a second plan changes nothing:\n{plan.stdout}"


def test_only_the_gateways_reach_a_tenants_engine(platform, queue_service):
    """The engine's NetworkPolicy, enforced by the cluster's network
    (kube-network-policies): neither a pod of another namespace nor a
    platform pod that is not a gateway opens a connection to the engine.
    The gateways do: every boto3 call here goes through them."""
    cluster = platform.cluster
    ip = engine_pods(cluster)["sqs-1"]["status"]["podIP"]
    # Neither the SQS port nor the replicas' peer port.
    targets = [f"{ip}:9324", f"{ip}:9325"]
    for namespace in ("default", SYSTEM):
        lines = reaches(cluster, namespace, f"probe-{uuid.uuid4().hex[:8]}", targets)
        assert lines == ["dns"], (namespace, lines)


def drain(sqs, url, wanted, within=120):
    """Receives and deletes until every body of `wanted` came (sends whose
    outcome was unknown may have been stored too): every body received."""
    got = set()
    deadline = time.time() + within
    while not set(wanted) <= got and time.time() < deadline:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1).get("Messages", [])
        for m in batch:
            got.add(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return got


def engine_logs(cluster, since):
    """What the engine pods logged above INFO (and their stops), each with
    when it started relative to `since`: for a failure's message."""
    logs = []
    for pod in sorted(engine_pods(cluster)):
        log = cluster.kubectl("-n", "sless-fn-a", "logs", pod, check=False).stdout
        started = cluster.kubectl("-n", "sless-fn-a", "get", "pod", pod, "-o", "jsonpath={.status.startTime}").stdout
        at = datetime.datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() - since
        kept = [line for line in log.splitlines() if " INFO " not in line or "stopping" in line]
        logs.append(f"--- {pod} (started {at:+.1f} s)\n" + "\n".join(kept)[-3000:])
    return "\n".join(logs)


class Producer:
    """Sends numbered messages through the gateways with the SDK's default
    retries, recording each send's outcome: acknowledged, or failed (its
    fate unknown: it may still have been stored)."""

    def __init__(self, sqs, url, prefix):
        self.sqs, self.url, self.prefix = sqs, url, prefix
        self.acked, self.failed = [], []
        self.acked_at = []
        self.took = []  # (started, seconds) of each send, SDK retries included
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        i = 0
        while not self.stop.is_set():
            body = f"{self.prefix}{i}"
            started = time.time()
            try:
                self.sqs.send_message(QueueUrl=self.url, MessageBody=body)
                self.took.append((started, time.time() - started))
                self.acked.append(body)
                self.acked_at.append(time.time())
            except Exception as e:  # recorded: the checker decides
                self.failed.append(f"{body}: {e}")
            i += 1
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def slowest(self, since, n=3):
        """The `n` slowest acknowledged sends: when each began (seconds
        after `since`) and how long it took."""
        return [f"+{start - since:.1f}s took {took:.2f}s" for start, took in sorted(self.took, key=lambda t: -t[1])[:n]]

    def longest_pause_after(self, at):
        """The longest time between two acknowledgements from `at` on (a
        send in flight when the fault came may be acknowledged just after)."""
        times = [at] + [t for t in self.acked_at if t > at]
        return max((b - a for a, b in zip(times, times[1:])), default=None)


def test_force_deleting_the_leader_pod_under_a_producer_loses_no_acknowledged_message(platform, queue_service):
    """`kubectl delete pod --force --grace-period=0` of the replica that
    leads, while a producer sends: the StatefulSet makes the pod again on
    its volume and it rejoins (leading again if it is back before the other
    two elected one). Every acknowledged send is received afterwards; the
    longest pause in acknowledgements is printed."""
    cluster = platform.cluster
    sqs = platform.sqs(queue_service)
    # A name of this run: a queue service made again keeps its claims, and
    # with them the queues of before (seed 000).
    url = sqs.create_queue(QueueName=f"kept-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    leader = wait_for("the replicas settled on a leader", lambda: settled_leader(cluster), 60)
    term = raft_status(cluster, leader)["term"]
    uid = engine_pods(cluster)[leader]["metadata"]["uid"]
    with Producer(sqs, url, "k") as producer:
        time.sleep(3)
        deleted_at = time.time()
        cluster.kubectl("-n", "sless-fn-a", "delete", "pod", leader, "--force", "--grace-period=0")
        wait_for("the deleted replica back and the three settled", lambda: (
            (pods := engine_pods(cluster)).keys() == {"sqs-1", "sqs-2", "sqs-3"}
            and all(ready(p) for p in pods.values()) and settled_leader(cluster)), 240)
        time.sleep(2)
    pause = producer.longest_pause_after(deleted_at)
    now_leader = settled_leader(cluster)
    now_term = raft_status(cluster, now_leader)["term"]
    print(f"leader {leader} (term {term}) force-deleted: {len(producer.acked)} sends acknowledged, "
          f"{len(producer.failed)} failed, longest pause in acknowledgements {pause:.2f} s, "
          f"leader now {now_leader} (term {now_term}); failures: {producer.failed[:3]}")
    # openraft restores a replica that led to leadership at its start, in
    # the same term, if no other was elected meanwhile: the pod made again
    # on the same node may be back before an election ends.
    assert engine_pods(cluster)[leader]["metadata"]["uid"] != uid, "the pod was not replaced"
    assert producer.acked_at[-1] > deleted_at, "no send was acknowledged after the leader was deleted"
    got = drain(sqs, url, producer.acked, within=180)
    lost = set(producer.acked) - got
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    # A failed send's fate is unknown: stored or not, never anything else.
    assert got <= set(producer.acked) | {f.split(":", 1)[0] for f in producer.failed}


def test_a_rolling_update_of_the_replicas_under_a_producer_loses_nothing(platform, queue_service):
    """`kubectl rollout restart` of the engine's StatefulSet replaces its
    three pods one at a time, each waiting for the one before to be Ready
    (a voter that knows its leader) again, so a majority always runs. The
    SDK retries as it does by default. No call fails: a stopping leader
    hands its leadership over, each stopping replica serves on until the
    Service's endpoints dropped it, then closes the gateways' links
    answering what it did not run "closing", which they send again on a new
    link. Every acknowledged send arrives; the longest pause is printed."""
    cluster = platform.cluster
    sqs = platform.sqs(queue_service)
    url = sqs.create_queue(QueueName=f"rolled-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    wait_for("the replicas settled on a leader", lambda: settled_leader(cluster), 60)
    with Producer(sqs, url, "u") as producer:
        time.sleep(2)
        restarted_at = time.time()
        cluster.kubectl("-n", "sless-fn-a", "rollout", "restart", "statefulset/sqs")
        cluster.kubectl("-n", "sless-fn-a", "rollout", "status", "statefulset/sqs", "--timeout=300s")
        time.sleep(3)
    print(f"rolling update of the replicas: {len(producer.acked)} sends acknowledged, {len(producer.failed)} failed; "
          f"longest pause in acknowledgements {producer.longest_pause_after(restarted_at):.2f} s; "
          f"slowest sends {producer.slowest(restarted_at)}")
    assert not producer.failed, \
        f"{len(producer.failed)} sends failed, first: {producer.failed[:5]}\n{engine_logs(cluster, restarted_at)}"
    got = drain(sqs, url, producer.acked, within=180)
    assert got == set(producer.acked), f"{len(set(producer.acked) - got)} acknowledged messages lost"


def test_a_rolling_restart_of_the_platform_under_load_fails_no_call(platform, queue_service):
    """A producer through the gateways and a reader of the REST API run
    while `kubectl rollout restart` replaces sless serve's two replicas and
    each gateway. The SDK retries as it does by default (standard mode);
    what still fails is counted and must be none, and every acknowledged
    message arrives."""
    cluster = platform.cluster
    sqs = platform.sqs(queue_service)
    url = sqs.create_queue(QueueName="rolling")["QueueUrl"]
    stop = threading.Event()
    sent, failures, rest_calls = [], [], [0]

    def produce():
        i = 0
        while not stop.is_set():
            try:
                sqs.send_message(QueueUrl=url, MessageBody=f"r{i}")
                sent.append(f"r{i}")
            except Exception as e:  # counted: each is a failed call
                failures.append(f"send r{i}: {e}")
            i += 1
            time.sleep(0.02)

    def read_api():
        while not stop.is_set():
            try:
                answer = platform.rest("a", "GET", "/queue-services/main", timeout=10)
                if answer.status_code != 200:
                    failures.append(f"GET /queue-services/main: {answer.status_code} {answer.text[:200]}")
            except requests.RequestException as e:
                failures.append(f"GET /queue-services/main: {e}")
            rest_calls[0] += 1
            time.sleep(0.1)

    workers = [threading.Thread(target=produce), threading.Thread(target=read_api)]
    for w in workers:
        w.start()
    try:
        time.sleep(2)
        for deployment in PLATFORM_DEPLOYMENTS:
            cluster.kubectl("-n", SYSTEM, "rollout", "restart", f"deployment/{deployment}")
            cluster.kubectl("-n", SYSTEM, "rollout", "status", f"deployment/{deployment}", "--timeout=300s")
        time.sleep(5)
    finally:
        stop.set()
        for w in workers:
            w.join()
    print(f"rolling restart: {len(sent)} sends and {rest_calls[0]} API reads, {len(failures)} failed")
    assert not failures, f"{len(failures)} calls failed, first: {failures[:5]}\n{platform.logs()}"
    got = drain(sqs, url, sent)
    assert got == set(sent), f"{len(set(sent) - got)} acknowledged messages lost"


def test_the_api_server_calls_the_webhook_which_refuses_another_namespaces_secret(platform):
    """kubectl goes through the API server, which calls the webhook (its
    certificate from cert-manager, its CA injected); the REST API refuses
    the same spec with the same reason."""
    cluster = platform.cluster
    name = f"cross-{uuid.uuid4().hex[:6]}"
    flow = {
        "apiVersion": "dataflow.dataflow.io/v1", "kind": "DataFlow",
        "metadata": {"name": name, "namespace": "sless-fn-a"},
        "spec": {
            "source": {"type": "postgresql", "config": {
                "table": "t", "connectionStringSecretRef": {"name": "dsn", "namespace": "sless-fn-b", "key": "dsn"}}},
            "sink": {"type": "postgresql", "config": {"table": "u", "connectionString": "postgres://x@y/z"}},
        },
    }
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(flow), check=False)
    assert refused.returncode != 0
    # The webhook's own words (the CRD's schema cannot say them), as the
    # Invalid status it answers with.
    reason = "a secret reference must stay in the namespace sless-fn-a (it names sless-fn-b)"
    assert f"The request is invalid: spec.source.config.connectionStringSecretRef: {reason}" in refused.stderr, \
        refused.stderr
    body = {"name": name, "source": flow["spec"]["source"], "sink": flow["spec"]["sink"]}
    answer = platform.rest("a", "POST", "/dataflows", body)
    assert answer.status_code == 422 and reason in answer.text, answer.text


WRONG_PASSWORD_FLOW = """
resource "sless_dataflow" "wrong" {
  name   = "wrong-password"
  source = { type = "postgresql", config = jsonencode({
    connectionString = "postgres://sless_password:wrong@%(pg)s/test", table = "%(table)s" }) }
  sink   = { type = "postgresql", config = jsonencode({
    connectionString = "postgres://postgres@%(pg)s/test", table = "%(table)s_copy", autoCreateTable = true }) }
}
"""


def test_a_wrong_password_shows_its_reason_in_rest_and_in_terraform_within_30_s(platform):
    psql("DO $$BEGIN CREATE ROLE sless_password LOGIN PASSWORD 'right'; "
         "EXCEPTION WHEN duplicate_object THEN NULL; END$$")
    table = f"wrong_{uuid.uuid4().hex[:6]}"
    psql(f"CREATE TABLE {table} (id serial PRIMARY KEY)")
    tf = platform.terraform("a")
    try:
        tf.write(WRONG_PASSWORD_FLOW % {"pg": f"{BRIDGE}:5432", "table": table})
        started = time.time()
        applied = tf.apply()
        took = time.time() - started
        print(f"the wrong password's reason reached terraform in {took:.1f} s")
        assert 'password authentication failed for user "sless_password"' in applied.stdout + applied.stderr, \
            applied.stdout + applied.stderr
        assert took < 30
        view = platform.rest("a", "GET", "/dataflows/wrong-password").json()
        assert view["phase"] == "Error" and "password authentication failed" in view["message"], view
        shown = tf.run("plan", "-refresh-only")
        assert "password authentication failed" in tf.run("show").stdout, shown.stdout
        tf.run("destroy", "-auto-approve")
    finally:
        tf.remove()
        psql(f"DROP TABLE IF EXISTS {table}, {table}_copy")


def test_deleting_a_queue_service_removes_its_children(platform, queue_service):
    """Through `terraform destroy`: the operator's finalizer runs and the
    cluster's garbage collector removes the engine's objects, all but the
    volume of its messages."""
    cluster = platform.cluster
    kinds = "statefulset,service,secret,configmap,persistentvolumeclaim,networkpolicy,poddisruptionbudget"
    owned = lambda: [o for o in json.loads(cluster.kubectl("-n", "sless-fn-a", "get", kinds, "-o", "json").stdout)[
        "items"] if any(r.get("kind") == "QueueService" for r in o["metadata"].get("ownerReferences", []))]
    before = owned()
    assert {o["kind"] for o in before} >= {"StatefulSet", "Service", "Secret", "NetworkPolicy",
                                          "PodDisruptionBudget"}, [o["kind"] for o in before]
    queue_service["tf"].run("destroy", "-auto-approve")
    wait_for("every child of the queue service removed", lambda: not owned(), 120)
    assert platform.rest("a", "GET", "/queue-services/main").status_code == 404
    # The messages' volume has no owner on purpose: it stays until the
    # platform's operator deletes it (docs/kubernetes.md).
    claims = cluster.kubectl("-n", "sless-fn-a", "get", "pvc", "-o", "name").stdout.split()
    assert claims == [f"persistentvolumeclaim/data-sqs-{i}" for i in (1, 2, 3)], claims


DOCS = ROOT / "docs" / "kubernetes.md"


def permissions(cluster, account, namespace):
    """What `kubectl auth can-i --list` grants `account` in `namespace`,
    beyond what every authenticated account may do: rows of (resource,
    resource names, verbs)."""
    def rows(who):
        listed = cluster.kubectl("auth", "can-i", "--list", f"--as={who}", "-n", namespace).stdout
        found = set()
        for line in listed.splitlines()[1:]:
            # Resources, Non-Resource URLs, Resource Names, Verbs
            row = re.match(r"^(\S*)\s+\[(.*?)\]\s+\[(.*?)\]\s+\[(.*?)\]\s*$", line)
            if row and row[1]:
                found.add((row[1], row[3], row[4]))
        return found
    return rows(account) - rows("system:serviceaccount:default:nobody")


def documented(section):
    """The rows of the table under `<!-- rbac: section -->` in docs/kubernetes.md."""
    text = DOCS.read_text()
    marker = f"<!-- rbac: {section} -->"
    rows = set()
    if marker not in text:
        return rows
    for line in text.split(marker, 1)[1].lstrip().splitlines()[2:]:
        if not line.startswith("|"):
            break
        resource, names, verbs = (c.strip().strip("`") for c in line.strip("|").split("|"))
        rows.add((resource, names, verbs))
    return rows


def test_each_service_account_may_do_what_the_docs_table_says_and_no_more(platform):
    cluster = platform.cluster
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    flow = {"name": name, "checkpointPersistence": True,
            "source": {"type": "postgresql", "config": {"connectionString": f"postgres://postgres@{BRIDGE}/test",
                                                         "table": "absent"}},
            "sink": {"type": "postgresql", "config": {"connectionString": f"postgres://postgres@{BRIDGE}/test",
                                                       "table": "absent_copy"}}}
    assert platform.rest("a", "POST", "/dataflows", flow).status_code == 201
    try:
        processor = f"dataflow-{name}-processor"
        wait_for("the processor's ServiceAccount", lambda: cluster.kubectl(
            "-n", "sless-fn-a", "get", "rolebinding", processor, check=False).returncode == 0, 60)
        accounts = {
            "sless-system/sless-operator in a tenant namespace": ("sless-system", "sless-operator", "sless-fn-a"),
            "sless-system/sless-gateway": ("sless-system", "sless-gateway", "sless-system"),
            "a processor, in its namespace": ("sless-fn-a", processor, "sless-fn-a"),
        }
        wrong = []
        for section, (ns, account, where) in accounts.items():
            granted = permissions(cluster, f"system:serviceaccount:{ns}:{account}", where)
            granted = {(r, names.replace(name, "NAME"), v) for r, names, v in granted}
            if granted != documented(section):
                rows = "\n".join(f"| `{r}` | {n} | {v} |" for r, n, v in sorted(granted))
                wrong.append(f"<!-- rbac: {section} -->\n{rows}")
        assert not wrong, "the docs' tables differ from what the accounts may do:\n" + "\n\n".join(wrong)
    finally:
        platform.rest("a", "DELETE", f"/dataflows/{name}")
