"""Uses the outputs of examples/queue-service with the unmodified boto3.

Run from examples/queue-service after `terraform apply`:
    python3 ../boto3/send_receive.py
"""

import json
import os
import subprocess
import sys

import boto3


def outputs(directory="."):
    terraform = os.environ.get("TERRAFORM", "terraform")
    text = subprocess.run([terraform, "output", "-json"], cwd=directory, check=True,
                          capture_output=True, text=True).stdout
    return {name: value["value"] for name, value in json.loads(text).items()}


def main(directory="."):
    out = outputs(directory)
    sqs = boto3.client(
        "sqs",
        endpoint_url=out["sqs_endpoint"],
        region_name="ru-msk-1",
        aws_access_key_id=out["sqs_access_key"],
        aws_secret_access_key=out["sqs_secret_key"],
    )
    url = sqs.create_queue(QueueName="example")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello from managed SQS")
    message = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    print(message["Body"])


if __name__ == "__main__":
    main(*sys.argv[1:])
