"""Every SQS action through the gateway with the unmodified boto3 client."""

import hashlib
import threading
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from conftest import account_id


def name(prefix="q"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def code(excinfo):
    return excinfo.value.response["Error"]["Code"]


def test_queue_lifecycle_and_urls(sqs, tenant_a):
    q = name()
    url = sqs.create_queue(QueueName=q, Attributes={"VisibilityTimeout": "7"})["QueueUrl"]
    assert url == f"{tenant_a['endpoint']}/{account_id('a')}/{q}", "clients see the gateway's /sqs/{tenant} URLs"
    assert sqs.create_queue(QueueName=q, Attributes={"VisibilityTimeout": "7"})["QueueUrl"] == url, "idempotent"
    with pytest.raises(ClientError) as e:
        sqs.create_queue(QueueName=q, Attributes={"VisibilityTimeout": "8"})
    assert code(e) == "QueueAlreadyExists"
    assert sqs.get_queue_url(QueueName=q)["QueueUrl"] == url
    assert url in sqs.list_queues(QueueNamePrefix=q)["QueueUrls"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "7"
    assert attrs["QueueArn"] == f"arn:aws:sqs:ru-msk-1:{account_id('a')}:{q}"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1", "MessageRetentionPeriod": "600"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds", "MessageRetentionPeriod"])
    assert attrs["Attributes"] == {"DelaySeconds": "1", "MessageRetentionPeriod": "600"}

    sqs.tag_queue(QueueUrl=url, Tags={"team": "orders", "env": "dev"})
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "orders"}

    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=q)


def test_send_receive_delete_with_attributes(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="hello ✓",
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "order"},
            "count": {"DataType": "Number", "StringValue": "3"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        },
    )
    assert sent["MD5OfMessageBody"] == hashlib.md5("hello ✓".encode()).hexdigest()
    got = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
    )["Messages"]
    assert len(got) == 1
    m = got[0]
    assert m["Body"] == "hello ✓" and m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["MessageAttributes"]["blob"]["BinaryValue"] == b"\x00\x01"
    assert m["MessageAttributes"]["count"] == {"DataType": "Number", "StringValue": "3"}
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert int(m["Attributes"]["SentTimestamp"]) > 0
    # Only the attributes asked for come back.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["kind"])["Messages"][0]
    assert set(again["MessageAttributes"]) == {"kind"}
    assert "Attributes" not in again
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0"}


