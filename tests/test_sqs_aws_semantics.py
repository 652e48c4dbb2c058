"""Today's AWS SQS semantics where an outside test suite found sless apart
from them (issue 14), each checked with boto3 as a tenant would meet it."""

import hashlib
import json
import uuid
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError

from conftest import sqs_client


def name(prefix="q"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def code(e):
    return e.value.response["Error"]["Code"]


def refused(call, **kwargs):
    with pytest.raises(ClientError) as e:
        call(**kwargs)
    return code(e)


def refused_with_status(call, **kwargs):
    with pytest.raises(ClientError) as e:
        call(**kwargs)
    return code(e), e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_arns_carry_a_12_digit_account_id(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    account = arn.split(":")[4]
    assert len(account) == 12 and account.isdigit(), arn
    assert url.split("/")[-2] == account, "the queue URL names the same account"


def test_fifo_throughput_attributes(sqs):
    url = sqs.create_queue(QueueName=name() + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["DeduplicationScope"], attrs["FifoThroughputLimit"]) == ("queue", "perQueue")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attrs["DeduplicationScope"], attrs["FifoThroughputLimit"]) == ("messageGroup", "perMessageGroupId")
    assert refused(sqs.set_queue_attributes, QueueUrl=url,
                   Attributes={"DeduplicationScope": "everywhere"}) == "InvalidAttributeValue"
    standard = sqs.create_queue(QueueName=name())["QueueUrl"]
    for attribute, value in [("DeduplicationScope", "queue"), ("FifoThroughputLimit", "perQueue")]:
        assert refused(sqs.set_queue_attributes, QueueUrl=standard,
                       Attributes={attribute: value}) == "InvalidAttributeName"
    assert "DeduplicationScope" not in sqs.get_queue_attributes(
        QueueUrl=standard, AttributeNames=["All"])["Attributes"]


def test_message_actions_on_a_missing_queue_say_so(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    handle = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]
    missing = url.rsplit("/", 1)[0] + "/" + name("missing")
    missing_queue = "AWS.SimpleQueueService.NonExistentQueue"
    assert refused(sqs.delete_message, QueueUrl=missing, ReceiptHandle=handle) == missing_queue
    assert refused(sqs.change_message_visibility, QueueUrl=missing, ReceiptHandle=handle,
                   VisibilityTimeout=1) == missing_queue


def test_redrive_policies_are_checked_and_kept_in_sqs_form(sqs):
    source = sqs.create_queue(QueueName=name())["QueueUrl"]
    dlq = sqs.create_queue(QueueName=name("dlq"))["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    fifo = sqs.create_queue(QueueName=name() + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]

    def policy(arn, count=3):
        return {"RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": count})}

    assert refused(sqs.set_queue_attributes, QueueUrl=source,
                   Attributes=policy(dlq_arn.rsplit(":", 1)[0] + ":nowhere")) == "InvalidParameterValue"
    assert refused(sqs.set_queue_attributes, QueueUrl=fifo, Attributes=policy(dlq_arn)) == "InvalidParameterValue", \
        "a FIFO queue cannot dead-letter into a standard queue"
    sqs.set_queue_attributes(QueueUrl=source, Attributes=policy(dlq_arn, "5"))
    kept = json.loads(sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])
                      ["Attributes"]["RedrivePolicy"])
    assert kept == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}

    # A message moved to the dead-letter queue says where it came from.
    sqs.set_queue_attributes(QueueUrl=source, Attributes=policy(dlq_arn, 1))
    sqs.send_message(QueueUrl=source, MessageBody="poison")
    sqs.receive_message(QueueUrl=source, VisibilityTimeout=0)
    assert "Messages" not in sqs.receive_message(QueueUrl=source)
    moved = sqs.receive_message(QueueUrl=dlq, MessageSystemAttributeNames=["All"], WaitTimeSeconds=2)["Messages"]
    source_arn = sqs.get_queue_attributes(QueueUrl=source, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert moved[0]["Attributes"]["DeadLetterQueueSourceArn"] == source_arn


def test_an_empty_policy_removes_it(sqs):
    url = sqs.create_queue(QueueName=name(), Attributes={"Policy": '{"Version": "2012-10-17"}'})["QueueUrl"]
    assert "Policy" in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})


