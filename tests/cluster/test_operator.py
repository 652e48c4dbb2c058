"""`sless serve` against the real API server: the operator reconciles what
the REST API stores as custom resources, and the pods it makes run on the
real kubelet from the image built from the Dockerfile.

`sless serve` itself runs on the host here (with the cluster's admin
kubeconfig), as it would in its Deployment but without the webhook and
the control plane's mTLS, which need deploy/'s cert-manager; its pods,
the tenants' processors, run in the cluster. PostgreSQL runs on the host:
the pods reach it through a forwarder on the cluster bridge's address."""

import json
import os
import pathlib
import socket
import subprocess
import time
import uuid

import pytest
import requests

from tests.conftest import BINARY, TOKENS, free_port
from tests.cluster.conftest import BRIDGE, ROOT, forward, listener, psql, reaches, stop, wait_for
from tests.nessie_server import NessieServer
from tests.trino_server import TrinoServer

SERVICES, PODS = "10.252.0.0/16", "10.251.0.0/24"
ROWS = 10_000


class Operator:
    def __init__(self, cluster, image, log=None):
        self.cluster = cluster
        self.api = f"127.0.0.1:{free_port()}"
        cmd = [
            str(BINARY), "serve",
            "--kubeconfig", cluster.env["KUBECONFIG"],
            "--redis-url", "redis://127.0.0.1:6379",
            "--redis-namespace", f"sless-cluster-{uuid.uuid4().hex[:8]}",
            "--listen", self.api,
            "--control-plane-listen", f"127.0.0.1:{free_port()}",
            "--metrics-listen", f"127.0.0.1:{free_port()}",
            "--image", image,
            "--pod-name", "host-operator",
            # The cluster's Services and Pods (scripts/cluster.sh); the
            # bridge network stands for the world outside it.
            "--cluster-network", SERVICES, "--cluster-network", PODS,
        ]
        for tenant, token in TOKENS.items():
            cmd += ["--tenant", f"{tenant}={token}"]
        output = open(log, "w") if log else None
        self.proc = subprocess.Popen(cmd, env=dict(os.environ, SLESS_LOG="info"), stdout=output, stderr=output)

    def rest(self, tenant, method, path, body=None):
        return requests.request(method, f"http://{self.api}/api/v1{path}", json=body,
                                headers={"Authorization": f"Bearer {TOKENS[tenant]}"}, timeout=60)

    def answers(self):
        assert self.proc.poll() is None, "sless serve exited"
        try:
            return self.rest("a", "GET", "/healthz-of-nothing").status_code > 0
        except requests.ConnectionError:
            return False

    def wait_up(self):
        wait_for("sless serve answering", self.answers, 60)
        wait_for("the API reading the cluster", lambda: self.rest("a", "GET", "/dataflows").status_code == 200, 60)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def quota_controller_counts_dataflows(cluster):
    """Waits until the cluster's quota controller counts DataFlows. It
    learns a new kind at its discovery resync (every 30 s), and a quota
    made before that stays uncounted until its full resync (5 min), the
    API server refusing every create it covers meanwhile (sless answers
    503): so a probe quota is made again until it is counted."""
    cluster.kubectl("create", "namespace", "quota-probe", check=False)
    probe = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "probe", "namespace": "quota-probe"},
             "spec": {"hard": {"count/dataflows.dataflow.dataflow.io": "1"}}}
    deadline = time.time() + 120
    while True:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(probe))
        for _ in range(10):
            used = cluster.kubectl("-n", "quota-probe", "get", "resourcequota", "probe",
                                   "-o", "jsonpath={.status.used}").stdout
            if "dataflows" in used:
                cluster.kubectl("delete", "namespace", "quota-probe", "--wait=false")
                return
            time.sleep(0.5)
        assert time.time() < deadline, "the quota controller never counted DataFlows"
        cluster.kubectl("-n", "quota-probe", "delete", "resourcequota", "probe")


