"""The web protocol's deadlines on a real uvicorn server and real sockets, with an
app that takes longer to answer than the header deadline: the deadline is for
the client's headers, never for the app's answer, on a kept-alive connection and
with pipelined requests alike. (Slow clients against the whole service are
tests/e2e/test_slow_clients.py.)"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from chorus import web_server

HEADER_LIMIT_S = 0.4
APP_S = 0.6  # each answer takes longer than the header limit


async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(APP_S)
    body = scope["path"].encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int]]:
    monkeypatch.setattr(web_server, "HEADER_TIMEOUT_S", HEADER_LIMIT_S)
    monkeypatch.setattr(web_server, "BODY_IDLE_TIMEOUT_S", HEADER_LIMIT_S)
    config = uvicorn.Config(
        slow_app,
        host="127.0.0.1",
        port=0,
        http=web_server.TimedHttpToolsProtocol,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=60,  # only the protocol's own deadlines apply here
    )
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (running.started and running.servers):
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    host, port = running.servers[0].sockets[0].getsockname()[:2]
    yield host, port
    running.should_exit = True
    thread.join(10)


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode()


def read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """The bodies of `count` answers (each body is the request's path)."""
    sock.settimeout(5)
    data = b""
    bodies: list[bytes] = []
    while len(bodies) < count:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(bodies)} answers"
        data += chunk
        while b"\r\n\r\n" in data:
            head, rest = data.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                break
            bodies.append(rest[:length])
            data = rest[length:]
    return bodies


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_slow_answer_is_not_cut_off_and_the_next_request_gets_a_fresh_deadline(
    server: tuple[str, int],
) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(request("/one"))
        assert read_answers(sock, 1) == [b"/one"]  # APP_S > the header limit
        time.sleep(HEADER_LIMIT_S / 2)  # idle, kept alive, within the limit
        sock.sendall(request("/two"))
        assert read_answers(sock, 1) == [b"/two"]
        # Nothing more from the client: its next headers are due within the limit.
        assert closed_within(sock, HEADER_LIMIT_S + 2)


def test_pipelined_requests_are_all_answered_however_long_each_takes(
    server: tuple[str, int],
) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(request("/a") + request("/b") + request("/c"))  # one write
        assert read_answers(sock, 3) == [b"/a", b"/b", b"/c"]  # 3 x APP_S in all
        assert closed_within(sock, HEADER_LIMIT_S + 2)


def test_a_request_whose_headers_stop_halfway_is_cut_off(server: tuple[str, int]) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(b"GET /half HTTP/1.1\r\nHost: te")
        started = time.monotonic()
        assert closed_within(sock, HEADER_LIMIT_S + 2)
        assert time.monotonic() - started < HEADER_LIMIT_S + 1
