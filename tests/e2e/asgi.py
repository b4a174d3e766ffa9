"""The web tier under a real ASGI server, for tests that stream.

pytest-django's `live_server` is a WSGI server: under WSGI Django must drain an
async iterator before it sends anything, so streaming (and disconnect
handling) can only be observed under ASGI. Here uvicorn runs in a subprocess,
exactly as in production, against the test database, Redis and storage (the
same environment the worker fixture builds); the test database must be a
`transactional_db` so that both processes see committed rows.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from chorus.web_server import web_server_argv
from tests.e2e.conftest import ROOT, collect_lines, stack_env, stop_process


@dataclass
class AsgiServer:
    url: str
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    def stop(self) -> None:
        stop_process(self.process)


def healthy(url: str) -> bool:
    """Whether the web server at `url` answers its liveness probe."""
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(storage_root: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # The web tier names the workers' engine too (it refuses at submit what that
    # engine cannot serve): the workers these tests start run the synthetic one.
    return stack_env(
        {"CHORUS_ENGINE": "synthetic", "CHORUS_STORAGE_ROOT": storage_root, **(extra or {})}
    )


def start_asgi(
    env: dict[str, str], *, port: int | None = None, cwd: Path = ROOT, timeout: float = 30
) -> AsgiServer:
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [*web_server_argv(host="127.0.0.1", port=port), "--log-level", "warning"],
        cwd=cwd,
        env={**env, "CHORUS_PUBLIC_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = AsgiServer(url=url, process=process)
    threading.Thread(target=collect_lines, args=(process, server.lines), daemon=True).start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            httpx.get(f"{url}/healthz", timeout=1)  # any answer: it is serving
            return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.stop()
    raise AssertionError("uvicorn did not start:\n" + "".join(server.lines[-60:]))


@pytest.fixture
def asgi_server(transactional_db: None, settings: Any) -> Iterator[Callable[..., AsgiServer]]:
    """Start the web tier under uvicorn; stopped at the end of the test."""
    servers: list[AsgiServer] = []

    def start(extra_env: dict[str, str] | None = None) -> AsgiServer:
        server = start_asgi(server_env(settings.STORAGE["local_root"], extra_env))
        settings.STORAGE = {**settings.STORAGE, "base_url": server.url}
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
