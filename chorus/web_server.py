"""The web tier's HTTP server: uvicorn, with time limits on slow clients.

uvicorn closes an idle keep-alive connection, but it waits for ever for a request
whose headers arrive a byte at a time, or whose body never comes: each such
socket holds a file handle until the process runs out (slowloris). Here each
connection gets:

* `CHORUS_HTTP_HEADER_TIMEOUT` (10 s) from its first byte, or from the end of
  the previous response, to the end of a request's headers;
* `CHORUS_HTTP_BODY_IDLE_TIMEOUT` (30 s) between two pieces of a request body
  (idle time, so a large upload over a slow link still goes through).

Past either the connection is closed. At a graceful stop, a connection that
has yet to bring its first request gets `FIRST_REQUEST_GRACE_S` (2 s) to send it
and is answered (`TimedHttpToolsProtocol.shutdown`). uvicorn's own `--limit-concurrency`
(`CHORUS_WEB_MAX_CONNECTIONS`, 1000) answers 503 to requests beyond that many open
connections. Every connection is set TCP_NODELAY (`_no_delay`). A proxy in front
(nginx, a load balancer) should enforce the same and more (per-client connection
and rate caps); see the README.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import json
import logging
import os
import socket
import sys
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from chorus.errors import ResponseCut
from chorus.web_supervisor import WebSupervisor

HEADER_TIMEOUT_S = float(os.environ.get("CHORUS_HTTP_HEADER_TIMEOUT", "10"))
BODY_IDLE_TIMEOUT_S = float(os.environ.get("CHORUS_HTTP_BODY_IDLE_TIMEOUT", "30"))
MAX_CONNECTIONS = int(os.environ.get("CHORUS_WEB_MAX_CONNECTIONS", "1000"))
# At a graceful stop, how long a connection that has yet to bring its first
# request gets to send it (`TimedHttpToolsProtocol.shutdown`).
FIRST_REQUEST_GRACE_S = 2.0
PROTOCOL = "chorus.web_server:TimedHttpToolsProtocol"


class _Awaiting(enum.Enum):
    """What a connection waits for from its client."""

    HEADERS = "headers"  # (the rest of) a request's headers
    BODY = "body"  # more of a request's body
    NOTHING = "nothing"  # the request is read; the response is on its way


class TimedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol on httptools (llhttp, in C: about a third of
    h11's CPU per request, `bench/http_protocol.py`) with a header deadline and a
    body idle limit."""

    _deadline: asyncio.TimerHandle | None = None
    _deadline_base: float | None = None  # when the wait for the current headers began
    _due: float | None = None  # when the connection is cut unless the client moves on
    _awaiting = _Awaiting.HEADERS
    _answered = False  # a response on this connection has been completed
    _stopping = False  # the server stops: the request under way is the last
    _grace: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _no_delay(transport)
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    # The parser's callbacks, as `data_received` feeds it.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting = _Awaiting.HEADERS  # a pipelined request may begin early

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._awaiting = _Awaiting.BODY
        self._deadline_base = None
        if self._stopping and self.cycle is not None:
            self.cycle.keep_alive = False  # answered, then closed

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._awaiting = _Awaiting.NOTHING

    def on_response_complete(self) -> None:
        self._answered = True
        super().on_response_complete()
        if self._awaiting is _Awaiting.NOTHING and self.cycle.response_complete:
            # The next request's headers start now. (A pipelined request the
            # parser read already runs now: `self.cycle` is it. A response sent
            # before its request's body was read leaves the body's limit running.)
            self._awaiting = _Awaiting.HEADERS
            self._deadline_base = None
        self._arm()

    def shutdown(self) -> None:
        """At a graceful stop uvicorn closes every connection with no request
        under way. One that has yet to bring its first request was accepted a
        moment ago, from the socket's queue, and its client has sent or is
        sending that request: closed now, the client would see it go unanswered
        ("server disconnected"), and a proxy in front could not tell whether to
        send it elsewhere. It gets `FIRST_REQUEST_GRACE_S` to send it, and an
        answer, with the connection closed after (a WebSocket upgrade is answered
        503). A kept-alive connection that waits between requests is closed at
        once, as before. (A connection accepted after uvicorn has signalled its
        connections is uvicorn's as before: answered, then held up to its
        keep-alive timeout.)"""
        if self._answered or self.cycle is not None or self.transport.is_closing():
            super().shutdown()
            return
        self._stopping = True
        self._grace = self.loop.call_later(FIRST_REQUEST_GRACE_S, self._end_grace)

    def _end_grace(self) -> None:
        self._grace = None
        if (
            self.cycle is None
            and not self.transport.is_closing()
            and self.transport.get_protocol() is self  # not handed on (an upgrade)
        ):
            self.transport.close()  # it sent nothing in time

    def handle_websocket_upgrade(self) -> None:
        if not self._stopping:
            super().handle_websocket_upgrade()
            return
        # No session opens on a server that stops (nothing would close it).
        # Here, not at the top: the command line is read before Django is set up.
        from chorus.api.errors import envelope

        message = "This server is stopping; connect again."
        body = json.dumps(envelope("service_unavailable", message)).encode()
        self.transport.write(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\nconnection: close\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None
        self._due = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def _arm(self) -> None:
        """Note when what the connection waits for now is due. One timer per
        connection, moved only when the new due time is earlier: a kept-alive
        connection's requests then cost no timer at all (a timer cancelled and
        set twice a request took ~14 of this protocol's ~83 µs a request)."""
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self._awaiting is _Awaiting.HEADERS:
            if self._deadline_base is None:
                self._deadline_base = now
            self._due = self._deadline_base + HEADER_TIMEOUT_S
        elif self._awaiting is _Awaiting.BODY:
            self._due = now + BODY_IDLE_TIMEOUT_S
        else:
            self._due = None  # a timer still set finds nothing due
            return
        if self._deadline is not None:
            if self._deadline.when() <= self._due:
                return  # it fires first, and looks again then
            self._deadline.cancel()
        self._deadline = self.loop.call_at(self._due, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        if self._due is None or self.transport.is_closing():
            return
        if self._due - self.loop.time() > 0.001:  # the deadline moved on meanwhile
            self._deadline = self.loop.call_at(self._due, self._expire)
            return
        self.transport.close()  # connection_lost tells a running app the client is gone


class _NoTracebackForCuts(logging.Filter):
    """Drops uvicorn's "Exception in ASGI application" for a `ResponseCut`: a
    stream ended on purpose (its job failed), logged in one line where it was
    raised. uvicorn's handling of it is what a cut needs: the connection is closed
    without the body's final chunk. Other exceptions keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ResponseCut))


# On the logger each connection's cycle logs to; kept when uvicorn configures
# logging again (dictConfig replaces a logger's handlers, not its filters).
logging.getLogger("uvicorn.error").addFilter(_NoTracebackForCuts())


def _no_delay(transport: asyncio.Transport) -> None:
    """Send small writes at once. With `--workers` above 1 uvicorn binds the
    listening socket itself, with proto 0, and asyncio sets TCP_NODELAY only on
    sockets whose proto is TCP (uvicorn issue #3149): a response's body then waits
    ~40 ms for the client's delayed ACK of its headers. `bench/web_nodelay.py`."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    with contextlib.suppress(OSError):  # closed already: nothing to speed up
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def web_server_argv(
    *, host: str, port: int, workers: int = 1, access_log: bool = False
) -> list[Any]:
    """The command line that runs the web tier (runstack, tests, benches)."""
    argv: list[Any] = [
        sys.executable,
        "-m",
        "chorus.web_server",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    if access_log:
        argv.append("--access-log")
    return argv


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m chorus.web_server",
        description="Serve the Chorus web tier: uvicorn, one listening socket per process.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="web processes (default 1)")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="requests of a process that run Python at once (default: CHORUS_WEB_THREADS or 2)",
    )
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--access-log", action="store_true", help="a line per request")
    parser.add_argument(
        "--proxy-headers",
        action=argparse.BooleanOptionalAction,
        default=True,  # as uvicorn's own command line
        help="trust X-Forwarded-For/-Proto from --forwarded-allow-ips (behind a proxy)",
    )
    parser.add_argument("--forwarded-allow-ips", default="127.0.0.1")
    parser.add_argument("--http", default=PROTOCOL, help=argparse.SUPPRESS)  # benches only
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit("--threads must be at least 1")
        os.environ["CHORUS_WEB_THREADS"] = str(args.threads)  # read by each process's settings
    options: dict[str, Any] = {
        "app": "chorus.asgi:application",
        "host": args.host,
        "port": args.port,
        "http": args.http,
        # Realtime sessions' WebSockets (synthesis.realtime): websockets' sans-I/O
        # protocol, not its legacy one (deprecated since websockets 14).
        "ws": "websockets-sansio",
        "ws_max_size": 1024 * 1024,
        "ws_ping_interval": 20.0,
        "ws_ping_timeout": 20.0,
        "limit_concurrency": MAX_CONNECTIONS,
        "log_level": args.log_level,
        "access_log": args.access_log,
        "proxy_headers": args.proxy_headers,
        "forwarded_allow_ips": args.forwarded_allow_ips,
        "lifespan": "off",  # Django has no lifespan; "auto" logs a warning per process
    }
    if args.workers <= 1:
        uvicorn.run(**options)
        return 0
    uvicorn.Config(**options)  # sets up logging here as in each process
    return WebSupervisor(options, workers=args.workers).run()


if __name__ == "__main__":
    sys.exit(main())
