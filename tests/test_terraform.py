"""The Terraform provider with the real Terraform CLI (1.0.3, protocol 6),
offline through `dev_overrides`, against a `sless dev` started here."""

import json
import os
import pathlib
import subprocess
import time

import pytest

from conftest import REGION, TOKENS, sqs_client
from tests.terraform_cli import QUEUE, TERRAFORM, Terraform
from tests.nessie_server import NessieServer
from tests.trino_server import TrinoServer


def psql(sql):
    dsn = os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test")
    subprocess.run(["psql", dsn, "-q", "-c", sql], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module", autouse=True)
def orders_table():
    """The source table the dataflow examples read."""
    psql("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, card text)")


class DevTerraform(Terraform):
    """Against this module's `sless dev`, whose REST API the tests read too."""

    def __init__(self, sless):
        super().__init__(sless.api, TOKENS["a"])
        self.sless = sless


@pytest.fixture
def tf(sless):
    tf = DevTerraform(sless)
    yield tf
    tf.remove()


def assert_no_resource_changes(plan):
    """After `state rm` and import, outputs are re-saved on the next apply;
    the resource itself must match its configuration."""
    assert plan.returncode in (0, 2), plan.stderr
    for action in ("will be created", "will be updated", "must be replaced", "will be destroyed"):
        assert action not in plan.stdout, plan.stdout


def test_queue_service_lifecycle(tf):
    tf.write(QUEUE % ("tf-queues", 128))
    tf.apply()
    out = tf.outputs()
    assert out["endpoint"]["value"].endswith("/sqs/a")
    assert out["region"]["value"] == REGION, "the region queue ARNs carry, for the SDKs"
    assert out["access_key"]["sensitive"] and out["secret_key"]["sensitive"]
    shown = tf.run("show").stdout
    assert "SQSAKa_" not in shown and "(sensitive value)" in shown, "keys stay sensitive"
    # The outputs work with the unmodified AWS SDK.
    view = {"endpoint": out["endpoint"]["value"], "accessKey": out["access_key"]["value"],
            "secretKey": out["secret_key"]["value"]}
    sqs = sqs_client(view)
    url = sqs.create_queue(QueueName="from-terraform")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hi")
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)["Messages"][0]["Body"] == "hi"

    assert tf.plan_exit().returncode == 0, "a second plan shows no changes"

    tf.write(QUEUE % ("tf-queues", 256))
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "update in-place" in plan.stdout, plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/queue-services/tf-queues").json()["memoryMB"] == 256
    assert tf.outputs()["access_key"]["value"] == view["accessKey"], "keys survive an in-place update"

    # Durability changes in place: the engine restarts on the same journal.
    sqs.send_message(QueueUrl=url, MessageBody="kept")
    tf.write((QUEUE % ("tf-queues", 256)).replace("memory_mb = 256", 'memory_mb = 256\n  durability = "process"'))
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "update in-place" in plan.stdout and '"disk" -> "process"' in plan.stdout, plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/queue-services/tf-queues").json()["durability"] == "process"
    assert tf.plan_exit().returncode == 0, "a second plan shows no changes"
    deadline = time.time() + 20
    bodies = set()
    while "kept" not in bodies:
        try:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            bodies |= {m["Body"] for m in got.get("Messages", [])}
        except Exception:
            pass  # the old engine has stopped; the new one is opening the journal
        assert time.time() < deadline, f"the message sent before the change did not come back: {bodies}"

    # Replicas change in place: three `sless queue` processes take over the
    # same queues; left out of the configuration, the server's value stays.
    sqs.send_message(QueueUrl=url, MessageBody="replicated")
    process = (QUEUE % ("tf-queues", 256)).replace("memory_mb = 256", 'memory_mb = 256\n  durability = "process"')
    tf.write(process.replace('durability = "process"', 'durability = "process"\n  replicas = 3'))
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "update in-place" in plan.stdout and "1 -> 3" in plan.stdout, plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/queue-services/tf-queues").json()["replicas"] == 3
    assert tf.plan_exit().returncode == 0, "a second plan shows no changes"
    tf.write(process)
    assert tf.plan_exit().returncode == 0, "replicas left out keep the server's value"
    deadline = time.time() + 20
    bodies = set()
    while "replicated" not in bodies:
        try:
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            bodies |= {m["Body"] for m in got.get("Messages", [])}
        except Exception:
            pass  # the replicas are electing a leader
        assert time.time() < deadline, f"the message sent before three replicas did not come back: {bodies}"
    tf.write(process.replace('durability = "process"', 'durability = "process"\n  replicas = 2'))
    plan = tf.plan_exit()
    assert plan.returncode == 1 and "Invalid replicas" in plan.stderr and "1 or 3" in plan.stderr, plan.stderr

    # The service's own rate through the gateways changes in place, and
    # left out again returns to the platform's default (the update is a PUT).
    rated = process.replace('durability = "process"', 'durability = "process"\n  requests_per_second = 50')
    tf.write(rated)
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "update in-place" in plan.stdout and "+ requests_per_second" in plan.stdout, \
        plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/queue-services/tf-queues").json()["requestsPerSecond"] == 50
    assert tf.plan_exit().returncode == 0, "a second plan shows no changes"
    tf.write(rated.replace("= 50", "= 0"))
    plan = tf.plan_exit()
    assert plan.returncode == 1 and "Invalid requests_per_second" in plan.stderr, plan.stderr
    tf.write(process)
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "- requests_per_second" in plan.stdout, plan.stdout
    tf.apply()
    view = tf.sless.rest("a", "GET", "/queue-services/tf-queues").json()
    assert "requestsPerSecond" not in view and view["replicas"] == 3 and view["durability"] == "process", view
    assert tf.plan_exit().returncode == 0, "a second plan shows no changes"

    tf.write(QUEUE % ("tf-renamed", 256))
    plan = tf.plan_exit()
    assert "forces replacement" in plan.stdout, plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/queue-services/tf-queues").status_code == 404
    assert tf.sless.rest("a", "GET", "/queue-services/tf-renamed").json()["phase"] == "Ready"

    # Deleted outside Terraform: the next plan recreates it.
    assert tf.sless.rest("a", "DELETE", "/queue-services/tf-renamed").status_code == 204
    plan = tf.plan_exit()
    assert plan.returncode == 2 and "will be created" in plan.stdout, plan.stdout
    tf.apply()

    # Import by name, then destroy. (A timeouts block lives only in
    # configuration, so an import cannot bring it back: leave it out.)
    tf.write((QUEUE % ("tf-renamed", 256)).replace('timeouts {\n    create = "2m"\n  }', ""))
    tf.run("state", "rm", "sless_queue_service.main")
    tf.run("import", "sless_queue_service.main", "tf-renamed")
    assert_no_resource_changes(tf.plan_exit())
    tf.apply()
    assert tf.plan_exit().returncode == 0
    tf.run("destroy", "-auto-approve")
    assert tf.sless.rest("a", "GET", "/queue-services/tf-renamed").status_code == 404


