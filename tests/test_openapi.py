"""schemathesis (PyPI) against `sless dev`'s own OpenAPI document: every
answer's status is documented, every answer fits its schema, and requests
the schema refuses are refused. Not checked: that every request the schema
allows is accepted, since some refusals depend on state no schema states
(a volume that can only grow, a name that must match the path, a redrive of
a queue that is no dead-letter queue; they answer a documented 422)."""

import shutil
import subprocess
import tempfile
import time

import pytest
import requests

from conftest import BINARY, TOKENS, free_port


def wait_up(url, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def test_the_api_answers_as_its_document_says():
    st = shutil.which("schemathesis")
    if st is None:
        pytest.fail("schemathesis is installed by scripts/install-test-deps.sh (tests/requirements.txt)")
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="sless-openapi-")
    proc = subprocess.Popen(
        [str(BINARY), "dev", "--listen", f"127.0.0.1:{port}", "--gateway-listen", "127.0.0.1:0",
         "--control-plane-listen", "127.0.0.1:0", "--data-dir", data_dir,
         "--tenant", f"a={TOKENS['a']}",
         # The run sends about a thousand requests in seconds.
         "--api-rate", "100000", "--api-burst", "100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_up(base + "/healthz")
        checks = ",".join([
            "not_a_server_error", "status_code_conformance", "content_type_conformance",
            "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
            "use_after_free", "ensure_resource_availability", "ignored_auth",
        ])
        run = subprocess.run(
            [st, "run", base + "/api/v1/openapi.json", "--url", base,
             "-H", f"Authorization: Bearer {TOKENS['a']}", "--checks", checks,
             "--max-examples", "30", "--seed", "1", "--phases", "examples,coverage,fuzzing"],
            capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(data_dir, ignore_errors=True)