def test_batches_and_visibility(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    sent = sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
    )
    assert len(sent["Successful"]) == 10 and not sent.get("Failed")
    got = []
    while len(got) < 10:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30).get("Messages", [])
        assert batch, "all 10 are visible"
        got += batch
    assert sorted(m["Body"] for m in got) == sorted(f"body {i}" for i in range(10))
    # In flight: nothing visible now.
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[{"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 0},
                 {"Id": "y", "ReceiptHandle": got[1]["ReceiptHandle"], "VisibilityTimeout": 1}],
    )
    assert {e["Id"] for e in changed["Successful"]} == {"x", "y"}
    back = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in back] == [got[0]["Body"]]
    assert back[0]["ReceiptHandle"] != got[0]["ReceiptHandle"]
    time.sleep(1.2)
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"][0]["Body"] == got[1]["Body"]

    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[2:])]
        + [{"Id": "bad", "ReceiptHandle": "not-a-receipt"}],
    )
    assert len(deleted["Successful"]) == 8
    assert [f["Id"] for f in deleted["Failed"]] == ["bad"]
    assert deleted["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"

    sqs.purge_queue(QueueUrl=url)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0" and attrs["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_long_polling_and_delay_queues(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    started = time.time()
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    assert time.time() - started >= 0.9, "an empty long poll waits"

    threading.Timer(0.5, lambda: sqs.send_message(QueueUrl=url, MessageBody="late")).start()
    started = time.time()
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    elapsed = time.time() - started
    assert got[0]["Body"] == "late"
    assert 0.4 <= elapsed < 5, f"a long poll returns when a message arrives ({elapsed:.2f}s)"

    delayed = sqs.create_queue(QueueName=name("delay"), Attributes={"DelaySeconds": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=delayed, MessageBody="queue delay")
    sqs.send_message(QueueUrl=url, MessageBody="message delay", DelaySeconds=1)
    attrs = sqs.get_queue_attributes(QueueUrl=delayed, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert attrs["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=delayed)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=delayed, WaitTimeSeconds=3)["Messages"][0]["Body"] == "queue delay"
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=3)["Messages"][0]["Body"] == "message delay"


def test_fifo_order_groups_and_deduplication(sqs):
    url = sqs.create_queue(QueueName=name("orders") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert code(e) == "InvalidParameterValue", "no dedup id and no content-based deduplication"
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert code(e) == "MissingParameter"

    first = sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a", MessageDeduplicationId="a1")
    dup = sqs.send_message(QueueUrl=url, MessageBody="a1 again", MessageGroupId="a", MessageDeduplicationId="a1")
    assert dup["MessageId"] == first["MessageId"], "a duplicate within 5 minutes is acknowledged, not enqueued"
    for body, group in [("a2", "a"), ("b1", "b"), ("a3", "a"), ("b2", "b")]:
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=body)
    assert int(sqs.send_message(QueueUrl=url, MessageBody="c", MessageGroupId="c", MessageDeduplicationId="c")[
        "SequenceNumber"]) > int(first["SequenceNumber"])

    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])["Messages"]
    bodies = [m["Body"] for m in got]
    assert bodies == ["a1", "a2", "b1", "a3", "b2", "c"], "order within each group is kept"
    assert got[0]["Attributes"]["MessageGroupId"] == "a"
    # With group a's messages in flight, nothing more of group a is given out.
    sqs.send_message(QueueUrl=url, MessageBody="a4", MessageGroupId="a", MessageDeduplicationId="a4")
    assert "Messages" not in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
    for m in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "a4"

    cbd = sqs.create_queue(
        QueueName=name("cbd") + ".fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    one = sqs.send_message(QueueUrl=cbd, MessageBody="same", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=cbd, MessageBody="same", MessageGroupId="g")
    assert one["MessageId"] == two["MessageId"]
    attrs = sqs.get_queue_attributes(QueueUrl=cbd, AttributeNames=["ApproximateNumberOfMessages"])
    assert attrs["Attributes"]["ApproximateNumberOfMessages"] == "1"


def test_dead_letter_queue(sqs):
    dlq = sqs.create_queue(QueueName=name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    src = sqs.create_queue(
        QueueName=name("src"),
        Attributes={"RedrivePolicy": f'{{"deadLetterTargetArn": "{dlq_arn}", "maxReceiveCount": "2"}}'},
    )["QueueUrl"]
    sqs.send_message(QueueUrl=src, MessageBody="poison")
    for attempt in (1, 2):
        m = sqs.receive_message(QueueUrl=src, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        assert m["Attributes"]["ApproximateReceiveCount"] == str(attempt)
        sqs.change_message_visibility(QueueUrl=src, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=src), "moved after maxReceiveCount receives"
    moved = sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in moved] == ["poison"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [src]


def test_strict_limits_with_aws_error_codes(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    cases = [
        (lambda: sqs.create_queue(QueueName="bad name!"), "InvalidParameterValue"),
        (lambda: sqs.create_queue(QueueName="x" * 81), "InvalidParameterValue"),
        (lambda: sqs.create_queue(QueueName=name(), Attributes={"VisibilityTimeout": "43201"}), "InvalidAttributeValue"),
        (lambda: sqs.create_queue(QueueName=name(), Attributes={"Bogus": "1"}), "InvalidAttributeName"),
        # AWS's limit since 2025: 1 MiB messages and batches.
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x" * 1_048_577), "InvalidParameterValue"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="bad \x01 char"), "InvalidMessageContents"),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(11)]),
         "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "x"}] * 2),
         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "MessageBody": "x"}]),
         "AWS.SimpleQueueService.InvalidBatchEntryId"),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x" * 110_000} for i in range(10)]),
         "AWS.SimpleQueueService.BatchRequestTooLong"),
        (lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11), "InvalidParameterValue"),
        (lambda: sqs.receive_message(QueueUrl=url, WaitTimeSeconds=21), "InvalidParameterValue"),
        (lambda: sqs.receive_message(QueueUrl=url, VisibilityTimeout=43_201), "InvalidParameterValue"),
        (lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle="bogus", VisibilityTimeout=1),
         "ReceiptHandleIsInvalid"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            f"k{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}), "InvalidParameterValue"),
        (lambda: sqs.send_message(QueueUrl=url.rsplit("/", 1)[0] + "/missing", MessageBody="x"),
         "AWS.SimpleQueueService.NonExistentQueue"),
    ]
    for call, expected in cases:
        with pytest.raises(ClientError) as e:
            call()
        assert code(e) == expected, e.value.response["Error"]
        # The status AWS's service model gives the code: 400 unless named.
        status = {"ReceiptHandleIsInvalid": 404}.get(expected, 400)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == status, expected
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1_048_576)
    m = sqs.receive_message(QueueUrl=url)["Messages"][0]
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=43_201)
    assert code(e) == "InvalidParameterValue"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    with pytest.raises(ClientError) as e:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=5)
    assert code(e) == "AWS.SimpleQueueService.MessageNotInflight"


def test_age_of_the_oldest_message_is_an_attribute_asked_for_by_name(sqs):
    """sless's extension (the CloudWatch metric SQS has instead): `All` keeps
    what SQS returns, the name asked for gets whole seconds."""
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    age = lambda: sqs.get_queue_attributes(  # noqa: E731
        QueueUrl=url, AttributeNames=["ApproximateAgeOfOldestMessage"]
    )["Attributes"]
    assert age() == {"ApproximateAgeOfOldestMessage": "0"}, "an empty queue"
    sqs.send_message(QueueUrl=url, MessageBody="old")
    time.sleep(1.2)
    assert int(age()["ApproximateAgeOfOldestMessage"]) >= 1
    all_ = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert "ApproximateAgeOfOldestMessage" not in all_
    got = sqs.receive_message(QueueUrl=url)["Messages"][0]
    assert int(age()["ApproximateAgeOfOldestMessage"]) >= 1, "in flight still counts"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got["ReceiptHandle"])
    assert age() == {"ApproximateAgeOfOldestMessage": "0"}
