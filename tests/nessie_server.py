"""A real Nessie server for the Python tests: nessie-quarkus 0.99.0 as
scripts/install-test-deps.sh caches it ($SLESS_CACHE/nessie-0.99.0, or
SLESS_NESSIE_JAR), on the Temurin 25 JDK with its in-memory version store,
and moto's S3 server as the object store of its Iceberg tables, both on
free loopback ports. As sless-testkit's NessieServer does for the Rust tests."""

import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.request

from tests.trino_server import free_port

VERSION = "0.99.0"
WAREHOUSE = "warehouse"
BUCKET = "sless-warehouse"
S3_KEY = S3_SECRET = "testing"
S3_REGION = "us-east-1"


def jar():
    if os.environ.get("SLESS_NESSIE_JAR"):
        return pathlib.Path(os.environ["SLESS_NESSIE_JAR"])
    cache = os.environ.get("SLESS_CACHE") or os.path.expanduser("~/.cache/sless")
    return pathlib.Path(cache) / f"nessie-{VERSION}" / "nessie-quarkus-runner.jar"


def _wait(what, process, log, ready, seconds=120):
    deadline = time.time() + seconds
    while not ready():
        if process.poll() is not None or time.time() > deadline:
            raise AssertionError(f"{what} did not start; its log ends:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.25)


def _answers(url, method="GET"):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5).status == 200
    except OSError:
        return False


class NessieServer:
    def __init__(self):
        runner = jar()
        assert runner.exists(), f"no Nessie at {runner}: run scripts/install-test-deps.sh"
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="sless-py-nessie-"))
        self.processes = []
        s3_port, port, management = free_port(), free_port(), free_port()
        self.s3_endpoint = f"http://127.0.0.1:{s3_port}"
        s3_log = self.dir / "s3.log"
        s3 = self._start(["moto_server", "-H", "127.0.0.1", "-p", str(s3_port)], s3_log)
        _wait("moto", s3, s3_log, lambda: _answers(f"{self.s3_endpoint}/{BUCKET}", "PUT"), 60)
        (self.dir / "config").mkdir()
        (self.dir / "config" / "application.properties").write_text(
            f"nessie.version.store.type=IN_MEMORY\nquarkus.http.host=127.0.0.1\nquarkus.http.port={port}\n"
            f"quarkus.management.host=127.0.0.1\nquarkus.management.port={management}\n"
            "quarkus.log.level=WARN\nquarkus.otel.sdk.disabled=true\n"
            f"nessie.catalog.default-warehouse={WAREHOUSE}\n"
            f"nessie.catalog.warehouses.{WAREHOUSE}.location=s3://{BUCKET}/\n"
            f"nessie.catalog.service.s3.default-options.endpoint={self.s3_endpoint}/\n"
            "nessie.catalog.service.s3.default-options.path-style-access=true\n"
            f"nessie.catalog.service.s3.default-options.region={S3_REGION}\n"
            "nessie.catalog.service.s3.default-options.access-key=urn:nessie-secret:quarkus:sless-s3\n"
            "nessie.catalog.service.s3.default-options.request-signing-enabled=false\n"
            f"sless-s3.name={S3_KEY}\nsless-s3.secret={S3_SECRET}\n")
        java = os.path.join(os.environ.get("SLESS_TRINO_JAVA_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"), "bin/java")
        log = self.dir / "server.log"
        nessie = self._start([java, "-Xmx512m", "-XX:+UseSerialGC", "-jar", str(runner)], log)
        _wait("Nessie", nessie, log, lambda: _answers(f"http://127.0.0.1:{management}/q/health/ready"))
        self.iceberg_url = f"http://127.0.0.1:{port}/iceberg"
        self.api_url = f"http://127.0.0.1:{port}/api/v2"

    def _start(self, command, log):
        process = subprocess.Popen(command, cwd=self.dir, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def stop(self):
        for process in self.processes:
            process.kill()
            process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
