"""Several web processes on one port (`python -m chorus.web_server --workers 2`).

Real processes and real sockets: each web process listens on a socket of its own
(SO_REUSEPORT), so connections opened together are spread over the processes
instead of all landing on whichever woke first; a process that dies is
replaced; SIGHUP replaces them one by one without refusing a request; a port
that another program holds stops the command at once with an error.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from chorus.web_server import web_server_argv
from tests.e2e.asgi import AsgiServer, free_port, healthy
from tests.e2e.conftest import ROOT, collect_lines, stack_env

pytestmark = pytest.mark.django_db(transaction=True)

STARTUP_FAILURE = 3  # uvicorn's exit status for "could not start"


def _start(workers: int = 2, port: int | None = None) -> AsgiServer:
    port = port or free_port()
    process = subprocess.Popen(
        [*map(str, web_server_argv(host="127.0.0.1", port=port, workers=workers))],
        cwd=ROOT,
        env=stack_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = AsgiServer(url=f"http://127.0.0.1:{port}", process=process)
    threading.Thread(target=collect_lines, args=(process, server.lines), daemon=True).start()
    return server


def _wait_serving(server: AsgiServer, processes: int, gone: int | None = None) -> list[int]:
    """The web processes' pids once `processes` of them listen (`gone` not among
    them) and it answers."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert server.process.poll() is None, "".join(server.lines[-40:])
        pids = _listeners(server)
        if len(pids) == processes and gone not in pids and healthy(server.url):
            return pids
        time.sleep(0.2)
    raise AssertionError("the web server did not start:\n" + "".join(server.lines[-40:]))


def _listeners(server: AsgiServer) -> list[int]:
    """The supervisor's children that listen on its port."""
    port = int(server.url.rsplit(":", 1)[1])
    pids = []
    for child in psutil.Process(server.process.pid).children():
        try:
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == port
                for c in child.net_connections("tcp")
            ):
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            pass
    return sorted(pids)


@pytest.fixture
def two_processes() -> Iterator[tuple[AsgiServer, list[int]]]:
    server = _start(workers=2)
    try:
        yield server, _wait_serving(server, processes=2)
    finally:
        server.stop()


def test_each_process_listens_on_its_own_socket_and_connections_reach_both(
    two_processes: tuple[AsgiServer, list[int]],
) -> None:
    server, pids = two_processes
    port = int(server.url.rsplit(":", 1)[1])
    # 32 connections opened together, as a client pool or a proxy does: with one
    # shared socket they all went to one process.
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
    try:
        time.sleep(0.5)  # let both processes accept what is theirs
        per_process = {
            pid: sum(
                1
                for c in psutil.Process(pid).net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
            )
            for pid in pids
        }
    finally:
        for client in clients:
            client.close()
    assert sum(per_process.values()) == 32
    assert all(count > 0 for count in per_process.values()), per_process


def test_a_process_that_dies_is_replaced_and_the_port_keeps_answering(
    two_processes: tuple[AsgiServer, list[int]],
) -> None:
    server, pids = two_processes
    psutil.Process(pids[0]).kill()
    new_pids = _wait_serving(server, processes=2, gone=pids[0])
    assert pids[0] not in new_pids
    assert pids[1] in new_pids
    assert "died" in "".join(server.lines)


def test_sighup_replaces_every_process_without_refusing_a_request(
    two_processes: tuple[AsgiServer, list[int]],
) -> None:
    server, pids = two_processes
    statuses: list[int | str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:  # a new connection each time: each lands on some process's socket
                statuses.append(httpx.get(f"{server.url}/healthz", timeout=5).status_code)
            except httpx.HTTPError as exc:
                statuses.append(repr(exc))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            current = _listeners(server)
            if len(current) == 2 and not set(current) & set(pids):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("not replaced:\n" + "".join(server.lines[-40:]))
        time.sleep(0.5)
    finally:
        done.set()
        poller.join()
    assert len(statuses) > 20
    assert set(statuses) == {200}, [s for s in statuses if s != 200][:5]


def test_a_port_another_program_holds_stops_it_at_once_with_an_error() -> None:
    with socket.socket() as other:  # no SO_REUSEPORT: the port is not ours to share
        other.bind(("127.0.0.1", 0))
        other.listen()
        server = _start(workers=2, port=other.getsockname()[1])
        try:
            assert server.process.wait(timeout=30) == STARTUP_FAILURE
        finally:
            server.stop()
    time.sleep(0.2)  # the output thread drains the pipe
    assert "cannot listen" in "".join(server.lines)


def test_sigterm_stops_the_supervisor_and_every_process(
    two_processes: tuple[AsgiServer, list[int]],
) -> None:
    server, pids = two_processes
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=40) == 0
    assert not [pid for pid in pids if psutil.pid_exists(pid)]


def test_processes_stop_themselves_when_the_supervisor_is_killed_outright(
    two_processes: tuple[AsgiServer, list[int]],
) -> None:
    server, pids = two_processes
    server.process.kill()  # SIGKILL: the supervisor cannot pass anything on
    server.process.wait(timeout=10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_running(pid) for pid in pids):
        time.sleep(0.2)
    assert not [pid for pid in pids if _running(pid)]


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