DATAFLOW = """
resource "sless_dataflow" "orders" {
  name   = "orders-to-dwh"
  source = {
    type   = "postgresql"
    config = %s
  }
  sink = {
    type   = "postgresql"
    config = jsonencode({ connectionString = "postgres://postgres@127.0.0.1/test", table = "orders_copy", autoCreateTable = true })
  }
  transformations = [
    { type = "mask", config = jsonencode({ fields = ["card"], keepLength = true }) },
  ]
  channel_buffer_size = %d
  processor_limits    = { memory = "256Mi" }
}
data "sless_dataflow" "orders" {
  name       = sless_dataflow.orders.name
}
output "phase"       { value = sless_dataflow.orders.phase }
output "data_source" { value = data.sless_dataflow.orders.transformations[0].type }
"""

SOURCE_HAND_WRITTEN = r'"{ \"table\": \"orders\",   \"connectionString\": \"postgres://postgres@127.0.0.1/test\" }"'
SOURCE_JSONENCODE = 'jsonencode({ connectionString = "postgres://postgres@127.0.0.1/test", table = "orders" })'


def test_dataflow_lifecycle_json_normalisation_and_import(tf):
    tf.write(DATAFLOW % (SOURCE_HAND_WRITTEN, 100))
    tf.apply()
    out = tf.outputs()
    assert out["phase"]["value"] == "Running", "the dataflow runs"
    assert out["data_source"]["value"] == "mask"
    view = tf.sless.rest("a", "GET", "/dataflows/orders-to-dwh").json()
    assert view["source"]["config"] == {"table": "orders", "connectionString": "postgres://postgres@127.0.0.1/test"}
    assert view["resources"] == {"limits": {"memory": "256Mi"}}, "the processor's limits reach the spec"
    # Key order and whitespace of the config string never show a diff.
    assert tf.plan_exit().returncode == 0

    tf.write(DATAFLOW % (SOURCE_JSONENCODE, 500))
    plan = tf.plan_exit()
    assert "update in-place" in plan.stdout and "channel_buffer_size" in plan.stdout, plan.stdout
    tf.apply()
    assert tf.sless.rest("a", "GET", "/dataflows/orders-to-dwh").json()["channelBufferSize"] == 500
    assert tf.plan_exit().returncode == 0

    tf.run("state", "rm", "sless_dataflow.orders")
    tf.run("import", "sless_dataflow.orders", "orders-to-dwh")
    assert_no_resource_changes(tf.plan_exit())
    tf.run("destroy", "-auto-approve")
    assert tf.sless.rest("a", "GET", "/dataflows/orders-to-dwh").status_code == 404