def attributes_md5(attributes):
    """The MD5 of attributes by the algorithm AWS documents (and the Java
    SDK checks): each name, type and value length-prefixed, values tagged."""
    buf = b""
    for key, attribute in sorted(attributes.items()):
        for part in (key.encode(), attribute["DataType"].encode()):
            buf += len(part).to_bytes(4, "big") + part
        value = attribute["StringValue"].encode()
        buf += b"\x01" + len(value).to_bytes(4, "big") + value
    return hashlib.md5(buf).hexdigest()


def test_the_trace_header_travels_with_the_message(sqs):
    """...and its MD5 comes back as real SQS answers it, for a message and
    for each entry of a batch (the Java SDK fails the call without it)."""
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"
    system = {"AWSTraceHeader": {"DataType": "String", "StringValue": header}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="traced", MessageSystemAttributes=system)
    assert sent["MD5OfMessageSystemAttributes"] == attributes_md5(system)
    got = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["AWSTraceHeader"])["Messages"][0]
    assert got["Attributes"] == {"AWSTraceHeader": header}
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "traced", "MessageBody": "b", "MessageSystemAttributes": system},
        {"Id": "plain", "MessageBody": "b"}])["Successful"]
    by_id = {entry["Id"]: entry for entry in batch}
    assert by_id["traced"]["MD5OfMessageSystemAttributes"] == attributes_md5(system)
    assert "MD5OfMessageSystemAttributes" not in by_id["plain"]
    assert "MD5OfMessageSystemAttributes" not in sqs.send_message(QueueUrl=url, MessageBody="plain")


