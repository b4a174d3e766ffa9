"""A real HTTP server on loopback that receives webhooks, as a customer's would.

It answers each request with the next status of a script (then 204), can stall
before answering (to make the sender's read time out), and records every
request's headers and body.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    port: int
    statuses: list[int] = field(default_factory=list)  # answers to give, in order
    stalls: list[float] = field(default_factory=list)  # seconds to wait first, in order
    location: str = ""  # sent with a 3xx
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_answer(self) -> tuple[int, float]:
        with self.lock:
            status = self.statuses.pop(0) if self.statuses else 204
            stall = self.stalls.pop(0) if self.stalls else 0.0
        return status, stall

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.received) >= count:
                return list(self.received)
            time.sleep(0.05)
        raise AssertionError(f"received {len(self.received)} of {count} webhooks")


@contextmanager
def receiver_running() -> Iterator[Receiver]:
    state: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver: Receiver = state["receiver"]
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, stall = receiver.next_answer()
            receiver.received.append(Received(self.path, dict(self.headers.items()), body))
            if stall:
                time.sleep(stall)
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", receiver.location)
            payload = f"answer {status}".encode()
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    state["receiver"] = Receiver(url=f"http://127.0.0.1:{port}/hooks", port=port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        server.shutdown()
        server.server_close()
