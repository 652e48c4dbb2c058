"""An acknowledged SendMessage survives `kill -9` of `sless dev`."""

from conftest import sqs_client


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
    received = {}
    while True:
        batch = durable.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=300).get("Messages", [])
        if not batch:
            break
        for m in batch:
            received[m["MessageId"]] = m["Body"]
    assert received == sent, f"{len(sent)} sent, {len(received)} received after the crash"

    volatile = sqs_client(sless.wait_ready("b", "main"))
    assert "QueueUrls" not in volatile.list_queues(), "persistence off keeps memory only"