def test_purge_and_recreate_cool_downs(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    # 403, as AWS's service model says.
    assert refused_with_status(sqs.purge_queue, QueueUrl=url) == ("AWS.SimpleQueueService.PurgeQueueInProgress", 403)
    queue = name()
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    assert refused(sqs.create_queue, QueueName=queue) == "AWS.SimpleQueueService.QueueDeletedRecently"


def test_untag_without_keys_is_refused(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    assert refused(sqs.untag_queue, QueueUrl=url, TagKeys=[]) == "MissingParameter"


def test_an_oversized_request_is_an_invalid_value(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    with pytest.raises(ClientError) as e:
        sqs.send_message(QueueUrl=url, MessageBody="x" * (9 * 1024 * 1024))
    assert code(e) in ("InvalidParameterValue", "InvalidParameterValueException"), e.value.response


def test_endpoints_with_a_slash_or_without_the_tenant_path(tenant_a):
    endpoint = tenant_a["endpoint"]
    root = f"{urlsplit(endpoint).scheme}://{urlsplit(endpoint).netloc}"
    for url in (endpoint + "/", root, root + "/"):
        client = sqs_client(tenant_a, endpoint=url)
        queue = client.create_queue(QueueName=name())["QueueUrl"]
        client.send_message(QueueUrl=queue, MessageBody=url)
        assert client.receive_message(QueueUrl=queue)["Messages"][0]["Body"] == url


def test_without_the_tenant_path_an_unknown_key_is_refused(tenant_a):
    endpoint = tenant_a["endpoint"]
    root = f"{urlsplit(endpoint).scheme}://{urlsplit(endpoint).netloc}"
    client = sqs_client(tenant_a, endpoint=root, access_key="SQSAKa_unknown1")
    with pytest.raises(ClientError) as e:
        client.list_queues()
    assert code(e) == "InvalidClientTokenId"
    forged = sqs_client(tenant_a, endpoint=root, secret="bm90IHRoZSBzZWNyZXQ=")
    with pytest.raises(ClientError) as e:
        forged.list_queues()
    assert code(e) == "SignatureDoesNotMatch"


def test_dead_letter_redrive_with_move_tasks(sqs):
    source = sqs.create_queue(QueueName=name())["QueueUrl"]
    other = sqs.create_queue(QueueName=name("other"))["QueueUrl"]
    dlq = sqs.create_queue(QueueName=name("dlq"))["QueueUrl"]

    def arn(url):
        return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]

    assert refused(sqs.start_message_move_task, SourceArn=arn(dlq)) == "InvalidParameterValue", \
        "only a dead-letter queue is a source"
    sqs.set_queue_attributes(QueueUrl=source, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 1})})
    for i in range(3):
        sqs.send_message(QueueUrl=source, MessageBody=f"m{i}")
    sqs.receive_message(QueueUrl=source, MaxNumberOfMessages=10, VisibilityTimeout=0)
    sqs.receive_message(QueueUrl=source, MaxNumberOfMessages=10)  # moves all three to the DLQ
    attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["ApproximateNumberOfMessages"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "3"

    # Back where they came from (no destination), counted, and listed.
    handle = sqs.start_message_move_task(SourceArn=arn(dlq))["TaskHandle"]
    tasks = sqs.list_message_move_tasks(SourceArn=arn(dlq), MaxResults=10)["Results"]
    assert [(t["Status"], t["ApproximateNumberOfMessagesMoved"]) for t in tasks] == [("COMPLETED", 3)]
    back = sqs.receive_message(QueueUrl=source, MaxNumberOfMessages=10, WaitTimeSeconds=1)["Messages"]
    assert sorted(m["Body"] for m in back) == ["m0", "m1", "m2"]
    assert refused(sqs.cancel_message_move_task, TaskHandle=handle) == "ResourceNotFoundException", \
        "it has finished"

    # To a chosen destination.
    sqs.send_message(QueueUrl=dlq, MessageBody="direct")
    sqs.start_message_move_task(SourceArn=arn(dlq), DestinationArn=arn(other), MaxNumberOfMessagesPerSecond=10)
    assert sqs.receive_message(QueueUrl=other, WaitTimeSeconds=1)["Messages"][0]["Body"] == "direct"


def test_permissions_are_kept_in_the_policy(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="partner", AWSAccountIds=["123456789012"], Actions=["SendMessage"])
    assert refused(sqs.add_permission, QueueUrl=url, Label="partner", AWSAccountIds=["123456789012"],
                   Actions=["SendMessage"]) == "InvalidParameterValue"
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    statement = policy["Statement"][0]
    # A single value is a string, several an array, as AWS writes them.
    assert (statement["Sid"], statement["Action"], statement["Principal"]["AWS"]) == \
        ("partner", "SQS:SendMessage", "arn:aws:iam::123456789012:root")
    sqs.add_permission(QueueUrl=url, Label="two", AWSAccountIds=["123456789012", "210987654321"],
                       Actions=["SendMessage", "ReceiveMessage"])
    policy = json.loads(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"])
    assert policy["Statement"][1]["Action"] == ["SQS:SendMessage", "SQS:ReceiveMessage"]
    assert len(policy["Statement"][1]["Principal"]["AWS"]) == 2
    sqs.remove_permission(QueueUrl=url, Label="two")
    # At most seven actions; an empty account list is an invalid value.
    eight = ["SendMessage", "ReceiveMessage", "DeleteMessage", "ChangeMessageVisibility",
             "GetQueueAttributes", "GetQueueUrl", "ListDeadLetterSourceQueues", "PurgeQueue"]
    assert refused_with_status(sqs.add_permission, QueueUrl=url, Label="many", AWSAccountIds=["123456789012"],
                               Actions=eight) == ("OverLimit", 403)
    sqs.add_permission(QueueUrl=url, Label="seven", AWSAccountIds=["123456789012"], Actions=eight[:7])
    sqs.remove_permission(QueueUrl=url, Label="seven")
    assert refused(sqs.add_permission, QueueUrl=url, Label="none", AWSAccountIds=[],
                   Actions=["SendMessage"]) == "InvalidParameterValue"
    sqs.remove_permission(QueueUrl=url, Label="partner")
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})
    assert refused(sqs.remove_permission, QueueUrl=url, Label="partner") == "InvalidParameterValue"


