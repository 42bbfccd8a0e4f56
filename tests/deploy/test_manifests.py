"""The container image and Kubernetes files CI checks: the Containerfile lints clean (hadolint), the kustomize
base and example overlay render (kubectl kustomize) and every document validates against the Kubernetes
schemas (kubernetes-validate, strict, offline), the options they pass exist in `defectdet serve`, and every
metric the Grafana dashboard queries is one the service exports. Skips where kubectl or hadolint is missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DASHBOARD = ROOT / "deploy" / "grafana" / "defectdet-dashboard.json"
CONTAINERFILE = ROOT / "Containerfile"
GUIDE = ROOT / "docs" / "guides" / "several-lines.md"
# the oldest Kubernetes minor still commonly run, and the newest schemas the validator ships
KUBERNETES_VERSIONS = ("1.29.0", None)


def tool(name: str) -> str:
    """Path of `name` in this interpreter's bin folder or on PATH; skip the test when absent."""
    found = shutil.which(
        name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def render(folder: Path) -> list[dict[str, Any]]:
    completed = subprocess.run(
        [tool("kubectl"), "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return [doc for doc in yaml.safe_load_all(completed.stdout) if doc]


def validate(documents: list[dict[str, Any]]) -> None:
    """Every document against the schemas of each version in KUBERNETES_VERSIONS, rejecting unknown fields."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for version in KUBERNETES_VERSIONS:
        version = version or kubernetes_validate.latest_version()
        for doc in documents:
            kubernetes_validate.validate(doc, version, strict=True)


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [doc["kind"] for doc in documents]
    assert len(kinds) == len(set(kinds)), kinds
    return {doc["kind"]: doc for doc in documents}


def serve_options() -> set[str]:
    import typer

    from defectdet.cli import app

    serve = typer.main.get_command(app).commands["serve"]
    return {opt for param in serve.params for opt in param.opts if opt.startswith("--")}


def assert_serve_options(args: list[str]) -> None:
    """Every --option in `args` is one `defectdet serve` takes."""
    used = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    assert used, args
    assert used <= serve_options(), sorted(used - serve_options())


def test_base_renders_validates_and_runs_locked_down() -> None:
    documents = render(K8S / "base")
    validate(documents)
    kinds = by_kind(documents)
    assert set(kinds) == {
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PersistentVolumeClaim",
        "Secret",
        "PodDisruptionBudget",
        "NetworkPolicy",
    }
    pod = kinds["Deployment"]["spec"]["template"]
    serve = pod["spec"]["containers"][0]
    assert serve["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert serve["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert serve["resources"]["requests"]["cpu"] and serve["resources"]["requests"]["memory"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    for container in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["capabilities"]["drop"] == ["ALL"]
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in serve["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert (
        volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"]
        == kinds["PersistentVolumeClaim"]["metadata"]["name"]
    )
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    # the token file serve reads is the Secret's key, and the base ships no token
    token_mount = next(path for path, name in mounts.items() if "secret" in volumes[name])
    assert f"--token-file={token_mount}/token" in serve["args"]
    assert volumes[mounts[token_mount]]["secret"]["secretName"] == kinds["Secret"]["metadata"]["name"]
    assert kinds["Secret"]["data"]["token"] == ""
    assert_serve_options(serve["args"])
    hpa = kinds["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_example_overlay_renders_with_a_token(tmp_path: Path) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    (copy / "overlays" / "example" / "token").write_text("not-a-real-token-0123456789\n")
    documents = render(copy / "overlays" / "example")
    validate(documents)
    kinds = by_kind(documents)
    assert {doc["metadata"].get("namespace") for doc in documents if doc["kind"] != "Namespace"} == {
        "defectdet"
    }
    assert kinds["Secret"]["data"]["token"] != ""
    assert kinds["PersistentVolumeClaim"]["spec"]["storageClassName"]
    assert_serve_options(kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"])


def test_strict_validation_rejects_a_misspelt_field() -> None:
    """The check above can fail: a probe spelt wrong is an unknown field under strict validation."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    deployment = by_kind(render(K8S / "base"))["Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate([deployment])


def test_containerfile_lints_clean_and_runs_serve_as_non_root() -> None:
    completed = subprocess.run(
        [tool("hadolint"), "--no-color", str(CONTAINERFILE)], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    text = CONTAINERFILE.read_text()
    assert re.search(r"^USER \d+:\d+$", text, flags=re.M)
    assert "/healthz" in re.search(r"^HEALTHCHECK .*?\]$", text, flags=re.M | re.S).group(0)
    assert json.loads(re.search(r"^ENTRYPOINT (.*)$", text, flags=re.M).group(1)) == ["defectdet", "serve"]
    cmd = re.search(r"^CMD (\[.*?\])$", text, flags=re.M | re.S).group(1)
    assert_serve_options(json.loads(cmd.replace("\\\n", "")))
    install = re.search(r"pip install (.*)", text).group(1)  # the serve extra only: no torch in the image
    assert "[serve]" in install and not re.search(r"\[(train|all|dev)|torch", install), install


def test_containerfile_pins_its_base_by_digest() -> None:
    """Both stages start from one base named by digest, given as one build argument the guide passes."""
    text = CONTAINERFILE.read_text()
    head = text[: text.index("\nFROM ")]
    assert re.search(r"^ARG PYTHON_DIGEST$", head, flags=re.M)  # no default: a build must name the digest
    bases = re.findall(r"^FROM (\S+)", text, flags=re.M)
    assert len(bases) == 2 and all(
        re.fullmatch(r"python:3\.\d+-slim@\$\{PYTHON_DIGEST\}", b) for b in bases
    ), bases
    builds = [line for block in guide_blocks("bash") for line in block.splitlines() if " build " in line]
    assert builds and all("--build-arg PYTHON_DIGEST=" in line for line in builds), builds


def pod_spec(documents: list[dict[str, Any]]) -> dict[str, Any]:
    return by_kind(documents)["Deployment"]["spec"]["template"]["spec"]


def test_a_fresh_claim_gets_folders_the_service_user_can_write(tmp_path: Path) -> None:
    """subPath folders the node creates are root's: an init container makes them first, as the service's user,
    before any container mounts them; run here on an empty folder as on a fresh claim."""
    pod = pod_spec(render(K8S / "base"))
    claim = next(v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v)
    prepare, *later = pod["initContainers"] + pod["containers"]
    (mount,) = [m for m in prepare["volumeMounts"] if m["name"] == claim]
    assert "subPath" not in mount
    subpaths = {m["subPath"] for c in later for m in c["volumeMounts"] if m["name"] == claim}
    assert subpaths == {"models", "keep"}
    context = pod["securityContext"]
    assert context["runAsUser"] == 10001 and context["fsGroup"] == context["runAsGroup"] == 10001
    assert context["fsGroupChangePolicy"] == "OnRootMismatch"
    for container in pod["initContainers"] + pod["containers"]:  # nobody runs as root to fix ownership
        assert container["securityContext"].get("runAsUser", 10001) != 0
        assert container["securityContext"].get("runAsNonRoot", True) is True
    command = prepare["command"]
    script = command[command.index("-c") + 1].replace(mount["mountPath"], str(tmp_path / "store"))
    (tmp_path / "store").mkdir()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for sub in subpaths:
        folder = tmp_path / "store" / sub
        assert (
            folder.is_dir()
            and folder.stat().st_uid == os.getuid()
            and folder.stat().st_mode & 0o2070 == 0o2070
        )
        assert os.listdir(folder) == []  # its write check leaves nothing behind
    # a claim it cannot write: the pod stops with one line naming the folder and the fix
    (tmp_path / "store" / "keep").rmdir()
    (tmp_path / "store" / "keep").write_text("")  # in the way, as an unwritable root would be
    failed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert failed.returncode == 1 and "store/keep: user" in failed.stderr and "chown" in failed.stderr


def test_tmp_is_a_bounded_empty_dir_and_the_keep_folder_is_writable() -> None:
    """/tmp holds small temporary files only (the labels download is built in the keep folder, see
    tests/deploy/test_review_download.py), so a bounded emptyDir is enough."""
    pod = pod_spec(render(K8S / "base"))
    serve = pod["containers"][0]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in serve["volumeMounts"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"]["sizeLimit"] == "256Mi"
    assert not mounts["/keep"].get("readOnly") and "--keep-dir=/keep" in serve["args"]


def test_disruptions_and_network_are_bounded_for_the_replicas() -> None:
    documents = render(K8S / "base")
    kinds = by_kind(documents)
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    budget = kinds["PodDisruptionBudget"]["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    assert budget["maxUnavailable"] == 1 < kinds["HorizontalPodAutoscaler"]["spec"]["minReplicas"]
    policy = kinds["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"] and policy["egress"] == []  # nothing out
    port = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    assert [p["port"] for rule in policy["ingress"] for p in rule["ports"]] == [port["name"]]


def test_readiness_drops_a_replica_stuck_on_an_old_generation() -> None:
    """The probe asks /readyz, which answers 503 while a replica serves another generation than the store's
    (tests/deploy/test_fleet_state.py), and soon enough for the Service to stop sending it requests."""
    probe = pod_spec(render(K8S / "base"))["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/readyz"
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 30


def guide_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", GUIDE.read_text(), flags=re.M | re.S)


def test_guide_examples_validate_and_lint(tmp_path: Path) -> None:
    """The training Job and Service in the guide validate; its training image lints clean."""
    documents = [
        doc
        for block in guide_blocks("yaml")
        for doc in yaml.safe_load_all(block)
        if doc and "apiVersion" in doc
    ]
    assert {doc["kind"] for doc in documents} == {"Service", "Job"}
    validate(documents)
    (containerfile,) = guide_blocks("dockerfile")
    (tmp_path / "Containerfile").write_text(containerfile)
    completed = subprocess.run(
        [tool("hadolint"), "--no-color", str(tmp_path / "Containerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_ignore_files_hold_the_same_lines() -> None:
    """docker reads .dockerignore, podman .containerignore: one build context either way."""
    assert (ROOT / ".dockerignore").read_text() == (ROOT / ".containerignore").read_text()


def exported_metric_names() -> set[str]:
    """Series names the service's registry exposes: counters with _total, histograms' _bucket/_sum/_count."""
    pytest.importorskip("prometheus_client")
    from defectdet.serve.metrics import ServiceMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    metrics = ServiceMetrics(["open", "short"], None)
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    expressions = [target["expr"] for panel in panels for target in panel["targets"]]
    assert expressions and all(target["refId"] for panel in panels for target in panel["targets"])
    queried = {name for expr in expressions for name in re.findall(r"\bdefectdet_[a-z_]+", expr)}
    missing = queried - exported_metric_names()
    assert not missing, f"{DASHBOARD.name} queries metrics the service does not export: {sorted(missing)}"
    for needed in ("requests_total", "request_seconds_bucket", "verdicts_total", "drift_level", "model_generation",
                   "shadow_disagreement_rate"):  # fmt: skip
        assert f"defectdet_{needed}" in queried
