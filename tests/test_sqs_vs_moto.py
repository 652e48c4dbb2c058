"""The same boto3 scenario against sless and against moto's SQS server (a
reference implementation from PyPI); responses are compared field by field,
with ids, receipts and timestamps (which differ by nature) masked."""

import boto3
import pytest
from botocore.exceptions import ClientError

from conftest import free_port, sqs_client

moto_server = pytest.importorskip("moto.server")

VOLATILE = {"MessageId", "ReceiptHandle", "RequestId", "SentTimestamp", "ApproximateFirstReceiveTimestamp",
            "CreatedTimestamp", "LastModifiedTimestamp", "SenderId", "QueueArn"}


@pytest.fixture(scope="module")
def moto():
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    # moto knows only AWS's own regions.
    yield boto3.client("sqs", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    server.stop()


# Not compared: moto omits SequenceNumber from FIFO SendMessage responses,
# which SQS documents (and sless returns).
IGNORED = {"ResponseMetadata", "SequenceNumber"}


def normalize(value, key=None):
    if isinstance(value, dict):
        return {k: normalize(v, k) for k, v in value.items() if k not in IGNORED}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if key in VOLATILE:
        return "<volatile>"
    if key in ("QueueUrl",) or (isinstance(value, str) and value.startswith("http")):
        return value.rsplit("/", 1)[-1]
    return value


def scenario(sqs):
    """Runs a fixed sequence of calls and records each result (or error code)."""
    out = []

    def call(name, **kwargs):
        try:
            result = getattr(sqs, name)(**kwargs)
        except ClientError as e:
            result = {"Error": e.response["Error"]["Code"]}
        out.append((name, normalize(result)))
        return result

    url = call("create_queue", QueueName="compare", Attributes={"VisibilityTimeout": "30"})["QueueUrl"]
    call("get_queue_url", QueueName="compare")
    call("get_queue_url", QueueName="missing")
    call("send_message", QueueUrl=url, MessageBody="plain")
    call("send_message", QueueUrl=url, MessageBody="with attributes", MessageAttributes={
        "s": {"DataType": "String", "StringValue": "value"},
        "n": {"DataType": "Number", "StringValue": "42"},
        "b": {"DataType": "Binary", "BinaryValue": b"\x01\x02\x03"},
    })
    call("send_message_batch", QueueUrl=url, Entries=[{"Id": "x", "MessageBody": "bx"}, {"Id": "y", "MessageBody": "by"}])
    received = call("receive_message", QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                    AttributeNames=["ApproximateReceiveCount"])
    for m in received.get("Messages", []):
        call("delete_message", QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    call("receive_message", QueueUrl=url)
    call("get_queue_attributes", QueueUrl=url, AttributeNames=["VisibilityTimeout", "DelaySeconds",
                                                              "ApproximateNumberOfMessages"])
    call("tag_queue", QueueUrl=url, Tags={"k": "v"})
    call("list_queue_tags", QueueUrl=url)
    fifo = call("create_queue", QueueName="compare.fifo",
                Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    call("send_message", QueueUrl=fifo, MessageBody="f1", MessageGroupId="g")
    call("send_message", QueueUrl=fifo, MessageBody="f2", MessageGroupId="g")
    call("receive_message", QueueUrl=fifo, MaxNumberOfMessages=10)
    call("delete_queue", QueueUrl=url)
    return out


def test_responses_match_moto_field_by_field(tenant_a, moto):
    ours = scenario(sqs_client(tenant_a))
    reference = scenario(moto)
    assert [name for name, _ in ours] == [name for name, _ in reference]
    for (name, mine), (_, theirs) in zip(ours, reference):
        if name == "receive_message" and "Messages" in mine:
            # Order across a standard queue is not defined: compare as sets.
            key = lambda m: m["Body"]  # noqa: E731
            mine = {**mine, "Messages": sorted(mine["Messages"], key=key)}
            theirs = {**theirs, "Messages": sorted(theirs["Messages"], key=key)}
        assert mine == theirs, f"{name} differs:\nsless: {mine}\nmoto:  {theirs}"
