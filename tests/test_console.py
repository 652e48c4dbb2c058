"""The web console in a real browser: Debian's chromium driven by
playwright-core (tests/js/console.mjs) against `sless dev`, with the local
PostgreSQL behind the dataflow it creates. The screenshots are kept under
target/console-screenshots/ to be looked at."""

import os
import shutil
import subprocess
import uuid

import pytest

from conftest import ROOT, TARGET, TOKENS

PG_DSN = os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def psql(sql):
    subprocess.run(["psql", PG_DSN, "-qc", sql], check=True, capture_output=True)


def test_the_console_in_chromium(sless):
    if not shutil.which("node") or not os.path.exists(CHROMIUM):
        pytest.fail("node and Debian's chromium are needed: run scripts/install-test-deps.sh")
    suffix = uuid.uuid4().hex[:8]
    src, dst = f"console_src_{suffix}", f"console_dst_{suffix}"
    psql(
        f"CREATE TABLE {src} (id serial PRIMARY KEY, amount int, card text);"
        f"INSERT INTO {src} (amount, card) SELECT g, '4111111111111111' FROM generate_series(1, 50) g;"
    )
    shots = TARGET / "console-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        API=sless.api,
        TOKEN_A=TOKENS["a"],
        TOKEN_B=TOKENS["b"],
        PG_DSN=PG_DSN,
        SRC=src,
        DST=dst,
        SHOTS=str(shots),
        CHROMIUM=CHROMIUM,
    )
    try:
        run = subprocess.run(
            ["node", str(ROOT / "tests/js/console.mjs")],
            env=env, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert '"ok":true' in run.stdout
        for name in ["overview", "queues", "dataflow-422", "dataflow", "dataflow-phone", "other-tenant"]:
            assert (shots / f"{name}.png").stat().st_size > 5000, name
        # The rows the console's dataflow moved, masked, filtered.
        count = subprocess.run(
            ["psql", PG_DSN, "-Atc", f"SELECT count(*), min(data->>'card') FROM {dst}"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        assert count == "45|****************", count
    finally:
        sless.rest("a", "DELETE", "/dataflows/console-flow")
        psql(f"DROP TABLE IF EXISTS {src}; DROP TABLE IF EXISTS {dst}")


def test_console_assets_carry_a_strict_policy(sless):
    import requests

    for path in ["/console", "/console/app.js", "/console/style.css"]:
        response = requests.get(sless.api + path, timeout=10)
        assert response.status_code == 200, path
        policy = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert requests.get(sless.api + "/console/../api/v1/dataflows", timeout=10).status_code == 401
    assert requests.get(sless.api + "/console/nope.js", timeout=10).status_code == 404


def test_queue_routes_reach_only_the_tenants_own_service(sless, tenant_a):
    """The console's queue routes: SQS calls signed with the service's own
    keys, so a tenant reaches its own queues and nothing else."""
    base = "/queue-services/main/queues"
    created = sless.rest("a", "POST", base, {"name": "api-q"})
    assert created.status_code == 201, created.text
    assert created.json()["url"].endswith("/api-q")
    assert sless.rest("a", "POST", base, {"name": "api-q.fifo"}).json()["fifo"] is True
    for bad in ["../x", "a" * 81, "", "q q", "x.fifo.fifo"]:
        refused = sless.rest("a", "POST", base, {"name": bad})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "name", (bad, refused.text)
    sent = sless.rest("a", "POST", f"{base}/api-q/messages", {"body": "hi"})
    assert sent.status_code == 201, sent.text
    # A body SQS refuses is the body's fault, not the name's.
    refused = sless.rest("a", "POST", f"{base}/api-q/messages", {"body": "bell \u0007"})
    assert (refused.status_code, refused.json()["error"]["field"]) == (422, "body"), refused.text
    listed = {q["name"]: q for q in sless.rest("a", "GET", base).json()["items"]}
    assert listed["api-q"]["visible"] == 1
    peek = sless.rest("a", "GET", f"{base}/api-q/messages").json()
    assert [m["body"] for m in peek["items"]] == ["hi"]
    assert peek["receivesCounted"] is False, "sless's engine peeks without receiving"
    again = {q["name"]: q for q in sless.rest("a", "GET", base).json()["items"]}
    assert again["api-q"]["visible"] == 1, "a peek leaves it there"
    assert again["api-q"]["oldestMessageAgeSeconds"] >= 0
    assert again["api-q.fifo"]["oldestMessageAgeSeconds"] == 0, "an empty queue"
    # Tenant b has no service "main"; a's queues are not reachable by b.
    assert sless.rest("b", "GET", base).status_code == 404
    assert sless.rest("b", "POST", f"{base}/api-q/messages", {"body": "x"}).status_code == 404
    assert sless.rest("a", "GET", f"{base}/nosuch/messages").status_code == 404
    assert sless.rest("a", "GET", "/queue-services/nosuch/queues").status_code == 404
    assert sless.rest("a", "DELETE", f"{base}/api-q").status_code == 204
    assert sless.rest("a", "DELETE", f"{base}/api-q.fifo").status_code == 204
    # The name is taken for 60 s more, as in SQS: a conflict, not bad input.
    again = sless.rest("a", "POST", base, {"name": "api-q"})
    assert again.status_code == 409 and "60 seconds" in again.json()["error"]["message"], again.text


def dead_letter_queue(sqs, name, max_receives):
    """Creates queue `name`: its URL, and a RedrivePolicy that sends a
    queue's messages there after `max_receives` receives."""
    import json

    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(max_receives)})


def test_a_peek_counts_no_receive_so_it_never_dead_letters(sless, tenant_a):
    """Two peeks of a queue whose policy allows one receive moved its
    message into the dead-letter queue when a peek was a receive."""
    from conftest import sqs_client

    sqs = sqs_client(tenant_a)
    _, policy = dead_letter_queue(sqs, "peek-dlq", 1)
    src = sqs.create_queue(QueueName="peek-src", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sqs.send_message(QueueUrl=src, MessageBody="look, don't take")
    base = "/queue-services/main/queues"
    for _ in range(3):
        peek = sless.rest("a", "GET", f"{base}/peek-src/messages").json()
        assert [(m["body"], m["receiveCount"]) for m in peek["items"]] == [("look, don't take", 0)], peek
    queues = {q["name"]: q for q in sless.rest("a", "GET", base).json()["items"]}
    assert queues["peek-src"]["visible"] == 1 and queues["peek-dlq"]["visible"] == 0, queues
    got = sqs.receive_message(QueueUrl=src, AttributeNames=["ApproximateReceiveCount"], WaitTimeSeconds=1)
    assert got["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "1"


def test_the_queue_list_comes_a_page_at_a_time(sless, tenant_a):
    """One list made an SQS call per queue of the service, all at once;
    now a page of at most 100, its calls a few at a time, and a dead-letter
    queue's sources found even when they are on another page."""
    from conftest import sqs_client

    sqs = sqs_client(tenant_a)
    dlq, policy = dead_letter_queue(sqs, "page-a-dlq", 5)
    for i in range(6):
        sqs.create_queue(QueueName=f"page-z-{i}", Attributes={"RedrivePolicy": policy})
    base = "/queue-services/main/queues"
    seen, token, pages = [], None, 0
    while True:
        got = sless.rest("a", "GET", base + "?limit=3" + (f"&nextToken={token}" if token else ""))
        assert got.status_code == 200, got.text
        page = got.json()
        assert len(page["items"]) <= 3
        seen += page["items"]
        pages += 1
        token = page.get("nextToken")
        if not token:
            break
    names = [q["name"] for q in seen]
    assert sorted(names) == sorted(set(names)), "a queue on two pages"
    assert sorted(names) == sorted(u.rsplit("/", 1)[1] for u in sqs.list_queues()["QueueUrls"])
    assert pages >= 3
    by_name = {q["name"]: q for q in seen}
    assert sorted(by_name["page-a-dlq"]["deadLetterSources"]) == [f"page-z-{i}" for i in range(6)]
    for bad in ["?limit=0", "?limit=101", "?limit=x", "?limit=3&what=1"]:
        refused = sless.rest("a", "GET", base + bad)
        assert refused.status_code == 400, (bad, refused.text)
    for i in range(6):
        sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=f"page-z-{i}")["QueueUrl"])
    sqs.delete_queue(QueueUrl=dlq)


def test_a_dead_letter_queue_is_shown_and_redriven(sless, tenant_a):
    from conftest import sqs_client

    sqs = sqs_client(tenant_a)
    _, policy = dead_letter_queue(sqs, "console-dlq", 1)
    src = sqs.create_queue(QueueName="console-src", Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sqs.send_message(QueueUrl=src, MessageBody="poison")
    for _ in range(2):
        sqs.receive_message(QueueUrl=src, VisibilityTimeout=0, WaitTimeSeconds=1)
    base = "/queue-services/main/queues"
    queues = {q["name"]: q for q in sless.rest("a", "GET", base).json()["items"]}
    assert queues["console-src"]["deadLetterQueue"] == "console-dlq"
    assert queues["console-dlq"]["deadLetterSources"] == ["console-src"]
    assert queues["console-dlq"]["visible"] == 1 and queues["console-src"]["visible"] == 0
    assert sless.rest("b", "POST", f"{base}/console-dlq/redrive").status_code == 404
    moved = sless.rest("a", "POST", f"{base}/console-dlq/redrive")
    assert moved.status_code == 200, moved.text
    queues = {q["name"]: q for q in sless.rest("a", "GET", base).json()["items"]}
    assert queues["console-dlq"]["visible"] == 0 and queues["console-src"]["visible"] == 1


def test_a_dataflows_events_say_why_it_fails_and_only_to_its_tenant(sless):
    """A source that cannot be reached: the events show the start and the
    retries (counted, not one event each); another tenant gets 404."""
    import time

    name = "events-" + uuid.uuid4().hex[:8]
    flow = {
        "name": name,
        # Nothing listens on port 1: every start fails and is retried.
        "source": {"type": "postgresql", "config": {"connectionString": "postgres://u@127.0.0.1:1/x", "table": "t"}},
        "sink": {"type": "postgresql", "config": {"connectionString": "postgres://u@127.0.0.1:1/x", "table": "u"}},
    }
    assert sless.rest("a", "POST", "/dataflows", flow).status_code == 201
    path = f"/dataflows/{name}/events"
    deadline = time.time() + 30
    while True:
        events = sless.rest("a", "GET", path)
        assert events.status_code == 200, events.text
        items = events.json()["items"]
        if items and items[0]["reason"] == "Error" and items[0]["count"] >= 2:
            break
        assert time.time() < deadline, items
        time.sleep(0.5)
    assert [e["reason"] for e in items] == ["Error", "Pending"]
    assert items[0]["kind"] == "Warning" and "retrying" in items[0]["message"]
    assert items[1]["message"] == "connecting the source and sinks"
    assert sless.rest("b", "GET", path).status_code == 404
    assert sless.rest("a", "GET", "/dataflows/nosuch/events").status_code == 404
    assert sless.rest("a", "GET", "/dataflows/..%2Fx/events").status_code in (400, 404)
    assert sless.rest("a", "DELETE", f"/dataflows/{name}").status_code == 204
    assert sless.rest("a", "GET", path).status_code == 404
