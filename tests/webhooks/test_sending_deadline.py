"""An attempt has one deadline (CHORUS_WEBHOOK_TIMEOUT): connecting, sending and
the answer together. A receiver that trickles its answer a byte at a time, each
byte well within any per-read timeout, is cut off at the deadline, not when it
stops (one such receiver held each attempt 322 s under a 10 s read timeout). A
real socket server on loopback; the deadline is shortened to keep the test fast."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from webhooks.sending import webhook_send

DEADLINE_S = 1.0
TRICKLE_EVERY_S = 0.25  # a quarter of the deadline: no single read waits long
TRICKLE_FOR_S = 8.0  # then it would answer in full, 2xx


@dataclass
class Trickler:
    url: str
    cut_off_after: list[float] = field(default_factory=list)  # seconds, per connection


@contextmanager
def trickling_receiver(where: str) -> Iterator[Trickler]:
    """Reads the request, then writes its answer a byte every TRICKLE_EVERY_S: the
    status line and headers (`where` "head"), or a complete head and then the body
    ("body"), for TRICKLE_FOR_S. Records how long it wrote before the sender left."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    trickler = Trickler(url=f"http://127.0.0.1:{port}/hooks")
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            started = time.monotonic()
            body = b"x" * int(TRICKLE_FOR_S / TRICKLE_EVERY_S)
            head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
            if where == "head":
                slow = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * len(body)
                fast, slow = b"", slow
                tail = b"\r\nContent-Length: 0\r\n\r\n"
            else:
                fast, slow, tail = head, body, b""
            try:
                conn.sendall(fast)
                for byte in slow:
                    if stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(TRICKLE_EVERY_S)
                conn.sendall(tail)
                conn.recv(1)  # until the sender closes
            except OSError:
                pass
            trickler.cut_off_after.append(time.monotonic() - started)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield trickler
    finally:
        stop.set()
        listener.close()


@pytest.mark.parametrize("where", ["head", "body"])
def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_attempts_deadline(
    settings: Any, where: str
) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    settings.WEBHOOK_TIMEOUT_S = DEADLINE_S
    with trickling_receiver(where) as trickler:
        started = time.monotonic()
        outcome = webhook_send(url=trickler.url, body=b"{}", headers={})
        took = time.monotonic() - started
        deadline = time.monotonic() + 5
        while not trickler.cut_off_after and time.monotonic() < deadline:
            time.sleep(0.05)

    assert not outcome.succeeded
    assert outcome.error == "timeout: ReadTimeout"
    assert DEADLINE_S * 0.9 <= took < DEADLINE_S + 0.5
    assert outcome.latency_ms < (DEADLINE_S + 0.5) * 1000
    # The receiver saw the connection closed then, not after its whole answer.
    [cut_off_after] = trickler.cut_off_after
    assert cut_off_after < DEADLINE_S + 1.0


def test_a_receiver_that_answers_within_the_deadline_succeeds(settings: Any, receiver: Any) -> None:
    settings.WEBHOOK_TIMEOUT_S = DEADLINE_S
    receiver.stalls = [DEADLINE_S / 2]

    outcome = webhook_send(url=receiver.url, body=b"{}", headers={})

    assert outcome.succeeded, outcome
    assert outcome.response_status == 204
