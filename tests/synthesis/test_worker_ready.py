"""`manage.py worker_ready`: compose's healthcheck of a worker container."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from synthesis.models import WorkerHeartbeat
from tests.unreachable import unreachable_broker  # noqa: F401  (a fixture)

HOST = socket.gethostname()


def beat(
    name: str, *, device: str = "cuda:0", seen_s_ago: float = 0.0, draining: bool = False
) -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        name=name,
        engine="cosyvoice2",
        device=device,
        started_at=now - timedelta(minutes=5),
        seen_at=now - timedelta(seconds=seen_s_ago),
        draining_since=now - timedelta(seconds=1) if draining else None,
    )


def exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.django_db
def test_a_live_worker_with_its_engine_loaded_is_ready(capsys: Any) -> None:
    beat(f"{HOST}:{os.getpid()}")
    call_command("worker_ready")
    assert "ready:" in capsys.readouterr().out


@pytest.mark.django_db
@pytest.mark.parametrize(
    "row",
    [
        pytest.param({}, id="no heartbeat row"),
        pytest.param({"device": "-"}, id="the engine failed to load"),
        pytest.param({"seen_s_ago": 60}, id="heartbeat stale"),
        pytest.param({"dead": True}, id="the process has exited"),
        pytest.param({"other_host": True}, id="a worker of another host"),
    ],
)
def test_it_is_not_ready_otherwise(row: dict[str, Any]) -> None:
    if row:
        pid = exited_pid() if row.get("dead") else os.getpid()
        host = "elsewhere" if row.get("other_host") else HOST
        beat(f"{host}:{pid}", device=row.get("device", "cpu"), seen_s_ago=row.get("seen_s_ago", 0))
    with pytest.raises(CommandError, match="no live worker"):
        call_command("worker_ready")


@pytest.mark.django_db
def test_a_draining_worker_is_not_ready_and_says_so() -> None:
    beat(f"{HOST}:{os.getpid()}", draining=True)
    with pytest.raises(CommandError, match=r"draining since .* takes no new jobs"):
        call_command("worker_ready")


@pytest.mark.django_db
def test_another_worker_of_the_host_that_is_not_draining_is_ready(capsys: Any) -> None:
    beat(f"{HOST}:{os.getpid()}", draining=True)
    beat(f"{HOST}:{os.getppid()}")
    call_command("worker_ready")
    assert f"ready: {HOST}:{os.getppid()}" in capsys.readouterr().out


@pytest.mark.django_db
@pytest.mark.usefixtures("unreachable_broker")
def test_it_is_not_ready_while_the_broker_is_down() -> None:
    beat(f"{HOST}:{os.getpid()}")
    with pytest.raises(CommandError, match="broker unreachable"):
        call_command("worker_ready")
