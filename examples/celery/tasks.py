"""A Celery app on a sless queue service, from nothing but its broker URL.

The broker URL names the gateway's host and port and carries the tenant's
keys; the gateway learns the tenant from the access key, so no path is
needed (kombu cannot put one in a broker URL):

    export SLESS_SQS_HOST=127.0.0.1:9324         # the gateway (sless dev prints it)
    export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...   # the Terraform outputs
    celery -A tasks worker --pool solo            # in one shell
    python3 -c 'import tasks; tasks.add.delay(2, 3)'   # in another

Behind TLS (a cluster's https://sqs.example.com) set SLESS_SQS_SECURE=1 and
SLESS_SQS_HOST=sqs.example.com:443.
"""

import os
from urllib.parse import quote

from celery import Celery

HOST = os.environ.get("SLESS_SQS_HOST", "127.0.0.1:9324")
KEY = quote(os.environ["AWS_ACCESS_KEY_ID"], safe="")
SECRET = quote(os.environ["AWS_SECRET_ACCESS_KEY"], safe="")

app = Celery("tasks", broker=f"sqs://{KEY}:{SECRET}@{HOST}")
app.conf.broker_transport_options = {
    "region": os.environ.get("SLESS_SQS_REGION", "ru-msk-1"),
    "is_secure": os.environ.get("SLESS_SQS_SECURE") == "1",
    "queue_name_prefix": os.environ.get("SLESS_SQS_QUEUE_PREFIX", ""),
    "wait_time_seconds": 1,
    "polling_interval": 0.2,
}
app.conf.task_default_queue = "celery"
app.conf.worker_hijack_root_logger = False
DONE = os.environ.get("SLESS_CELERY_DONE")


@app.task
def add(x, y):
    """Adds, and records each run (the test counts them)."""
    if DONE:
        with open(DONE, "a", encoding="utf-8") as f:
            f.write(f"{x}+{y}={x + y}\n")
    return x + y
