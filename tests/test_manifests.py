"""Every Kubernetes manifest under deploy/ (what `kubectl apply -k deploy/`
installs) is validated offline against the
Kubernetes OpenAPI schemas (kubernetes-validate, strict, Kubernetes 1.32),
and the committed CRDs are what `sless crds` prints."""

import pathlib
import subprocess
import sys

import pytest

from conftest import BINARY

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALL_YAML = sorted((ROOT / "deploy").rglob("*.yaml"))
# kustomization.yaml is kustomize's file, not a Kubernetes object.
MANIFESTS = [p for p in ALL_YAML if p.name != "kustomization.yaml"]
VALIDATE = [sys.executable, "-m", "kubernetes_validate", "-k", "1.32.0", "--strict", "--quiet"]


def validate(path):
    return subprocess.run(VALIDATE + [str(path)], capture_output=True, text=True, timeout=120)


def test_there_are_manifests():
    assert any(p.parent.name == "crds" for p in MANIFESTS)
    assert any(p.parent.name == "operator" for p in MANIFESTS)


def test_the_kustomization_lists_every_manifest():
    listed = [
        line.strip()[2:]
        for line in (ROOT / "deploy/kustomization.yaml").read_text().splitlines()
        if line.strip().startswith("- ")
    ]
    assert sorted(listed) == sorted(str(p.relative_to(ROOT / "deploy")) for p in MANIFESTS)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_manifest_is_valid_kubernetes(path):
    result = validate(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_validator_rejects_a_broken_manifest(tmp_path):
    broken = tmp_path / "broken.yaml"
    text = (ROOT / "deploy/crds/queueservices.sless.kube5s.ru.yaml").read_text()
    broken.write_text(text.replace("scope: Namespaced", "scope: Namespaced\n  replicas: 3"))
    assert validate(broken).returncode != 0


def test_sless_crds_prints_the_committed_definitions():
    printed = subprocess.run([str(BINARY), "crds"], capture_output=True, text=True, check=True).stdout
    committed = "".join(p.read_text() for p in sorted((ROOT / "deploy/crds").glob("*.yaml")))
    assert printed == committed
