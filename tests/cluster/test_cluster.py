"""The cluster itself, before sless runs on it: a pod the real kubelet
starts on containerd runs as the user it names, resolves Services through
the cluster's DNS and reaches the API server through the `kubernetes`
Service (kube-proxy's rules); the image built from the Dockerfile runs as
its USER with a read-only root filesystem."""

import json
import time

from tests.cluster.conftest import busybox_pod


def finished(cluster, name, within=60):
    """The pod's phase once it ended, and its log."""
    deadline = time.time() + within
    phase = None
    while time.time() < deadline:
        phase = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(0.5)
    return phase, cluster.kubectl("logs", name, check=False).stdout


def test_a_pod_runs_as_its_user_and_reaches_dns_and_the_api_server(cluster):
    pod = busybox_pod("default", "smoke", "id -u; /bin/busybox nslookup kubernetes.default.svc.cluster.local;"
                      " echo | /bin/busybox nc -w 5 kubernetes.default.svc 443 && echo api-reached")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    phase, logs = finished(cluster, "smoke")
    assert phase == "Succeeded", f"{phase}: {logs}"
    lines = logs.splitlines()
    assert lines[0] == "65532", logs
    assert "Address: 10.252.0.1" in logs, logs
    assert "api-reached" in logs, logs
    cluster.kubectl("delete", "pod", "smoke", "--wait=true")


def test_the_image_from_the_dockerfile_runs_as_its_user_read_only(cluster, sless_image):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sless-image", "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "sless",
                "image": sless_image,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "id -u; sless --help | head -n 3"],
                "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    phase, logs = finished(cluster, "sless-image")
    assert phase == "Succeeded", f"{phase}: {logs}"
    assert logs.splitlines()[0] == "65532", logs
    assert "Usage: sless <COMMAND>" in logs, logs
    cluster.kubectl("delete", "pod", "sless-image", "--wait=true")
