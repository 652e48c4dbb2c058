"""The real Terraform CLI with this build's provider, offline through
`dev_overrides`, in a directory of its own: what test_terraform.py (against
`sless dev`) and tests/cluster (against the API Service) drive."""

import json
import os
import pathlib
import shutil
import subprocess
import sysconfig
import tempfile
import textwrap

import pytest

from tests.conftest import TARGET

PROVIDER_DIR = TARGET / "debug"
# The PyPI package installs its entry point beside the interpreter's scripts,
# which a version manager's shims may not have picked up yet.
TERRAFORM = shutil.which("terraform") or str(pathlib.Path(sysconfig.get_path("scripts")) / "terraform")

# A queue service of `name` and `memory_mb`, its endpoint and keys as outputs.
QUEUE = """
resource "sless_queue_service" "main" {
  name      = "%s"
  memory_mb = %d
  timeouts {
    create = "2m"
  }
}
output "endpoint"   { value = sless_queue_service.main.endpoint }
output "region"     { value = sless_queue_service.main.region }
output "access_key" {
  value     = sless_queue_service.main.access_key
  sensitive = true
}
output "secret_key" {
  value     = sless_queue_service.main.secret_key
  sensitive = true
}
"""


class Terraform:
    """A working directory and the environment naming `endpoint` and `token`;
    each command may take `timeout` seconds; `remove()` deletes the directory."""

    def __init__(self, endpoint, token, timeout=300):
        self.timeout = timeout
        if not (PROVIDER_DIR / "terraform-provider-sless").exists():
            pytest.fail("terraform-provider-sless is missing: run `cargo build` first")
        if not pathlib.Path(TERRAFORM).exists():
            pytest.fail("terraform is missing: pip install -r tests/requirements.txt")
        self.work = pathlib.Path(tempfile.mkdtemp(prefix="sless-tf-"))
        rc = self.work / "cli.tfrc"
        rc.write_text(textwrap.dedent(f"""
            provider_installation {{
              dev_overrides {{
                "kube5s/sless" = "{PROVIDER_DIR}"
              }}
              direct {{}}
            }}
        """))
        self.env = dict(os.environ, TF_CLI_CONFIG_FILE=str(rc), CHECKPOINT_DISABLE="1",
                        TF_IN_AUTOMATION="1", TF_INPUT="0", SLESS_ENDPOINT=endpoint, SLESS_TOKEN=token)

    def write(self, body, provider='provider "sless" {}'):
        (self.work / "main.tf").write_text(textwrap.dedent("""
            terraform {
              required_providers {
                sless = { source = "kube5s/sless" }
              }
            }
        """) + provider + "\n" + textwrap.dedent(body))

    def run(self, *args, check=True, env=None):
        out = subprocess.run([TERRAFORM, *args, "-no-color"], cwd=self.work, env={**self.env, **(env or {})},
                             capture_output=True, text=True, timeout=self.timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"terraform {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
        return out

    def apply(self, **kw):
        return self.run("apply", "-auto-approve", **kw)

    def plan_exit(self):
        return self.run("plan", "-detailed-exitcode", check=False)

    def outputs(self):
        return json.loads(self.run("output", "-json").stdout)

    def remove(self):
        shutil.rmtree(self.work, ignore_errors=True)
