"""A web process loads and connects, as it starts, what its first request would
(chorus.warm_up), so the first stream after a start waits what the next ones do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import stack_env
from tests.unreachable import dead_port

# The web process opens the test database's pool (the PostgreSQL pass: a pool of its own).
pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]

# What the web server's process does: import the ASGI application. Then: what
# would the first request still have to load or open?
STARTED_WEB_PROCESS = """
import json, sys
import chorus.asgi
from django.db import connections
from django.urls import get_resolver
from kombu import Connection
from chorus.celery import app
idle = app.pool._resource.queue  # connections kept for the next publish
print(json.dumps({
    "urls_loaded": "url_patterns" in get_resolver().__dict__,
    "views_imported": "synthesis.api.views" in sys.modules,
    "database_pool_open": "default" in type(connections["default"])._connection_pools,
    "broker_connected": any(isinstance(c, Connection) and c.connected for c in idle),
}))
"""


def start_web_process(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STARTED_WEB_PROCESS],
        cwd=ROOT,
        env=stack_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_started_web_process_has_its_urls_views_and_broker_connection_ready() -> None:
    result = start_web_process()

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "urls_loaded": True,
        "views_imported": True,
        "database_pool_open": True,
        "broker_connected": True,
    }


def test_a_web_process_starts_when_the_broker_is_down_and_says_what_it_could_not_warm() -> None:
    result = start_web_process(REDIS_URL=f"redis://127.0.0.1:{dead_port()}/0")

    assert result.returncode == 0, result.stderr
    started = json.loads(result.stdout.splitlines()[-1])
    assert (started["urls_loaded"], started["broker_connected"]) == (True, False)
    assert "warm-up of the broker failed" in result.stderr
    assert "warm-up of redis failed" in result.stderr
