"""Older clients: the AWS CLI v1, and the query protocol with XML responses."""

import json
import os
import pathlib
import shutil
import subprocess
import sysconfig
import urllib.parse
import uuid
import xml.etree.ElementTree as ET

from conftest import account_id
from sigv4 import signed_post

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"
AWS = shutil.which("aws") or str(pathlib.Path(sysconfig.get_path("scripts")) / "aws")


def aws(view, *args):
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID=view["accessKey"],
        AWS_SECRET_ACCESS_KEY=view["secretKey"],
        AWS_DEFAULT_REGION="ru-msk-1",
        AWS_CONFIG_FILE="/dev/null",
        AWS_SHARED_CREDENTIALS_FILE="/dev/null",
    )
    out = subprocess.run(
        [AWS, "sqs", *args, "--endpoint-url", view["endpoint"], "--output", "json"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    return out


def test_aws_cli_v1(tenant_a):
    q = f"cli-{uuid.uuid4().hex[:8]}"
    created = aws(tenant_a, "create-queue", "--queue-name", q)
    assert created.returncode == 0, created.stderr
    url = json.loads(created.stdout)["QueueUrl"]
    assert url.startswith(tenant_a["endpoint"])
    sent = aws(tenant_a, "send-message", "--queue-url", url, "--message-body", "hello from managed SQS")
    assert sent.returncode == 0, sent.stderr
    got = aws(tenant_a, "receive-message", "--queue-url", url, "--wait-time-seconds", "2")
    message = json.loads(got.stdout)["Messages"][0]
    assert message["Body"] == "hello from managed SQS"
    assert aws(tenant_a, "delete-message", "--queue-url", url, "--receipt-handle", message["ReceiptHandle"]).returncode == 0
    listed = json.loads(aws(tenant_a, "list-queues", "--queue-name-prefix", q).stdout)
    assert listed["QueueUrls"] == [url]
    missing = aws(tenant_a, "get-queue-url", "--queue-name", "does-not-exist")
    assert missing.returncode != 0
    assert "NonExistentQueue" in missing.stderr


def query(view, **params):
    body = urllib.parse.urlencode({**params, "Version": "2012-11-05"}).encode()
    r = signed_post(view["endpoint"], body, view["accessKey"], view["secretKey"],
                    headers={"content-type": "application/x-www-form-urlencoded"})
    return r.status_code, ET.fromstring(r.text)


def test_query_protocol_with_xml(tenant_a):
    q = f"query-{uuid.uuid4().hex[:8]}"
    status, doc = query(tenant_a, Action="CreateQueue", QueueName=q,
                        **{"Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "9"})
    assert status == 200, ET.tostring(doc)
    url = doc.find(f"{NS}CreateQueueResult/{NS}QueueUrl").text
    assert url == f"{tenant_a['endpoint']}/{account_id('a')}/{q}"
    assert doc.find(f"{NS}ResponseMetadata/{NS}RequestId").text

    status, doc = query(tenant_a, Action="SendMessage", QueueUrl=url, MessageBody="<xml & body>",
                        **{"MessageAttribute.1.Name": "k", "MessageAttribute.1.Value.DataType": "String",
                           "MessageAttribute.1.Value.StringValue": "v"})
    assert status == 200
    result = doc.find(f"{NS}SendMessageResult")
    assert len(result.find(f"{NS}MD5OfMessageBody").text) == 32
    assert result.find(f"{NS}MD5OfMessageAttributes") is not None

    status, doc = query(tenant_a, Action="SendMessageBatch", QueueUrl=url,
                        **{"SendMessageBatchRequestEntry.1.Id": "one", "SendMessageBatchRequestEntry.1.MessageBody": "1",
                           "SendMessageBatchRequestEntry.2.Id": "two", "SendMessageBatchRequestEntry.2.MessageBody": "2"})
    entries = doc.findall(f"{NS}SendMessageBatchResult/{NS}SendMessageBatchResultEntry")
    assert sorted(e.find(f"{NS}Id").text for e in entries) == ["one", "two"]

    status, doc = query(tenant_a, Action="ReceiveMessage", QueueUrl=url, MaxNumberOfMessages="10",
                        **{"AttributeName.1": "All", "MessageAttributeName.1": "All"})
    messages = doc.findall(f"{NS}ReceiveMessageResult/{NS}Message")
    bodies = sorted(m.find(f"{NS}Body").text for m in messages)
    assert bodies == ["1", "2", "<xml & body>"]
    first = next(m for m in messages if m.find(f"{NS}Body").text == "<xml & body>")
    attr = first.find(f"{NS}MessageAttribute")
    assert attr.find(f"{NS}Name").text == "k"
    assert attr.find(f"{NS}Value/{NS}StringValue").text == "v"
    names = {a.find(f"{NS}Name").text for a in first.findall(f"{NS}Attribute")}
    assert {"SentTimestamp", "ApproximateReceiveCount"} <= names

    status, doc = query(tenant_a, Action="DeleteMessage", QueueUrl=url,
                        ReceiptHandle=first.find(f"{NS}ReceiptHandle").text)
    assert status == 200 and doc.tag == f"{NS}DeleteMessageResponse"

    status, doc = query(tenant_a, Action="GetQueueAttributes", QueueUrl=url, **{"AttributeName.1": "All"})
    attrs = {a.find(f"{NS}Name").text: a.find(f"{NS}Value").text
             for a in doc.findall(f"{NS}GetQueueAttributesResult/{NS}Attribute")}
    assert attrs["VisibilityTimeout"] == "9"
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "2"

    status, doc = query(tenant_a, Action="GetQueueUrl", QueueName="nope")
    assert status == 400
    assert doc.find(f"{NS}Error/{NS}Code").text == "AWS.SimpleQueueService.NonExistentQueue"
    status, doc = query(tenant_a, Action="Frobnicate")
    assert status == 400 and doc.find(f"{NS}Error/{NS}Code").text == "InvalidAction"
