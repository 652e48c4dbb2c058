"""The gateway verifies AWS Signature V4 and keeps tenants apart."""

import datetime
import json
import xml.etree.ElementTree as ET

import pytest
from botocore.exceptions import ClientError

from conftest import sqs_client
from sigv4 import signed_post

JSON_HEADERS = {"content-type": "application/x-amz-json-1.0", "x-amz-target": "AmazonSQS.ListQueues"}


def rejected(client):
    with pytest.raises(ClientError) as e:
        client.list_queues()
    return e.value.response["Error"]["Code"], e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_wrong_secret_is_rejected(tenant_a):
    assert rejected(sqs_client(tenant_a, secret="not-the-secret")) == ("SignatureDoesNotMatch", 403)


def test_unknown_access_key_is_rejected(tenant_a):
    client = sqs_client(tenant_a, access_key="SQSAKa_unknown1")
    assert rejected(client) == ("InvalidClientTokenId", 403)


def test_keys_of_tenant_a_do_not_open_tenant_b(tenant_a, tenant_b):
    # A's valid keys, signed correctly, at B's path.
    client = sqs_client(tenant_a, endpoint=tenant_b["endpoint"])
    assert rejected(client) == ("InvalidClientTokenId", 403)
    # And B's queues stay B's.
    b = sqs_client(tenant_b)
    url = b.create_queue(QueueName="private")["QueueUrl"]
    b.send_message(QueueUrl=url, MessageBody="b's secret")
    a = sqs_client(tenant_a)
    assert "QueueUrls" not in a.list_queues(QueueNamePrefix="private")
    with pytest.raises(a.exceptions.QueueDoesNotExist):
        a.receive_message(QueueUrl=url.replace("/sqs/b/", "/sqs/a/"))


def test_expired_and_future_requests_are_rejected(tenant_a):
    body = b"{}"
    for skew in (-20, 20):
        when = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=skew)
        r = signed_post(tenant_a["endpoint"], body, tenant_a["accessKey"], tenant_a["secretKey"],
                        headers=JSON_HEADERS, when=when)
        assert r.status_code == 403, r.text
        assert r.json()["__type"].endswith("#SignatureDoesNotMatch")
        assert "15 minutes" in r.json()["message"]
    # Inside the ±15 minute window it is accepted.
    when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
    r = signed_post(tenant_a["endpoint"], body, tenant_a["accessKey"], tenant_a["secretKey"], headers=JSON_HEADERS, when=when)
    assert r.status_code == 200, r.text


def test_tampered_body_and_missing_signature(tenant_a):
    import requests
    r = requests.post(tenant_a["endpoint"], data=b"{}", headers=JSON_HEADERS, timeout=10)
    assert r.status_code == 403
    assert r.json()["__type"].endswith("#MissingAuthenticationToken")
    # Signed for one body, sent with another: the payload hash no longer matches.
    good = signed_post(tenant_a["endpoint"], b"{}", tenant_a["accessKey"], tenant_a["secretKey"], headers=JSON_HEADERS)
    assert good.status_code == 200
    req = good.request
    tampered = requests.post(tenant_a["endpoint"], data=b'{"QueueNamePrefix": "x"}', headers=dict(req.headers), timeout=10)
    assert tampered.status_code == 403
    assert tampered.json()["__type"].endswith("#SignatureDoesNotMatch")


def test_query_protocol_errors_are_xml(tenant_a):
    body = b"Action=ListQueues&Version=2012-11-05"
    r = signed_post(tenant_a["endpoint"], body, tenant_a["accessKey"], "wrong",
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 403
    error = ET.fromstring(r.text).find("{*}Error")
    assert error.find("{*}Code").text == "SignatureDoesNotMatch"
    assert error.find("{*}Type").text == "Sender"


def test_error_responses_never_contain_the_secret(tenant_a):
    r = sqs_client(tenant_a, secret="wrong")
    with pytest.raises(ClientError) as e:
        r.list_queues()
    assert tenant_a["secretKey"] not in json.dumps(e.value.response)
