"""The web console in a real browser: Debian's chromium driven by
playwright-core (tests/js/console.mjs) against `sless dev`, with the local
PostgreSQL behind the dataflow it creates. The screenshots are kept under
target/console-screenshots/ to be looked at."""

import os
import shutil
import subprocess
import uuid

import pytest

from conftest import ROOT, TARGET, TOKENS

PG_DSN = os.environ.get("SLESS_TEST_PG", "postgres://postgres@127.0.0.1/test")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def psql(sql):
    subprocess.run(["psql", PG_DSN, "-qc", sql], check=True, capture_output=True)


def test_the_console_in_chromium(sless):
    if not shutil.which("node") or not os.path.exists(CHROMIUM):
        pytest.fail("node and Debian's chromium are needed: run scripts/install-test-deps.sh")
    suffix = uuid.uuid4().hex[:8]
    src, dst = f"console_src_{suffix}", f"console_dst_{suffix}"
    psql(
        f"CREATE TABLE {src} (id serial PRIMARY KEY, amount int, card text);"
        f"INSERT INTO {src} (amount, card) SELECT g, '4111111111111111' FROM generate_series(1, 50) g;"
    )
    shots = TARGET / "console-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        API=sless.api,
        TOKEN_A=TOKENS["a"],
        TOKEN_B=TOKENS["b"],
        PG_DSN=PG_DSN,
        SRC=src,
        DST=dst,
        SHOTS=str(shots),
        CHROMIUM=CHROMIUM,
    )
    try:
        run = subprocess.run(
            ["node", str(ROOT / "tests/js/console.mjs")],
            env=env, capture_output=True, text=True, timeout=240,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert '"ok":true' in run.stdout
        for name in ["overview", "dataflow-422", "dataflow", "dataflow-phone", "other-tenant"]:
            assert (shots / f"{name}.png").stat().st_size > 5000, name
        # The rows the console's dataflow moved, masked, filtered.
        count = subprocess.run(
            ["psql", PG_DSN, "-Atc", f"SELECT count(*), min(data->>'card') FROM {dst}"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        assert count == "45|****************", count
    finally:
        sless.rest("a", "DELETE", "/dataflows/console-flow")
        psql(f"DROP TABLE IF EXISTS {src}; DROP TABLE IF EXISTS {dst}")


def test_console_assets_carry_a_strict_policy(sless):
    import requests

    for path in ["/console", "/console/app.js", "/console/style.css"]:
        response = requests.get(sless.api + path, timeout=10)
        assert response.status_code == 200, path
        policy = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert requests.get(sless.api + "/console/../api/v1/dataflows", timeout=10).status_code == 401
    assert requests.get(sless.api + "/console/nope.js", timeout=10).status_code == 404
