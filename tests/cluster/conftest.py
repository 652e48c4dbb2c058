"""The real single-node Kubernetes of `scripts/cluster.sh`, once for the
session: built from the official sources on first use (cached outside the
checkout), started before the first cluster test and removed after the
last one, with its interfaces, iptables rules and state."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "cluster.sh"


class Cluster:
    def __init__(self, env):
        self.env = env

    def kubectl(self, *args, input=None, check=True):
        done = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True,
                              env=self.env, timeout=120)
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done


@pytest.fixture(scope="session")
def cluster():
    up = subprocess.run([str(SCRIPT), "up"], capture_output=True, text=True, timeout=3600)
    assert up.returncode == 0, f"cluster.sh up failed:\n{up.stdout}\n{up.stderr}"
    env = dict(os.environ)
    for part in up.stdout.strip().splitlines()[-1].removeprefix("export ").split():
        name, value = part.split("=", 1)
        env[name] = value.replace("$PATH", os.environ["PATH"])
    try:
        yield Cluster(env)
    finally:
        # SLESS_CLUSTER_KEEP=1 leaves it up for the next run (while developing).
        if os.environ.get("SLESS_CLUSTER_KEEP") != "1":
            subprocess.run([str(SCRIPT), "down"], timeout=300)


@pytest.fixture(scope="session")
def sless_image(cluster):
    """The sless image, built from the Dockerfile and loaded into the
    cluster (scripts/cluster/image.py): its name."""
    built = subprocess.run([str(SCRIPT), "image"], capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, f"cluster.sh image failed:\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"
    return "ghcr.io/kube5s/sless:test"
