"""The real single-node Kubernetes of `scripts/cluster.sh`, once for the
session: built from the official sources on first use (cached outside the
checkout), started before the first cluster test and removed after the
last one, with its interfaces, iptables rules and state."""

import json
import os
import pathlib
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "cluster.sh"
# The address of the cluster's bridge on the host (scripts/cluster.sh):
# host services the pods use are forwarded to it.
BRIDGE = "10.250.0.1"
PG_DSN = os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test")


def psql(sql):
    done = subprocess.run(["psql", PG_DSN, "-Atqc", sql], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def wait_for(what, check, within):
    """`check()` once it is truthy; `what` (or what it returns) names it
    when it is not within `within` seconds."""
    deadline = time.time() + within
    while True:
        value = check()
        if value:
            return value
        assert time.time() < deadline, f"{what() if callable(what) else what} within {within} s"
        time.sleep(0.5)


def forward(host_port, bridge_port):
    """socat from the bridge's `bridge_port` to a loopback service of the
    host: its process, listening. Stop it with `stop(forwarder)`."""
    proc = subprocess.Popen(["socat", f"TCP-LISTEN:{bridge_port},bind={BRIDGE},reuseaddr,fork",
                             f"TCP:127.0.0.1:{host_port}"])

    def listening():
        try:
            socket.create_connection((BRIDGE, bridge_port), timeout=1).close()
            return True
        except OSError:
            return False
    try:
        wait_for(f"the forwarder to port {host_port}", listening, 10)
    except BaseException:
        stop(proc)
        raise
    return proc


def stop(proc):
    proc.terminate()
    proc.wait()


def busybox_pod(namespace, name, script, labels=None):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True},
            "containers": [{"name": "c", "image": "sless.local/busybox:1", "imagePullPolicy": "Never",
                            "command": ["/bin/busybox", "sh", "-c", script]}],
        },
    }


def listener(cluster, namespace, name):
    """A pod accepting TCP on 8080, under no NetworkPolicy: its address."""
    cluster.kubectl("apply", "-f", "-", input=json.dumps(
        busybox_pod(namespace, name, "exec /bin/busybox nc -ll -p 8080 -e /bin/busybox true")))
    cluster.kubectl("-n", namespace, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=60s")
    return cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.podIP}").stdout


def reaches(cluster, namespace, name, targets, labels=None):
    """Runs a pod (with `labels`) that resolves a name and opens a TCP
    connection to each `ip:port` target, 3 s each: the lines it printed
    (`dns`, and `reached <target>` for each connection made). The pod is
    removed.

    It starts probing only once its address is published and 3 s have
    passed: the cluster's enforcer learns pods' addresses from the API server
    (upstream closes that gap with containerd's NRI, which Debian's
    containerd 1.6 has not), and lets a connection from an address it does
    not know yet pass."""
    script = "/bin/busybox nc -l -p 9999 -e /bin/busybox true;"
    script += " /bin/busybox nslookup kubernetes.default.svc.cluster.local >/dev/null && echo dns;"
    for target in targets:
        ip, port = target.rsplit(":", 1)
        script += f" /bin/busybox nc -w 3 {ip} {port} -e /bin/busybox true 2>/dev/null && echo reached {target};"
    script += " true"
    cluster.kubectl("apply", "-f", "-", input=json.dumps(busybox_pod(namespace, name, script, labels)))
    try:
        address = wait_for(f"{name}'s address", lambda: cluster.kubectl(
            "-n", namespace, "get", "pod", name, "-o", "jsonpath={.status.podIP}").stdout, 60)
        time.sleep(3)

        def started():
            try:
                socket.create_connection((address, 9999), timeout=1).close()
                return True
            except OSError:
                return False
        wait_for(f"{name} started", started, 30)
        wait_for(f"{name} finished", lambda: cluster.kubectl("-n", namespace, "get", "pod", name, "-o",
                                                              "jsonpath={.status.phase}").stdout == "Succeeded", 90)
        return cluster.kubectl("-n", namespace, "logs", name).stdout.splitlines()
    finally:
        cluster.kubectl("-n", namespace, "delete", "pod", name, "--wait=false", check=False)

class Cluster:
    def __init__(self, env):
        self.env = env

    def kubectl(self, *args, input=None, check=True):
        done = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=120)
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done


@pytest.fixture(scope="session")
def cluster():
    up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=3600)
    assert up.returncode == 0, f"cluster.sh up failed:\n{up.stdout}\n{up.stderr}"
    env = dict(os.environ)
    for part in up.stdout.strip().splitlines()[-1].removeprefix("export ").split():
        name, value = part.split("=", 1)
        env[name] = value.replace("$PATH", os.environ["PATH"])
    try:
        yield Cluster(env)
    finally:
        # SLESS_CLUSTER_KEEP=1 leaves it up for the next run (while developing).
        if os.environ.get("SLESS_CLUSTER_KEEP") != "1":
            subprocess.run([str(SCRIPT), "down"], timeout=300)


@pytest.fixture(scope="session")
def sless_image(cluster):
    """The sless image, built from the Dockerfile and loaded into the
    cluster (scripts/cluster/image.py): its name. Of the debug build the
    suite made already unless SLESS_IMAGE_PROFILE says release: these tests
    check behaviour, not speed, and a release build takes twenty minutes."""
    env = dict(os.environ, SLESS_IMAGE_PROFILE=os.environ.get("SLESS_IMAGE_PROFILE", "dev"))
    built = subprocess.run([str(SCRIPT), "image"], capture_output=True, text=True, timeout=3600, env=env)
    assert built.returncode == 0, f"cluster.sh image failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    return "ghcr.io/kube5s/sless:test"
