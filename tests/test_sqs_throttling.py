"""Per-tenant data-plane limits: a tenant over its requests a second is
answered RequestThrottled (403, as AWS's model gives it) by the gateway,
which boto3 retries by itself; another tenant's calls meanwhile all pass,
and a throttled call reaches no queue. A queue service's own rate, set
through REST, replaces the gateway's until it is taken away.

`sless dev` runs with --tenant-requests-per-second 20 (a burst of 20)."""

import concurrent.futures
import pathlib
import shutil
import tempfile
import threading
import time

import botocore.config
import botocore.exceptions
import pytest

from conftest import BINARY, Sless, sqs_client

RATE = 20


@pytest.fixture(scope="module")
def limited():
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build` first")
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sless-throttle-"))
    server = Sless(data_dir, flags=["--tenant-requests-per-second", str(RATE)])
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def no_retries(view):
    # total_max_attempts counts the first call: 1 is no retry at all
    # (max_attempts counts retries in botocore, and legacy mode retries
    # RequestThrottled for SQS).
    return sqs_client(view, config=botocore.config.Config(retries={"total_max_attempts": 1}))


def send(client, url, body):
    """'ok', or the error code of a refused send."""
    try:
        client.send_message(QueueUrl=url, MessageBody=body)
        return "ok"
    except botocore.exceptions.ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 403, e.response
        assert "Rate exceeded" in e.response["Error"]["Message"], e.response
        return e.response["Error"]["Code"]


def test_a_tenant_over_its_rate_is_throttled_and_boto3_retries_it(limited):
    a, b = limited.queue_service("a"), limited.queue_service("b")
    bare_a = no_retries(a)
    url = bare_a.create_queue(QueueName="noisy")["QueueUrl"]
    # The REST API has a rate of its own; wait so that a's bucket is full.
    time.sleep(1.5)

    # Tenant a sends 100 at once, without retries: about a burst passes,
    # the rest are refused.
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=25) as pool:
        outcomes = list(pool.map(lambda i: send(bare_a, url, f"m{i}"), range(100)))
    elapsed = time.monotonic() - started
    assert set(outcomes) <= {"ok", "RequestThrottled"}, outcomes
    passed = outcomes.count("ok")
    assert outcomes.count("RequestThrottled") > 0, outcomes
    assert passed <= RATE + elapsed * RATE + 1, (passed, elapsed)

    # Meanwhile tenant b, under its own rate, is never refused while a
    # hammers on.
    bare_b = no_retries(b)
    url_b = bare_b.create_queue(QueueName="quiet")["QueueUrl"]
    noisy, failures = [], []

    def hammer():
        try:
            noisy.extend(send(bare_a, url, f"n{i}") for i in range(200))
        except Exception as e:  # reported by the test's own thread
            failures.append(e)

    thread = threading.Thread(target=hammer)
    thread.start()
    quiet = []
    for i in range(10):
        quiet.append(send(bare_b, url_b, f"q{i}"))
        time.sleep(0.1)
    thread.join()
    assert failures == []
    assert quiet == ["ok"] * 10
    assert set(noisy) <= {"ok", "RequestThrottled"}, noisy

    # Only what passed reached the queue: the throttled calls did not.
    time.sleep(1.5)
    held = bare_a.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    assert int(held["Attributes"]["ApproximateNumberOfMessages"]) == passed + noisy.count("ok")

    # boto3's own retries (standard mode) carry 40 sends through at the
    # rate (its retry quota, 500 tokens at 5 a retry, is not used up).
    retrying = sqs_client(a, config=botocore.config.Config(retries={"mode": "standard", "max_attempts": 10}))
    url = retrying.create_queue(QueueName="carried")["QueueUrl"]
    time.sleep(1.5)
    started = time.monotonic()
    for i in range(40):
        retrying.send_message(QueueUrl=url, MessageBody=f"r{i}")
    took = time.monotonic() - started
    assert took >= (40 - RATE) / RATE * 0.8, took
    time.sleep(1.5)
    received = set()
    while True:
        got = retrying.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0).get("Messages", [])
        if not got:
            break
        received.update(m["Body"] for m in got)
        retrying.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)])
    assert received == {f"r{i}" for i in range(40)}


def burst(client, url, n=40):
    """How many of `n` sends at once pass, and how long they took."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        outcomes = list(pool.map(lambda i: send(client, url, f"o{i}"), range(n)))
    return outcomes.count("ok"), time.monotonic() - started


def until_rate(client, url, rate, within=15):
    """Bursts on a full bucket until what passes is `rate`'s (the gateway
    takes a change with its next routing table); the last count passed."""
    deadline = time.monotonic() + within
    while True:
        time.sleep(1.5)
        passed, elapsed = burst(client, url)
        if rate - 1 <= passed <= rate + elapsed * rate + 1:
            return passed
        assert time.monotonic() < deadline, f"{passed} of 40 passed in {elapsed:.2f} s, not at {rate} a second"


def test_a_queue_services_own_rate_through_rest_replaces_the_gateways_and_is_given_back(limited):
    b = limited.queue_service("b")
    client = no_retries(b)
    url = client.create_queue(QueueName="own-rate")["QueueUrl"]
    until_rate(client, url, RATE)

    for wrong in (0, 100_001, 2.5, "5"):
        refused = limited.rest("b", "PATCH", "/queue-services/main", {"requestsPerSecond": wrong})
        assert refused.status_code in (400, 422) and "requestsPerSecond" in refused.text, refused.text
    changed = limited.rest("b", "PATCH", "/queue-services/main", {"requestsPerSecond": 5})
    assert changed.status_code == 200 and changed.json()["requestsPerSecond"] == 5, changed.text
    limited.wait_ready("b", "main")
    until_rate(client, url, 5)
    # A PATCH of something else keeps it.
    kept = limited.rest("b", "PATCH", "/queue-services/main", {"memoryMB": 96})
    assert kept.json()["requestsPerSecond"] == 5, kept.text

    # A PUT without it gives the gateway's rate back.
    back = limited.rest("b", "PUT", "/queue-services/main", {"memoryMB": 96})
    assert back.status_code == 200 and "requestsPerSecond" not in back.json(), back.text
    limited.wait_ready("b", "main")
    until_rate(client, url, RATE)