@pytest.fixture(scope="module")
def trino():
    server = TrinoServer()
    yield server
    server.stop()


TRINO_DATAFLOW = """
resource "sless_dataflow" "to_trino" {
  name   = "orders-to-trino"
  source = {
    type   = "postgresql"
    config = jsonencode({ connectionString = "postgres://postgres@127.0.0.1/test", table = "orders", pollInterval = 1 })
  }
  sink = {
    type   = "trino"
    config = jsonencode({ serverURL = "%s", catalog = "memory", schema = "default", table = "tf_orders", autoCreateTable = true })
  }
}
output "phase" { value = sless_dataflow.to_trino.phase }
"""


def test_a_dataflow_into_trino_from_terraform(tf, trino):
    """A Trino sink ordered with `terraform apply` against a real Trino:
    the rows arrive, a second plan is empty, destroy removes the flow."""
    psql("INSERT INTO orders (card) SELECT 'card ' || g FROM generate_series(1, 5) g")
    want = int(subprocess.run(["psql", os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test"),
                               "-Atc", "SELECT count(*) FROM orders"],
                              check=True, capture_output=True, text=True).stdout)
    tf.write(TRINO_DATAFLOW % trino.url)
    tf.apply()
    assert tf.outputs()["phase"]["value"] == "Running"
    deadline = time.time() + 30
    while True:
        got = trino.query("SELECT count(*) FROM tf_orders")[0][0] if trino.query(
            "SHOW TABLES LIKE 'tf_orders'") else 0
        if got == want or time.time() > deadline:
            break
        time.sleep(0.5)
    assert got == want, f"{got} of {want} rows in Trino"
    doc = json.loads(trino.query("SELECT data FROM tf_orders LIMIT 1")[0][0])
    assert set(doc) == {"id", "card"}, doc
    assert tf.plan_exit().returncode == 0
    tf.run("destroy", "-auto-approve")
    assert tf.sless.rest("a", "GET", "/dataflows/orders-to-trino").status_code == 404


@pytest.fixture(scope="module")
def nessie():
    server = NessieServer()
    yield server
    server.stop()


NESSIE_DATAFLOW = """
resource "sless_dataflow" "to_nessie" {
  name   = "orders-to-nessie"
  source = {
    type   = "postgresql"
    config = jsonencode({ connectionString = "postgres://postgres@127.0.0.1/test", table = "orders", pollInterval = 1 })
  }
  sink = {
    type   = "nessie"
    config = jsonencode({
      nessieUrl          = "%s"
      namespace          = "tf"
      table              = "orders"
      autoCreateTable    = true
      awsRegion          = "us-east-1"
      awsAccessKeyID     = "testing"
      awsSecretAccessKey = "testing"
    })
  }
}
output "phase" { value = sless_dataflow.to_nessie.phase }
"""


def test_a_dataflow_into_nessie_from_terraform(tf, trino, nessie):
    """A Nessie sink ordered with `terraform apply` against a real Nessie:
    the namespace and table are made, the rows arrive as Trino's Iceberg
    connector reads them, the flow's exactly-once position is a table
    property, a second plan is empty, destroy removes the flow and the
    property."""
    trino.add_iceberg(nessie)
    psql("INSERT INTO orders (card) SELECT 'card ' || g FROM generate_series(1, 5) g")
    want = int(subprocess.run(["psql", os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test"),
                               "-Atc", "SELECT count(*) FROM orders"],
                              check=True, capture_output=True, text=True).stdout)
    tf.write(NESSIE_DATAFLOW % nessie.api_url)
    tf.apply()
    assert tf.outputs()["phase"]["value"] == "Running"
    deadline = time.time() + 30
    while True:
        got = trino.query("SELECT count(*) FROM iceberg.tf.orders")[0][0] if trino.query(
            "SHOW TABLES FROM iceberg.tf LIKE 'orders'") else 0
        if got == want or time.time() > deadline:
            break
        time.sleep(0.5)
    assert got == want, f"{got} of {want} rows in the Iceberg table"
    doc = json.loads(trino.query("SELECT data FROM iceberg.tf.orders LIMIT 1")[0][0])
    assert set(doc) == {"id", "card"}, doc
    positions = "SELECT count(*) FROM iceberg.tf.\"orders$properties\" WHERE key LIKE 'sless.position.%'"
    assert trino.query(positions) == [[1]]
    assert tf.plan_exit().returncode == 0
    tf.run("destroy", "-auto-approve")
    assert tf.sless.rest("a", "GET", "/dataflows/orders-to-nessie").status_code == 404
    deadline = time.time() + 30
    while trino.query(positions) != [[0]] and time.time() < deadline:
        time.sleep(0.5)
    assert trino.query(positions) == [[0]], "the deleted flow's position is removed from the table"


