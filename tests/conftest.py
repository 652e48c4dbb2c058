"""Fixtures that run the real `sless dev` binary on loopback ports.

Each test module gets its own `sless dev` process with a fresh data dir and
two tenants, `a` and `b`; each tenant's queue service is created through the
REST API and awaited until Ready, then boto3 talks to its endpoint.
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import boto3
import pytest
import requests

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
BINARY = pathlib.Path(os.environ.get("SLESS_BINARY", TARGET / "debug" / "sless"))
TOKENS = {"a": "tenant-a-token-0123456789", "b": "tenant-b-token-0123456789"}
REGION = "ru-msk-1"


class Sless:
    """A running `sless dev`; `restart()` keeps its data dir."""

    def __init__(self, data_dir, flags=()):
        self.data_dir = data_dir
        self.flags = list(flags)
        self.proc = None
        self.api = None
        # Fixed ports, so a restart keeps every endpoint a client holds. A
        # port found free can be taken (by any client's outgoing connection)
        # before sless binds it: the first start tries fresh ports then.
        for attempt in range(5):
            self.ports = [free_port() for _ in range(3)]
            try:
                self.start()
                return
            except AssertionError:
                self.stop()
                if attempt == 4:
                    raise

    def start(self):
        cmd = [
            str(BINARY), "dev",
            "--listen", f"127.0.0.1:{self.ports[0]}",
            "--control-plane-listen", f"127.0.0.1:{self.ports[1]}",
            "--gateway-listen", f"127.0.0.1:{self.ports[2]}",
            "--data-dir", str(self.data_dir),
        ]
        for tenant, token in TOKENS.items():
            cmd += ["--tenant", f"{tenant}={token}"]
        cmd += self.flags
        env = dict(os.environ, SLESS_LOG="warn")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        for line in self.proc.stdout:
            if line.startswith("export SLESS_ENDPOINT="):
                self.api = line.split("=", 1)[1].strip()
            if line.startswith("export SLESS_TOKEN="):
                break
        assert self.api, "sless dev printed no endpoint"

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def restart(self):
        self.start()

    def rest(self, tenant, method, path, body=None):
        headers = {"Authorization": f"Bearer {TOKENS[tenant]}"}
        return requests.request(method, f"{self.api}/api/v1{path}", json=body, headers=headers, timeout=10)

    def queue_service(self, tenant, name="main", **spec):
        """Creates (if needed) and awaits a Ready queue service; returns its view."""
        created = self.rest(tenant, "POST", "/queue-services", {"name": name, **spec})
        assert created.status_code in (201, 409), created.text
        return self.wait_ready(tenant, name)

    def wait_ready(self, tenant, name, timeout=20):
        deadline = time.time() + timeout
        view = None
        while time.time() < deadline:
            view = self.rest(tenant, "GET", f"/queue-services/{name}").json()
            if view.get("phase") == "Ready":
                return view
            time.sleep(0.1)
        raise AssertionError(f"queue service not Ready: {view}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def account_id(tenant):
    """A tenant's 12-digit account id, as sless derives it (sless_sqs::credentials::account_id)."""
    return f"{int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], 'big') % 10**12:012d}"


def sqs_client(view, secret=None, access_key=None, endpoint=None, config=None):
    return boto3.client(
        "sqs",
        endpoint_url=endpoint or view["endpoint"],
        region_name=REGION,
        aws_access_key_id=access_key or view["accessKey"],
        aws_secret_access_key=secret or view["secretKey"],
        config=config,
    )


@pytest.fixture(scope="module")
def sless():
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build` first")
    data_dir = pathlib.Path(tempfile.mkdtemp(prefix="sless-e2e-"))
    server = Sless(data_dir)
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def tenant_a(sless):
    return sless.queue_service("a")


@pytest.fixture(scope="module")
def tenant_b(sless):
    return sless.queue_service("b")


@pytest.fixture
def sqs(tenant_a):
    return sqs_client(tenant_a)


def dump(value):
    return json.dumps(value, indent=2, sort_keys=True, default=str)
