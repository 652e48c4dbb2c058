"""An acknowledged SendMessage survives `kill -9` of `sless dev`."""

import threading
import time

from botocore.config import Config

from conftest import sqs_client


def receive_all(client, url):
    received = {}
    while True:
        batch = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300).get("Messages", [])
        if not batch:
            return received
        for m in batch:
            received[m["MessageId"]] = m["Body"]


def test_acknowledged_messages_survive_kill_9(sless):
    durable = sqs_client(sless.queue_service("a"))
    url = durable.create_queue(QueueName="durable")["QueueUrl"]
    sent = {}
    for i in range(100):
        r = durable.send_message(QueueUrl=url, MessageBody=f"single {i}")
        sent[r["MessageId"]] = f"single {i}"
    for batch in range(20):
        entries = [{"Id": str(j), "MessageBody": f"batch {batch}/{j}"} for j in range(10)]
        for ok in durable.send_message_batch(QueueUrl=url, Entries=entries)["Successful"]:
            sent[ok["MessageId"]] = f"batch {batch}/{ok['Id']}"
    # A received-and-deleted message must stay deleted.
    gone = durable.receive_message(QueueUrl=url)["Messages"][0]
    durable.delete_message(QueueUrl=url, ReceiptHandle=gone["ReceiptHandle"])
    del sent[gone["MessageId"]]

    volatile = sqs_client(sless.queue_service("b", persistence=False))
    volatile.create_queue(QueueName="scratch")

    sless.kill9()
    sless.restart()

    durable = sqs_client(sless.wait_ready("a", "main"))
    received = receive_all(durable, url)
    assert received == sent, f"{len(sent)} sent, {len(received)} received after the crash"

    volatile = sqs_client(sless.wait_ready("b", "main"))
    assert "QueueUrls" not in volatile.list_queues(), "persistence off keeps memory only"


def test_messages_acknowledged_when_the_kill_lands_mid_commit_are_all_kept(sless):
    """`kill -9` while eight senders keep the journal's group commits going,
    so the kill lands in or between commits: every acknowledged message is
    received after the restart, and nothing that was never sent."""
    view = sless.queue_service("a")
    url = sqs_client(view).create_queue(QueueName="inflight")["QueueUrl"]
    acked, attempted = {}, set()
    lock = threading.Lock()
    # One attempt each: a send the kill interrupted is not retried into the
    # restarted platform, where it would count as acknowledged.
    once = Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=2, read_timeout=10)

    def sender(n):
        client = sqs_client(view, config=once)
        for i in range(1_000_000):
            body = f"{n}/{i}"
            with lock:
                attempted.add(body)
            try:
                r = client.send_message(QueueUrl=url, MessageBody=body)
            except Exception:
                return
            with lock:
                acked[r["MessageId"]] = body

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    deadline = time.time() + 20
    while len(acked) < 1500 and time.time() < deadline:
        time.sleep(0.01)
    sless.kill9()
    for t in threads:
        t.join(timeout=30)
    assert len(acked) >= 1500, f"only {len(acked)} sends were acknowledged before the kill"

    sless.restart()
    received = receive_all(sqs_client(sless.wait_ready("a", "main")), url)
    lost = {k: v for k, v in acked.items() if received.get(k) != v}
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost, e.g. {list(lost.items())[:3]}"
    assert set(received.values()) <= attempted, "a message that was never sent"