def test_queue_service_data_source(tf, tenant_b):
    tf.env["SLESS_TOKEN"] = TOKENS["b"]
    tf.write("""
        data "sless_queue_service" "existing" { name = "main" }
        output "endpoint" { value = data.sless_queue_service.existing.endpoint }
    """)
    tf.apply()
    assert tf.outputs()["endpoint"]["value"] == tenant_b["endpoint"]


def test_errors_are_readable(tf):
    tf.write(QUEUE % ("bad-token", 64))
    out = tf.apply(check=False, env={"SLESS_TOKEN": "not-a-valid-token-at-all"})
    assert out.returncode != 0
    assert "401 unauthorized: invalid token" in out.stderr, out.stderr

    out = tf.run("plan", check=False, env={"SLESS_ENDPOINT": ""})
    assert out.returncode != 0 and "Missing sless API endpoint" in out.stderr, out.stderr

    tf.write(QUEUE % ("too-big", 4096))
    out = tf.run("plan", check=False)
    assert out.returncode != 0 and "Invalid memory_mb" in out.stderr, out.stderr
    tf.write((QUEUE % ("no-fsync", 64)).replace("memory_mb = 64", 'memory_mb = 64\n  persistence = false\n  durability = "process"'))
    out = tf.run("plan", check=False)
    assert out.returncode != 0 and "Invalid durability" in out.stderr, out.stderr

    tf.write("""
        resource "sless_dataflow" "bad" {
          name   = "bad-flow"
          source = { type = "postgresql", config = jsonencode({ table = "t", connectionString = "c" }) }
          sink   = { type = "postgresql", config = jsonencode({ table = "u", connectionString = "c" }) }
          transformations = [{ type = "explode", config = jsonencode({}) }]
        }
    """)
    out = tf.apply(check=False)
    assert out.returncode != 0
    assert "422 validation_failed" in out.stderr and "transformations[0].type" in out.stderr, out.stderr
    assert tf.sless.rest("a", "GET", "/dataflows/bad-flow").status_code == 404, "a bad spec creates nothing"

    tf.write("""
        resource "sless_dataflow" "bad" {
          name   = "bad-json"
          source = { type = "postgresql", config = "{not json" }
          sink   = { type = "postgresql", config = jsonencode({ table = "u", connectionString = "c" }) }
        }
    """)
    out = tf.run("plan", check=False)
    assert out.returncode != 0 and "Invalid source.config" in out.stderr, out.stderr


def test_provider_block_overrides_the_environment(tf):
    tf.write('output "ok" { value = data.sless_queue_service.b.name }\ndata "sless_queue_service" "b" { name = "main" }',
             provider=f'provider "sless" {{\n  endpoint = "{tf.sless.api}"\n  token = "{TOKENS["b"]}"\n}}')
    tf.sless.queue_service("b")
    out = tf.apply(env={"SLESS_ENDPOINT": "http://127.0.0.1:1", "SLESS_TOKEN": "wrong-token-wrong-token"})
    assert "Apply complete" in out.stdout


EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def test_examples_work_as_documented(tf):
    (tf.work / "main.tf").write_text((EXAMPLES / "queue-service" / "main.tf").read_text())
    tf.apply()
    printed = subprocess.run(["python3", str(EXAMPLES / "boto3" / "send_receive.py"), str(tf.work)],
                             env={**tf.env, "TERRAFORM": TERRAFORM}, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == "hello from managed SQS"
    tf.run("destroy", "-auto-approve")

    (tf.work / "main.tf").write_text((EXAMPLES / "dataflow" / "main.tf").read_text())
    tf.run("validate")
    tf.apply()
    assert tf.outputs()["phase"]["value"] == "Running"
    assert tf.plan_exit().returncode == 0
    tf.run("destroy", "-auto-approve")