def test_a_queue_whose_dead_letter_queue_is_gone_still_takes_other_changes(sqs):
    dlq = sqs.create_queue(QueueName=name())["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "3"})
    url = sqs.create_queue(QueueName=name(), Attributes={"RedrivePolicy": policy})["QueueUrl"]
    sqs.delete_queue(QueueUrl=dlq)
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "45"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    # Setting the policy itself is still checked.
    assert refused(sqs.set_queue_attributes, QueueUrl=url,
                   Attributes={"RedrivePolicy": policy}) == "InvalidParameterValue"


def test_all_attributes_include_sqs_managed_encryption(sqs):
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["SqsManagedSseEnabled"] == "true"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["SqsManagedSseEnabled"] == "false"
    kms = sqs.create_queue(QueueName=name(), Attributes={"KmsMasterKeyId": "alias/aws/sqs"})["QueueUrl"]
    attrs = sqs.get_queue_attributes(QueueUrl=kms, AttributeNames=["All"])["Attributes"]
    assert attrs["SqsManagedSseEnabled"] == "false"


def test_a_fifo_receive_retried_with_its_attempt_id(sqs):
    url = sqs.create_queue(QueueName=name() + ".fifo",
                           Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, ReceiveRequestAttemptId="attempt-1")["Messages"]
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, ReceiveRequestAttemptId="attempt-1")["Messages"]
    assert [(m["Body"], m["ReceiptHandle"]) for m in again] == [(m["Body"], m["ReceiptHandle"]) for m in first]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, ReceiveRequestAttemptId="attempt-2"), \
        "a new attempt sees the group in flight"


def test_hostile_values_get_a_clear_400_without_being_echoed_and_the_engine_lives(sqs, tenant_a, tenant_b):
    huge = "x" * 200_000
    url = sqs.create_queue(QueueName=name())["QueueUrl"]
    fifo = sqs.create_queue(QueueName=name() + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    calls = [
        lambda: sqs.add_permission(QueueUrl=url, Label=huge, AWSAccountIds=["123456789012"], Actions=["SendMessage"]),
        lambda: sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=[huge], Actions=["SendMessage"]),
        lambda: sqs.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["123456789012"], Actions=[huge]),
        lambda: sqs.send_message(QueueUrl=fifo, MessageBody="x", MessageGroupId=huge, MessageDeduplicationId="d"),
        lambda: sqs.receive_message(QueueUrl=fifo, ReceiveRequestAttemptId=huge),
        lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageSystemAttributes={
            "AWSTraceHeader": {"DataType": "String", "StringValue": "t" * 20_000}}),
    ]
    for call in calls:
        with pytest.raises(ClientError) as e:
            call()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert code(e) in ("InvalidParameterValue", "InvalidParameterValueException"), e.value.response["Error"]
        assert len(e.value.response["Error"]["Message"]) < 1000, "the value is not sent back whole"
    # Another tenant's queue is not this tenant's to redrive.
    other = sqs_client(tenant_b)
    b_dlq = other.create_queue(QueueName=name("b-dlq"))["QueueUrl"]
    b_arn = other.get_queue_attributes(QueueUrl=b_dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    assert refused(sqs.start_message_move_task, SourceArn=b_arn) == "ResourceNotFoundException"
    assert refused(sqs.set_queue_attributes, QueueUrl=url, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": b_arn, "maxReceiveCount": 1})}) == "InvalidParameterValue"
    # The engine still answers.
    sqs.send_message(QueueUrl=url, MessageBody="alive")
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "alive"


def test_a_dataflow_with_a_bad_sqs_connector_is_a_422(sless):
    for config in [
        {"queueUrl": "ftp://x/q", "accessKeyId": "k", "secretAccessKey": "s"},
        {"queueUrl": "x" * 5000, "accessKeyId": "k", "secretAccessKey": "s"},
        {"queueUrl": "http://h/q"},
        {"queueUrl": "http://h/q", "accessKeyId": "k", "secretAccessKey": "s", "waitTimeSeconds": 99},
        {"queueUrl": "http://h/q", "accessKeyId": "k", "secretAccessKey": "s", "nested": {"a": [[[[]]]]}},
    ]:
        good = {"queueUrl": "http://h/q", "accessKeyId": "k", "secretAccessKey": "s"}
        spec = {"name": f"bad-{uuid.uuid4().hex[:6]}", "source": {"type": "sqs", "config": config},
                "sink": {"type": "sqs", "config": good}}
        response = sless.rest("a", "POST", "/dataflows", spec)
        assert response.status_code == 422, (config, response.text)
        assert "source.config" in response.text and "sink" not in response.text, response.text
    spec = {"name": "bad-sink", "source": {"type": "sqs", "config": good},
            "sink": {"type": "sqs", "config": {**good, "visibilityTimeout": 5}}}
    response = sless.rest("a", "POST", "/dataflows", spec)
    assert response.status_code == 422 and "sink.config.visibilityTimeout" in response.text, response.text
    assert sless.rest("a", "GET", "/dataflows").status_code == 200, "the API still answers"
