"""SQS clients nobody here wrote, against `sless dev` as a tenant gets it:
the AWS SDK for JavaScript v3 (npm, the machine's Node.js) with the
endpoint exactly as published, boto 2 (the query protocol, posting to
queue URLs), boto3 left at AWS regions, and kombu and Celery from a broker
URL."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid
from urllib.parse import quote, urlsplit

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
JS = ROOT / "tests/js"


def test_the_javascript_sdk_v3_with_the_published_endpoint(tenant_a):
    node = shutil.which("node")
    assert node, "Node.js is installed by scripts/install-test-deps.sh"
    assert (JS / "node_modules/@aws-sdk/client-sqs").exists(), "npm ci --prefix tests/js"
    for endpoint in (tenant_a["endpoint"], tenant_a["endpoint"] + "/"):
        out = subprocess.run(
            [node, str(JS / "sqs_calls.mjs"), endpoint, tenant_a["accessKey"], tenant_a["secretKey"], "ru-msk-1"],
            capture_output=True, text=True, timeout=120, cwd=JS)
        assert out.returncode == 0, out.stderr
        results = json.loads(out.stdout)
        failed = {k: v for k, v in results.items() if v != "ok"}
        assert not failed, f"{endpoint}: {failed}"
        assert len(results) == 23, results


def test_boto2_posts_queue_actions_to_the_queues_url(tenant_a):
    """boto 2, like the Java SDK v1, names the queue by the path it posts
    to and sends no QueueUrl parameter."""
    pytest.importorskip("boto")
    from boto.sqs.connection import SQSConnection
    from boto.sqs.message import RawMessage
    from boto.sqs.regioninfo import SQSRegionInfo

    parts = urlsplit(tenant_a["endpoint"])
    conn = SQSConnection(
        aws_access_key_id=tenant_a["accessKey"], aws_secret_access_key=tenant_a["secretKey"],
        region=SQSRegionInfo(name="us-east-1", endpoint=parts.hostname),
        port=parts.port, is_secure=False)
    name = f"boto2-{uuid.uuid4().hex[:8]}"
    queue = conn.create_queue(name)
    assert urlsplit(queue.url).path.endswith(f"/{name}"), queue.url
    queue.set_message_class(RawMessage)
    for i in range(3):
        message = RawMessage()
        message.set_body(f"m{i}")
        assert queue.write(message)
    got = []
    deadline = time.time() + 30
    while len(got) < 3 and time.time() < deadline:
        for message in queue.get_messages(num_messages=10, wait_time_seconds=1):
            got.append(message.get_body())
            assert queue.delete_message(message)
    assert sorted(got) == ["m0", "m1", "m2"]
    assert int(queue.get_attributes("ApproximateNumberOfMessages")["ApproximateNumberOfMessages"]) == 0
    assert conn.delete_queue(queue)


@pytest.mark.parametrize("region", ["us-east-1", "eu-central-1"])
def test_boto3_left_at_an_aws_region(tenant_a, region):
    import boto3

    sqs = boto3.client("sqs", endpoint_url=tenant_a["endpoint"], region_name=region,
                       aws_access_key_id=tenant_a["accessKey"], aws_secret_access_key=tenant_a["secretKey"])
    url = sqs.create_queue(QueueName=f"region-{region}")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["Body"] == "hello"
    sqs.delete_queue(QueueUrl=url)


def broker_url(view):
    host = urlsplit(view["endpoint"]).netloc
    return f"sqs://{quote(view['accessKey'], safe='')}:{quote(view['secretKey'], safe='')}@{host}"


def test_kombu_from_a_broker_url_without_a_path(tenant_a):
    kombu = pytest.importorskip("kombu")
    queue = f"kombu-{uuid.uuid4().hex[:8]}"
    options = {"region": "ru-msk-1", "is_secure": False, "wait_time_seconds": 1}
    with kombu.Connection(broker_url(tenant_a), transport_options=options) as conn:
        q = conn.SimpleQueue(queue)
        for i in range(50):
            q.put({"n": i})
        got = set()
        deadline = time.time() + 60
        while len(got) < 50 and time.time() < deadline:
            message = q.get(block=True, timeout=5)
            got.add(message.payload["n"])
            message.ack()
        q.close()
    assert got == set(range(50))


def test_a_celery_worker_runs_each_task_once(tenant_a, tmp_path):
    pytest.importorskip("celery")
    done = tmp_path / "done.txt"
    env = {
        **os.environ,
        "SLESS_SQS_HOST": urlsplit(tenant_a["endpoint"]).netloc,
        "AWS_ACCESS_KEY_ID": tenant_a["accessKey"],
        "AWS_SECRET_ACCESS_KEY": tenant_a["secretKey"],
        "SLESS_SQS_QUEUE_PREFIX": f"t{uuid.uuid4().hex[:6]}-",
        "SLESS_CELERY_DONE": str(done),
        "PYTHONPATH": str(ROOT / "examples/celery"),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "worker", "--pool", "solo", "--loglevel", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        send = subprocess.run(
            [sys.executable, "-c", "import tasks\nfor i in range(40): tasks.add.delay(i, 1)"],
            env=env, capture_output=True, text=True, timeout=120)
        assert send.returncode == 0, send.stderr
        deadline = time.time() + 120
        while time.time() < deadline:
            lines = done.read_text().splitlines() if done.exists() else []
            if len(lines) >= 40:
                break
            assert worker.poll() is None, worker.stderr.read()
            time.sleep(0.5)
        time.sleep(3)  # a redelivery would show up as a 41st line
        lines = done.read_text().splitlines()
        assert sorted(lines) == sorted(f"{i}+1={i + 1}" for i in range(40)), lines
    finally:
        worker.terminate()
        worker.wait(timeout=30)
