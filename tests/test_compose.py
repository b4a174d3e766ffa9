"""docker-compose.yml cannot be run here (no Docker engine), so it is parsed and
every command and setting it relies on is checked against the project."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.core.management import get_commands
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chorus import web_server
from synthesis import drain

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
OWN_SERVICES = {name: spec for name, spec in COMPOSE["services"].items() if "build" in spec}


def test_it_runs_the_web_worker_and_the_production_backing_services() -> None:
    assert {
        "web",
        "worker",
        "worker-light",
        "worker-webhooks",
        "sweeper",
        "migrate",
        "postgres",
        "redis",
    } <= set(COMPOSE["services"])


def test_each_own_service_builds_from_a_dockerfile_in_the_project() -> None:
    for spec in OWN_SERVICES.values():
        assert (ROOT / spec["build"]["context"] / spec["build"]["dockerfile"]).is_file()


@pytest.mark.parametrize("name", sorted(OWN_SERVICES))
def test_each_own_service_command_exists_in_the_project(name: str) -> None:
    command = OWN_SERVICES[name]["command"]
    program = command[0]
    if program == "python" and command[1] == "-m":  # the web tier's own server
        assert command[2] == "chorus.web_server"
        options = web_server._parse(command[3:])  # exits on an unknown option
        assert options.workers >= 2
        assert options.proxy_headers
        # The web tier's own HTTP protocol: time limits on slow clients.
        assert options.http == web_server.PROTOCOL
        module, attribute = options.http.split(":")
        assert issubclass(getattr(importlib.import_module(module), attribute), HttpToolsProtocol)
    elif program == "python":
        assert command[1] == "manage.py"
        assert command[2] in get_commands(), f"no management command {command[2]!r}"
    elif program == "celery":
        assert command[1:3] == ["-A", "chorus"]
        assert importlib.import_module("chorus.celery").app.main == "chorus"
        assert command[3] == "worker"
        queues = command[command.index("-Q") + 1].split(",")
        if name == "worker-light":  # work that needs no GPU, and only that
            assert queues == [settings.LIGHT_QUEUE]
            return
        if name == "worker-webhooks":  # deliveries, on threads of their own
            assert queues == [settings.WEBHOOK_QUEUE]
            return
        # The order is the scheduling policy: high before normal before low.
        assert tuple(queues) == settings.SYNTH_QUEUES
    else:
        pytest.fail(f"unexpected program {program!r} in service {name}")


def test_every_variable_it_sets_is_read_by_the_settings() -> None:
    source = (ROOT / "chorus" / "settings.py").read_text()
    shared: dict[str, Any] = COMPOSE["x-chorus-env"]
    for name, spec in OWN_SERVICES.items():
        # Every own service gets the shared variables (a service may override a value).
        assert shared.keys() <= spec["environment"].keys(), f"{name} lacks the shared env"
        for variable in spec["environment"]:
            assert re.search(rf'"{variable}"', source), f"{variable} is not read by settings"


def test_secrets_have_no_defaults_and_ports_stay_on_loopback() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for secret in ("CHORUS_SECRET_KEY", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD"):
        assert re.search(rf"\$\{{{secret}:\?", text), f"{secret} must be required"
        assert f"{secret}:-" not in text
    for spec in COMPOSE["services"].values():
        for port in spec.get("ports", []):
            assert port.startswith("127.0.0.1:"), port


def test_the_gpu_worker_reserves_a_gpu_and_runs_cosyvoice2() -> None:
    gpu = COMPOSE["services"]["worker-gpu"]
    assert gpu["environment"]["CHORUS_ENGINE"] == "cosyvoice2"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def test_web_and_workers_have_healthchecks_the_project_answers() -> None:
    from django.urls import resolve

    web = COMPOSE["services"]["web"]["healthcheck"]["test"]
    url = re.search(r"http://127\.0\.0\.1:8000(/\w+)", " ".join(web))
    assert url is not None
    assert resolve(url.group(1)).url_name == "readyz"
    for name in ("worker", "worker-gpu"):
        test = COMPOSE["services"][name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "manage.py"]
        assert test[3] == "worker_ready"
        assert test[3] in get_commands()


def test_synthesis_workers_get_longer_than_their_drain_to_stop() -> None:
    # Drain, then the hand-back of what did not finish (`synthesis.drain`).
    needed = settings.WORKER_DRAIN_S + drain.HAND_BACK_WAIT_S
    for name in ("worker", "worker-gpu"):
        grace = COMPOSE["services"][name]["stop_grace_period"]
        assert grace.endswith("s")
        assert int(grace.removesuffix("s")) > needed, name


def test_flower_needs_a_password_and_the_workers_send_it_task_events() -> None:
    flower = COMPOSE["services"]["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")
    assert "--broker=redis://redis:6379/0" in flower["command"]
    assert COMPOSE["x-chorus-env"]["CHORUS_CELERY_EVENTS"] == "true"
    assert "FLOWER_BASIC_AUTH=" in (ROOT / ".env.example").read_text()


def test_every_process_of_the_stack_writes_metrics_to_the_shared_volume() -> None:
    folder = COMPOSE["x-chorus-env"]["PROMETHEUS_MULTIPROC_DIR"]
    for name in ("web", "worker", "sweeper", "worker-gpu"):
        assert f"metrics:{folder}" in COMPOSE["services"][name]["volumes"], name
