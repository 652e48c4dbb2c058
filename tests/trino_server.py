"""A real Trino server for the Python tests: Trino 476 as
scripts/install-test-deps.sh caches it ($SLESS_CACHE/trino-476, or
SLESS_TRINO_HOME), on the Temurin 25 JDK, in a temporary directory on a free
loopback port, plain HTTP, with the `memory` catalog. As sless-testkit's
TrinoServer does for the Rust tests, without its HTTPS logins."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

VERSION = "476"


def home():
    if os.environ.get("SLESS_TRINO_HOME"):
        return pathlib.Path(os.environ["SLESS_TRINO_HOME"])
    cache = os.environ.get("SLESS_CACHE") or os.path.expanduser("~/.cache/sless")
    return pathlib.Path(cache) / f"trino-{VERSION}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TrinoServer:
    def __init__(self):
        root = home()
        assert (root / ".complete").exists(), f"no Trino at {root}: run scripts/install-test-deps.sh"
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="sless-py-trino-"))
        port = free_port()
        etc = self.dir / "etc"
        (etc / "catalog").mkdir(parents=True)
        (etc / "node.properties").write_text(
            f"node.environment=test\nnode.id=sless-py\nnode.data-dir={self.dir}/data\n"
            "node.internal-address=127.0.0.1\nnode.bind-ip=127.0.0.1\n")
        (etc / "jvm.config").write_text(
            "-server\n-Xmx1G\n-XX:+UseG1GC\n-XX:+ExitOnOutOfMemoryError\n-Djdk.attach.allowAttachSelf=true\n"
            "-XX:+EnableDynamicAgentLoading\n-Dfile.encoding=UTF-8\n")
        (etc / "config.properties").write_text(
            f"coordinator=true\nnode-scheduler.include-coordinator=true\nhttp-server.http.port={port}\n"
            f"discovery.uri=http://127.0.0.1:{port}\nquery.max-memory=512MB\nquery.max-memory-per-node=256MB\n"
            "catalog.management=dynamic\n")
        (etc / "catalog" / "memory.properties").write_text("connector.name=memory\nmemory.max-data-per-node=128MB\n")
        env = dict(os.environ, JAVA_HOME=os.environ.get("SLESS_TRINO_JAVA_HOME", "/usr/lib/jvm/temurin-25-jdk-amd64"))
        self.log = open(self.dir / "server.log", "wb")
        self.process = subprocess.Popen(
            [str(root / "bin/launcher"), "run", f"--etc-dir={etc}", f"--data-dir={self.dir}/data"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                info = json.load(urllib.request.urlopen(f"{self.url}/v1/info", timeout=5))
                if info.get("starting") is False:
                    break
            except OSError:
                pass
            if self.process.poll() is not None or time.time() > deadline:
                log = (self.dir / "server.log").read_text(errors="replace")[-4000:]
                self.stop()
                raise AssertionError(f"Trino did not start; its log ends:\n{log}")
            time.sleep(0.25)

    def query(self, sql, catalog="memory"):
        """The rows of `sql`, raising on an error."""
        request = urllib.request.Request(f"{self.url}/v1/statement", data=sql.encode(), headers={
            "X-Trino-User": "sless-test", "X-Trino-Catalog": catalog, "X-Trino-Schema": "default"})
        answer = json.load(urllib.request.urlopen(request, timeout=60))
        rows = []
        while True:
            assert "error" not in answer, answer["error"]["message"]
            rows += answer.get("data", [])
            if "nextUri" not in answer:
                return rows
            answer = json.load(urllib.request.urlopen(answer["nextUri"], timeout=60))

    def add_iceberg(self, nessie):
        """Catalog `iceberg`: the tables of `nessie`'s branch `main`, read
        through Trino's Iceberg connector (the independent reader)."""
        if ["iceberg"] in self.query("SHOW CATALOGS"):
            return
        properties = {
            "iceberg.catalog.type": "rest",
            "iceberg.rest-catalog.uri": f"{nessie.iceberg_url}/main",
            "iceberg.rest-catalog.warehouse": "warehouse",
            "fs.native-s3.enabled": "true",
            "s3.endpoint": nessie.s3_endpoint,
            "s3.path-style-access": "true",
            "s3.region": "us-east-1",
            "s3.aws-access-key": "testing",
            "s3.aws-secret-key": "testing",
        }
        self.query("CREATE CATALOG iceberg USING iceberg WITH ("
                   + ", ".join(f'"{k}" = \'{v}\'' for k, v in properties.items()) + ")")

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
