"""Slow clients against the real web server (uvicorn with Chorus's protocol),
over real sockets: half-sent headers and bodies that never arrive are cut off."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable

import httpx
import pytest

from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

LIMITS = {"CHORUS_HTTP_HEADER_TIMEOUT": "1", "CHORUS_HTTP_BODY_IDLE_TIMEOUT": "1"}


def connect(server: AsgiServer, first_bytes: bytes) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(first_bytes)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed the connection (EOF or reset), False if still open."""
    sock.settimeout(0.05)
    try:
        return sock.recv(65536) == b"" or closed_by_server(sock)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_half_sent_headers_and_bodies_that_never_come_are_cut_off(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    server = asgi_server(LIMITS)
    slow_headers = [
        connect(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow") for _ in range(30)
    ]
    silent = [connect(server, b"") for _ in range(10)]
    no_body = [
        connect(
            server,
            b"POST /v1/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"text":',
        )
        for _ in range(20)
    ]
    # A trickle of header bytes does not extend the deadline.
    started = time.monotonic()
    while time.monotonic() - started < 0.8:
        for sock in slow_headers[:5]:
            sock.sendall(b"a")
        time.sleep(0.2)

    time.sleep(1.7)  # past both limits, with room for a loaded machine

    still_open = [s for s in slow_headers + silent + no_body if not closed_by_server(s)]
    assert still_open == []
    # Meanwhile and after, a normal client is served.
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    for sock in slow_headers + silent + no_body:
        sock.close()


def test_a_slow_but_steady_body_is_not_cut_off(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    server = asgi_server(LIMITS)
    body = b'{"text": "Hello there."}'
    sock = connect(
        server,
        b"POST /v1/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode(),
    )
    for piece in (body[:8], body[8:16], body[16:]):  # 1.5 s in all, 0.5 s apart
        time.sleep(0.5)
        sock.sendall(piece)
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()

    # It reached the API (no key: 401), after longer than the idle limit in all.
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def read_response(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    sock.settimeout(10)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def accepted_then_stopped(server: AsgiServer) -> socket.socket:
    """A connection the server has accepted and that has sent nothing yet, once
    the server has been told to stop (SIGTERM) and has begun to."""
    fresh = connect(server, b"")
    kept = connect(server, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    kept.settimeout(10)
    head = kept.recv(65536)  # answered, so both are accepted (fresh first)
    assert head.startswith(b"HTTP/1.1 200 "), head[:200]
    server.process.send_signal(signal.SIGTERM)
    # The stop closes a kept-alive connection between requests at once, as HTTP
    # allows, in the same turn as it gives `fresh` its grace.
    read_response(kept)
    kept.close()
    return fresh


def test_a_connection_accepted_before_a_graceful_stop_gets_its_first_request_answered(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    # A connection the server accepted from its queue just before it was told to
    # stop, whose request is still on its way: it is answered, then closed.
    server = asgi_server()
    fresh = accepted_then_stopped(server)
    fresh.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    answer = read_response(fresh)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert b"connection: close" in answer.lower()
    assert server.process.wait(timeout=20) in (0, -signal.SIGTERM)  # uvicorn ends as asked
    fresh.close()


def test_a_websocket_upgrade_during_a_graceful_stop_is_refused_with_503(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
) -> None:
    # A session opened now would have nothing to close it: it is refused, so the
    # client connects again, to a server that stays.
    server = asgi_server()
    fresh = accepted_then_stopped(server)
    fresh.sendall(
        b"GET /v1/speech/realtime HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    answer = read_response(fresh)
    assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
    assert b'"service_unavailable"' in answer
    assert server.process.wait(timeout=20) in (0, -signal.SIGTERM)
    fresh.close()