@pytest.fixture(scope="module")
def operator(cluster, sless_image):
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build` first")
    cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    cluster.kubectl("create", "namespace", "sless-system", check=False)
    quota_controller_counts_dataflows(cluster)
    server = Operator(cluster, sless_image)
    try:
        server.wait_up()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg_on_bridge(cluster):
    """PostgreSQL at an address the pods reach: `host:port`."""
    with socket.socket() as s:
        s.bind((BRIDGE, 0))
        port = s.getsockname()[1]
    forwarder = forward(5432, port)
    try:
        yield f"{BRIDGE}:{port}"
    finally:
        stop(forwarder)


def processor_pods(cluster, name):
    pods = cluster.kubectl("-n", "sless-fn-a", "get", "pods", "-l", f"app.kubernetes.io/instance={name}",
                           "-o", "json").stdout
    return json.loads(pods)["items"]


def test_a_pg_to_pg_dataflows_processor_pod_moves_every_row_once_across_a_pod_deletion(operator, pg_on_bridge):
    """The processor pod runs as the image's user and group, not in group
    root (the kubelet takes only the user from the image), and still reads
    its spec Secret (mode 0440, owned by root: through the pod's fsGroup);
    it runs fenced and moves 10,000 rows exactly once although its pod is
    deleted midway."""
    cluster = operator.cluster
    suffix = uuid.uuid4().hex[:8]
    name, src, dst = f"pg-{suffix}", f"cluster_src_{suffix}", f"cluster_dst_{suffix}"
    psql(f"CREATE TABLE {src} (id serial PRIMARY KEY, payload text);"
         f" INSERT INTO {src} (payload) SELECT repeat('x', 200) FROM generate_series(1, {ROWS})")
    dsn = f"postgres://postgres@{pg_on_bridge}/test"
    flow = {
        "name": name,
        "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": src,
                                                     "batchSize": 100, "pollInterval": 1}},
        "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": dst, "autoCreateTable": True}},
        "channelBufferSize": 100,
    }
    created = operator.rest("a", "POST", "/dataflows", flow)
    assert created.status_code == 201, created.text

    def running():
        view = operator.rest("a", "GET", f"/dataflows/{name}").json()
        return view if view.get("phase") == "Running" else None

    try:
        wait_for("the dataflow Running", running, 180)
        pod = processor_pods(cluster, name)[0]
        spec = pod["spec"]
        pod_security = spec["securityContext"]
        assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (65532, 65532), pod_security
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        container = spec["containers"][0]["securityContext"]
        assert container["readOnlyRootFilesystem"] and container["capabilities"]["drop"] == ["ALL"], container

        # Deleted midway: its Deployment starts another, which resumes from
        # the position stored beside the rows.
        copied = lambda: int(psql(f"SELECT count(*) FROM {dst}") or 0)
        wait_for("a third of the rows", lambda: copied() >= ROWS // 3, 180)
        # The pod running now: in one CI run the pod listed at Running was
        # gone by this point (replaced once at start; not yet explained).
        live = [p for p in processor_pods(cluster, name) if not p["metadata"].get("deletionTimestamp")]
        assert len(live) == 1, [p["metadata"]["name"] for p in live]
        pod = live[0]
        cluster.kubectl("-n", "sless-fn-a", "delete", "pod", pod["metadata"]["name"], "--wait=false")
        wait_for("every row", lambda: int(psql(f"SELECT count(DISTINCT data->>'id') FROM {dst}")) == ROWS, 240)
        time.sleep(1)
        assert copied() == ROWS, "a row written twice"
        pods = processor_pods(cluster, name)
        assert pod["metadata"]["name"] not in [p["metadata"]["name"] for p in pods], "the pod was replaced"
    finally:
        assert operator.rest("a", "DELETE", f"/dataflows/{name}").status_code == 204
    # Its children go with it (the cluster's garbage collector).
    wait_for("the processor's Deployment removed",
             lambda: cluster.kubectl("-n", "sless-fn-a", "get", "deployment", f"dataflow-{name}",
                                     check=False).returncode != 0, 60)
    psql(f"DROP TABLE {src}; DROP TABLE IF EXISTS {dst}")


def test_a_cdc_processor_pod_reads_a_table_again_when_asked_through_rest(operator, pg_on_bridge):
    """A postgresql-cdc dataflow in a processor pod takes its snapshot in
    chunks and applies changes; a sink that lost rows is repaired by a
    snapshot request made through REST: the DataFlow object carries it, and
    the pod the operator starts for the new spec file reads the table again
    while the stream goes on."""
    cluster = operator.cluster
    suffix = uuid.uuid4().hex[:8]
    name, src, dst = f"cdc-{suffix}", f"cluster_cdc_src_{suffix}", f"cluster_cdc_dst_{suffix}"
    psql(f"CREATE TABLE {src} (id int PRIMARY KEY, v int);"
         f" CREATE TABLE {dst} (LIKE {src} INCLUDING ALL);"
         f" INSERT INTO {src} SELECT g, 0 FROM generate_series(1, 2000) g")
    dsn = f"postgres://postgres@{pg_on_bridge}/test"
    flow = {
        "name": name,
        "source": {"type": "postgresql-cdc", "config": {"connectionString": dsn, "table": src,
                                                         "snapshotChunkSize": 100}},
        "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": dst, "applyChanges": True}},
    }
    differ = (f"SELECT count(*) FROM ((SELECT * FROM {src} EXCEPT SELECT * FROM {dst})"
              f" UNION ALL (SELECT * FROM {dst} EXCEPT SELECT * FROM {src})) d")
    equal = lambda: int(psql(differ) or -1) == 0
    created = operator.rest("a", "POST", "/dataflows", flow)
    assert created.status_code == 201, created.text
    try:
        wait_for("the snapshot in the sink", equal, 240)
        psql(f"UPDATE {src} SET v = 1 WHERE id <= 100; DELETE FROM {dst} WHERE id % 2 = 0")
        asked = operator.rest("a", "POST", f"/dataflows/{name}/snapshots", {"tables": [src]})
        assert asked.status_code == 202, asked.text
        written = json.loads(cluster.kubectl("-n", "sless-fn-a", "get", "dataflow", name, "-o", "json").stdout)
        assert written["spec"]["snapshots"] == [asked.json()], written["spec"]
        psql(f"INSERT INTO {src} SELECT g, 2 FROM generate_series(5001, 5100) g")
        wait_for("the table read again into the sink", equal, 240)
    finally:
        assert operator.rest("a", "DELETE", f"/dataflows/{name}").status_code == 204
    wait_for("the processor's Deployment removed",
             lambda: cluster.kubectl("-n", "sless-fn-a", "get", "deployment", f"dataflow-{name}",
                                     check=False).returncode != 0, 60)
    wait_for("its replication slot dropped",
             lambda: int(psql("SELECT count(*) FROM pg_replication_slots s JOIN pg_publication_tables p"
                              f" ON p.pubname = s.slot_name WHERE p.tablename = '{src}'")) == 0, 60)
    psql(f"DROP TABLE {src}, {dst}")


@pytest.fixture(scope="module")
def lakehouse(cluster):
    """Trino and Nessie (with its S3 store) on the host, each forwarded to an
    address on the bridge the pods reach: (trino, nessie, {name: host:port})."""
    trino, nessie = TrinoServer(), NessieServer()
    forwarders, reach = [], {}
    try:
        for name, url in [("trino", trino.url), ("nessie", nessie.api_url), ("s3", nessie.s3_endpoint)]:
            port = int(url.split(":")[2].split("/")[0])
            with socket.socket() as s:
                s.bind((BRIDGE, 0))
                bridge_port = s.getsockname()[1]
            forwarders.append(forward(port, bridge_port))
            reach[name] = f"{BRIDGE}:{bridge_port}"
        trino.add_iceberg(nessie)
        yield trino, nessie, reach
    finally:
        for forwarder in forwarders:
            stop(forwarder)
        trino.stop()
        nessie.stop()


def test_trino_and_nessie_dataflows_run_in_processor_pods(operator, pg_on_bridge, lakehouse):
    """Processor pods reach Trino and Nessie (and the tables' S3 store)
    through the egress policy: PostgreSQL → Nessie exactly once (the rows
    read back by Trino's Iceberg connector, the position in the table's
    property), Trino → PostgreSQL every row."""
    trino, nessie, reach = lakehouse
    suffix = uuid.uuid4().hex[:8]
    rows = 2_000
    src, dst, namespace = f"lake_src_{suffix}", f"lake_dst_{suffix}", f"lake_{suffix}"
    psql(f"CREATE TABLE {src} (id serial PRIMARY KEY, payload text);"
         f" INSERT INTO {src} (payload) SELECT 'p' || g FROM generate_series(1, {rows}) g;"
         f" CREATE TABLE {dst} (id bigint, payload text)")
    trino.query(f"CREATE TABLE memory.default.{src} AS SELECT x AS id, 'p' || CAST(x AS varchar) AS payload"
                f" FROM UNNEST(sequence(1, {rows})) t(x)")
    dsn = f"postgres://postgres@{pg_on_bridge}/test"
    flows = [
        {"name": f"to-nessie-{suffix}",
         "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": src,
                                                      "batchSize": 250, "pollInterval": 1}},
         "sink": {"type": "nessie", "config": {
             "nessieUrl": f"http://{reach['nessie']}/api/v2", "namespace": namespace, "table": "rows",
             "autoCreateTable": True, "awsEndpointURL": f"http://{reach['s3']}", "awsRegion": "us-east-1",
             "awsAccessKeyID": "testing", "awsSecretAccessKey": "testing"}}},
        {"name": f"from-trino-{suffix}",
         "source": {"type": "trino", "config": {"serverURL": f"http://{reach['trino']}", "catalog": "memory",
                                                 "schema": "default", "table": src, "batchSize": 500,
                                                 "pollInterval": 1}},
         "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": dst}}},
    ]
    for flow in flows:
        created = operator.rest("a", "POST", "/dataflows", flow)
        assert created.status_code == 201, created.text
    try:
        in_nessie = lambda: (trino.query(f"SELECT count(*) FROM iceberg.{namespace}.rows")[0][0]
                             if trino.query(f"SHOW SCHEMAS FROM iceberg LIKE '{namespace}'")
                             and trino.query(f"SHOW TABLES FROM iceberg.{namespace}") else 0)

        def status():
            views = [operator.rest("a", "GET", f"/dataflows/{f['name']}").json() for f in flows]
            return f"{in_nessie()} rows in Nessie, {psql(f'SELECT count(*) FROM {dst}')} in PostgreSQL; " + \
                "; ".join(f"{v.get('phase')}: {v.get('message')}" for v in views)
        wait_for(status, lambda: in_nessie() == rows and int(psql(f"SELECT count(*) FROM {dst}")) == rows, 240)
        time.sleep(2)
        assert trino.query(f"SELECT count(DISTINCT json_extract_scalar(data, '$.id')) FROM iceberg.{namespace}.rows"
                           )[0][0] == rows
        doc = json.loads(trino.query(f"SELECT data FROM iceberg.{namespace}.rows LIMIT 1")[0][0])
        assert set(doc) == {"id", "payload"}, doc
        assert trino.query(f"SELECT count(*) FROM iceberg.{namespace}.\"rows$properties\""
                           " WHERE key LIKE 'sless.position.%'") == [[1]]
        assert int(psql(f"SELECT count(*) FROM {dst} WHERE payload = 'p' || id")) == rows
    finally:
        for flow in flows:
            assert operator.rest("a", "DELETE", f"/dataflows/{flow['name']}").status_code == 204
        psql(f"DROP TABLE {src}; DROP TABLE {dst}")


def engine_pods(cluster, tenant):
    pods = cluster.kubectl("-n", f"sless-fn-{tenant}", "get", "pods", "-l",
                           f"app.kubernetes.io/name=sqs,app.kubernetes.io/instance={tenant}", "-o", "json").stdout
    return json.loads(pods)["items"]


def test_a_memory_change_is_ready_only_once_the_engine_of_the_new_spec_runs(operator):
    """The StatefulSet stops the old engine before the new one starts: the old
    engine's Ready must not be reported for the new spec. Each Ready the
    API answers after the change is checked against the pods: one pod,
    of the new spec, ready, and no other left."""
    cluster = operator.cluster
    created = operator.rest("b", "POST", "/queue-services", {"name": "main", "memoryMB": 64, "persistence": False})
    assert created.status_code == 201, created.text
    phase = lambda: operator.rest("b", "GET", "/queue-services/main").json().get("phase")
    wait_for("the queue service Ready", lambda: phase() == "Ready", 180)
    (old,) = engine_pods(cluster, "b")

    changed = operator.rest("b", "PATCH", "/queue-services/main", {"memoryMB": 96})
    assert changed.status_code == 200, changed.text
    deadline = time.time() + 180
    seen = []
    while True:
        now = phase()
        seen.append(now)
        if now == "Ready":
            pods = engine_pods(cluster, "b")
            described = [(p["metadata"]["name"], p["spec"]["containers"][0]["resources"]["limits"]["memory"],
                          p["metadata"].get("deletionTimestamp")) for p in pods]
            # The StatefulSet's pod keeps its name (sqs-1); a new pod has a new uid.
            assert len(pods) == 1 and old["metadata"]["uid"] != pods[0]["metadata"]["uid"], \
                f"Ready while the old engine runs: {described}"
            assert described[0][1] == "96Mi" and described[0][2] is None, described
            ready = [c for c in pods[0]["status"].get("conditions", []) if c["type"] == "Ready"]
            assert ready and ready[0]["status"] == "True", pods[0]["status"]
            break
        assert time.time() < deadline, f"never Ready again: {seen[-5:]}"
        time.sleep(0.2)
    assert "Provisioning" in seen, f"the change was never shown as under way: {seen[:5]}"
    assert "Failed" not in seen, f"a planned change shown as a failure: {seen}"
    assert operator.rest("b", "DELETE", "/queue-services/main").status_code in (202, 204)


def engine_call(cluster, tenant, pod, action, body):
    """An SQS call (JSON protocol) to the engine in `pod`, made from inside
    it with its own engine token (no gateway runs in this module): the
    answer's status line and JSON body, or None when it did not answer."""
    script = ('exec 3<>/dev/tcp/127.0.0.1/9324 && printf "POST / HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n'
              'x-amz-target: AmazonSQS.%s\\r\\ncontent-type: application/x-amz-json-1.0\\r\\n'
              'x-sless-engine-token: %s\\r\\ncontent-length: %d\\r\\n\\r\\n%s" '
              '"$ACTION" "$SLESS_ENGINE_TOKEN" "${#BODY}" "$BODY" >&3 && cat <&3')
    done = cluster.kubectl("-n", f"sless-fn-{tenant}", "exec", pod, "--", "env", f"ACTION={action}",
                           f"BODY={json.dumps(body)}", "bash", "-c", script, check=False)
    head, _, answer = done.stdout.replace("\r\n", "\n").partition("\n\n")
    if done.returncode != 0 or not head:
        return None
    return head.split("\n", 1)[0], json.loads(answer) if answer.strip() else None


def test_one_replica_grows_to_three_and_back_in_place_keeping_its_messages(operator):
    """A queue service of one replica on its volume, messages in it, then
    `replicas: 3` through REST: the pod restarts with the three-replica
    template first and the set grows only then (at once, the new pods
    would wait forever for the old one to add them). Ready again with
    three pods, every message sent before is there. Then `replicas: 1`:
    the operator has the replicas make replica 1 their only voter (on the
    peer port, which their NetworkPolicy opens to it) before the set
    lowers; Ready with one pod, every message is still there, a send is
    committed by replica 1 alone, and the claims of replicas 2 and 3 are
    gone with them."""
    cluster = operator.cluster
    gone = lambda: operator.rest("b", "GET", "/queue-services/main").status_code == 404
    wait_for("tenant b's queue service of the test before gone", gone, 120)
    created = operator.rest("b", "POST", "/queue-services", {"name": "main", "replicas": 1})
    assert created.status_code == 201, created.text
    phase = lambda: operator.rest("b", "GET", "/queue-services/main").json().get("phase")
    ready = lambda p: any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
    try:
        wait_for("the queue service Ready", lambda: phase() == "Ready", 180)
        call = lambda action, body: engine_call(cluster, "b", "sqs-1", action, body)
        url = wait_for("a queue made", lambda: (a := call("CreateQueue", {"QueueName": "grown"}))
                       and " 200 " in a[0] and a[1]["QueueUrl"], 60)
        for i in range(20):
            sent = call("SendMessage", {"QueueUrl": url, "MessageBody": f"g{i}"})
            assert sent and " 200 " in sent[0], sent

        def received(visibility):
            got = set()
            deadline = time.time() + 60
            while len(got) < 20 and time.time() < deadline:
                answer = call("ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10,
                                                 "VisibilityTimeout": visibility})
                if answer and " 200 " in answer[0]:
                    got.update(m["Body"] for m in (answer[1] or {}).get("Messages", []))
            return got

        changed = operator.rest("b", "PATCH", "/queue-services/main", {"replicas": 3})
        assert changed.status_code == 200, changed.text
        assert changed.json()["replicas"] == 3
        wait_for("three pods, Ready", lambda: phase() == "Ready" and len(pods := engine_pods(cluster, "b")) == 3
                 and all(ready(p) for p in pods), 240)
        assert received(1) == {f"g{i}" for i in range(20)}
        lowered = operator.rest("b", "PATCH", "/queue-services/main", {"replicas": 1})
        assert lowered.status_code == 200, lowered.text
        assert lowered.json()["replicas"] == 1
        wait_for("one pod, Ready", lambda: phase() == "Ready" and len(pods := engine_pods(cluster, "b")) == 1
                 and ready(pods[0]) and "--peers" not in pods[0]["spec"]["containers"][0]["args"], 240)
        assert received(60) == {f"g{i}" for i in range(20)}
        sent = call("SendMessage", {"QueueUrl": url, "MessageBody": "after"})
        assert sent and " 200 " in sent[0], sent
        claims = cluster.kubectl("-n", "sless-fn-b", "get", "pvc", "-o", "jsonpath={.items[*].metadata.name}").stdout
        assert claims.split() == ["data-sqs-1"], claims
    finally:
        assert operator.rest("b", "DELETE", "/queue-services/main").status_code in (202, 204)
        wait_for("the queue service gone", gone, 120)
        # Its claims are kept on delete (seed 000): not for a later test.
        cluster.kubectl("-n", "sless-fn-b", "delete", "pvc", "--all", "--wait=false", check=False)


def test_the_platforms_own_faults_reach_the_tenant_as_503_naming_nothing_of_it(cluster, sless_image, tmp_path):
    """`sless serve` under a service account the cluster's RBAC grants
    nothing, and then with a token the API server does not know: the
    tenant gets 503 (not 403, not 400), and nothing of the platform's
    identity; the cause is in the platform's log."""
    cluster.kubectl("create", "serviceaccount", "powerless", "-n", "default", check=False)
    token = cluster.kubectl("create", "token", "powerless", "-n", "default").stdout.strip()
    admin = cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout
    server = json.loads(admin)["clusters"][0]["cluster"]
    for name, credential in [("powerless", token), ("unknown", "not-a-token-the-cluster-knows")]:
        kubeconfig = tmp_path / f"{name}.kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": server}],
            "users": [{"name": "u", "user": {"token": credential}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
        }))
        env = dict(cluster.env, KUBECONFIG=str(kubeconfig))
        log = tmp_path / f"{name}.log"
        server_proc = Operator(type(cluster)(env), sless_image, log=log)
        try:
            wait_for("sless serve answering", lambda: server_proc.answers(), 60)
            for method, path, body in [("GET", "/dataflows", None), ("GET", "/queue-services/main", None),
                                       ("POST", "/queue-services", {"name": "main"})]:
                answer = server_proc.rest("a", method, path, body)
                assert answer.status_code == 503, (name, method, path, answer.status_code, answer.text)
                assert "serviceaccount" not in answer.text.lower() and "powerless" not in answer.text, answer.text
        finally:
            server_proc.stop()
        assert "platform call failed" in log.read_text(), log.read_text()[-2000:]


def test_a_processor_reaches_nothing_of_the_cluster(operator, pg_on_bridge):
    """A dataflow naming the API server's Service (by name and by address)
    is refused by its processor's egress policy, with the reason in its
    status; its NetworkPolicy leaves the cluster's networks out. (The API
    server runs on the node's host, where the network's policy does not
    apply: the processor's own refusal is what holds here.)"""
    cluster = operator.cluster
    for host in ["kubernetes.default.svc.cluster.local:443", "10.252.0.1:443"]:
        name = f"fenced-{uuid.uuid4().hex[:8]}"
        flow = {
            "name": name,
            "source": {"type": "postgresql", "config": {"connectionString": f"postgres://u@{host}/x", "table": "t"}},
            "sink": {"type": "postgresql", "config": {"connectionString": f"postgres://postgres@{pg_on_bridge}/test",
                                                       "table": name.replace("-", "_"), "autoCreateTable": True}},
        }
        created = operator.rest("a", "POST", "/dataflows", flow)
        assert created.status_code == 201, created.text

        last = []

        def refused():
            view = operator.rest("a", "GET", f"/dataflows/{name}").json()
            last[:] = [view.get("phase"), view.get("message")]
            return view if view.get("phase") == "Error" and "egress policy" in (view.get("message") or "") else None

        try:
            view = wait_for(lambda: f"{host} refused by the egress policy (last: {last})", refused, 180)
            assert "not reachable" in view["message"], view
            policy = json.loads(cluster.kubectl("-n", "sless-fn-a", "get", "networkpolicy", f"dataflow-{name}",
                                                "-o", "json").stdout)["spec"]
            outside = policy["egress"][1]["to"][1]["ipBlock"]
            assert outside == {"cidr": "0.0.0.0/0", "except": [SERVICES, PODS]}, policy
        finally:
            assert operator.rest("a", "DELETE", f"/dataflows/{name}").status_code == 204
            psql(f"DROP TABLE IF EXISTS {name.replace('-', '_')}")


def test_the_network_enforces_a_processors_network_policy(operator, pg_on_bridge):
    """The cluster's network (kube-network-policies, scripts/cluster.sh)
    enforces the NetworkPolicy the operator renders for a processor. The
    policy is applied, unchanged but for its pod selector, to a busybox pod
    in the tenant's namespace, standing in for a processor whose own egress
    check were bypassed (the real processor refuses these addresses before
    it sends anything). It resolves
    names and reaches a pod of its own namespace, but not a pod of another
    namespace (another tenant's, the platform's); the same pod without the
    policy reaches both, so the network, not the pod, refuses. (The API
    server and the cluster's DNS run on the node's host here; traffic to the
    host itself is not what a pod network's policy decides, and the
    processor's own egress policy refuses the API server: see above.)"""
    cluster = operator.cluster
    suffix = uuid.uuid4().hex[:8]
    name, table = f"net-{suffix}", f"net_{suffix}"
    elsewhere = f"elsewhere-{suffix}"
    psql(f"CREATE TABLE {table} (id serial PRIMARY KEY, payload text)")
    dsn = f"postgres://postgres@{pg_on_bridge}/test"
    flow = {
        "name": name,
        "source": {"type": "postgresql", "config": {"connectionString": dsn, "table": table}},
        "sink": {"type": "postgresql", "config": {"connectionString": dsn, "table": f"{table}_out",
                                                   "autoCreateTable": True}},
    }
    assert operator.rest("a", "POST", "/dataflows", flow).status_code == 201
    cluster.kubectl("create", "namespace", elsewhere)
    try:
        rendered = wait_for("the processor's NetworkPolicy", lambda: cluster.kubectl(
            "-n", "sless-fn-a", "get", "networkpolicy", f"dataflow-{name}", "-o", "json", check=False).stdout, 60)
        spec = json.loads(rendered)["spec"]
        spec["podSelector"] = {"matchLabels": {"sless-test/probe": suffix}}
        probe_policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": f"probe-{suffix}", "namespace": "sless-fn-a"}, "spec": spec}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(probe_policy))
        own = listener(cluster, "sless-fn-a", f"own-{suffix}") + ":8080"
        other = listener(cluster, elsewhere, f"other-{suffix}") + ":8080"

        fenced = reaches(cluster, "sless-fn-a", f"fenced-{suffix}", [own, other], {"sless-test/probe": suffix})
        free = reaches(cluster, "sless-fn-a", f"free-{suffix}", [own, other])
        assert free == ["dns", f"reached {own}", f"reached {other}"], free
        assert fenced == ["dns", f"reached {own}"], fenced
    finally:
        assert operator.rest("a", "DELETE", f"/dataflows/{name}").status_code == 204
        cluster.kubectl("-n", "sless-fn-a", "delete", "networkpolicy", f"probe-{suffix}", "--wait=false", check=False)
        cluster.kubectl("-n", "sless-fn-a", "delete", "pod", f"own-{suffix}", "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)
        psql(f"DROP TABLE {table}; DROP TABLE IF EXISTS {table}_out")
