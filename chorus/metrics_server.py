"""A host's metrics on a port of its own, for hosts that run no web process.

Every process writes its counts into its host's folder (`chorus.metrics`); the
web's `/metrics` adds them up, but a GPU host has no web process. With
`CHORUS_METRICS_PORT` set, a Celery worker (started here from `worker_init`) and
the sweeper (`manage.py sweeper`) serve the same sum on that port, under the same
token rule as the web's route: no `CHORUS_METRICS_TOKEN` configured, every path
is 404 (the route does not exist); a missing or wrong token, 401.

One process of a host holds the port at a time. The others find it taken and
try again every `RETRY_BIND_S`, so when the holder exits another takes over; any
of them serves the same folder, so which one does not matter.

What is read at scrape time from shared state (queue depth, waiting jobs,
workers: `synthesis.metrics`) is not served here by workers: the sweeper and the
web serve it (`collectors`), once per deployment rather than once per process.
"""

from __future__ import annotations

import errno
import hmac
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from celery.signals import worker_init
from django.conf import settings
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

RETRY_BIND_S = 30.0
# A scraper that connects and sends nothing must not hold the one serving thread.
REQUEST_TIMEOUT_S = 10.0

# Held while a scrape holds the folder's lock: no fork happens meanwhile (see
# `_no_fork_mid_scrape`).
_scraping = threading.Lock()


def authorized(header: str) -> bool:
    """Whether an Authorization header carries the configured metrics token (call
    only when one is configured)."""
    token = settings.METRICS_TOKEN
    assert token, "no metrics token configured"
    return hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


def exposition(collectors: Iterable[Collector] = ()) -> bytes:
    """This host's folder, added up, then `collectors`, in the text format."""
    from chorus import metrics  # sets up multiprocess mode: only once Django is

    registry = CollectorRegistry()
    metrics.ProcessFilesCollector(registry)
    for collector in collectors:
        registry.register(collector)
    with _scraping, metrics.files_locked(exclusive=False):
        return generate_latest(registry)


def _no_fork_mid_scrape() -> None:
    # A prefork worker forks its pool children from the process that serves the
    # port. A child forked mid-scrape would inherit the open lock file, and with
    # it the shared flock, for its whole life: compaction would wait on it forever.
    os.register_at_fork(
        before=_scraping.acquire,
        after_in_parent=_scraping.release,
        after_in_child=_scraping.release,
    )


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def metrics_app(collectors: Callable[[], Sequence[Collector]] = tuple) -> WsgiApp:
    """The WSGI app: `GET /metrics` with the token rule; anything else is 404."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def answer(status: str, body: bytes, *headers: tuple[str, str]) -> list[bytes]:
            start_response(status, [*headers, ("Content-Length", str(len(body)))])
            return [body]

        text = ("Content-Type", "text/plain; charset=utf-8")
        if environ.get("PATH_INFO") != "/metrics" or not settings.METRICS_TOKEN:
            return answer("404 Not Found", b"Not found.\n", text)
        if not authorized(environ.get("HTTP_AUTHORIZATION", "")):
            return answer(
                "401 Unauthorized",
                b"Unauthorized: send Authorization: Bearer <token>\n",
                text,
                ("WWW-Authenticate", 'Bearer realm="metrics"'),
            )
        try:
            body = exposition(collectors())
        except Exception:  # one failed scrape is Prometheus's to count; the thread goes on
            log.exception("metrics scrape failed")
            return answer("500 Internal Server Error", b"The scrape failed.\n", text)
        return answer("200 OK", body, ("Content-Type", CONTENT_TYPE_LATEST))

    return app


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per scrape, every 15 s per Prometheus, says nothing


class _Server(WSGIServer):
    # The port of an exited holder may linger in TIME_WAIT; still two listeners
    # cannot bind it at once on Linux, which is what hands it over.
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve_metrics(
    *, collectors: Callable[[], Sequence[Collector]] = tuple, port: int | None = None
) -> threading.Thread | None:
    """Serve this host's metrics on `CHORUS_METRICS_PORT` (or `port`) from a
    daemon thread; None when no port is configured. Returns at once: binding,
    and waiting for a port another process holds, happen on the thread."""
    port = settings.METRICS_PORT if port is None else port
    if not port:
        return None
    if not settings.METRICS_TOKEN:
        log.warning("CHORUS_METRICS_PORT is set but CHORUS_METRICS_TOKEN is not: it answers 404")
    app = metrics_app(collectors)
    thread = threading.Thread(
        target=_hold_port, args=(settings.METRICS_ADDR, port, app), name="metrics-port", daemon=True
    )
    thread.start()
    return thread


def _hold_port(addr: str, port: int, app: WsgiApp) -> None:
    server_class = _Server6 if ":" in addr else _Server
    told = False
    while True:
        try:
            server = make_server(addr, port, app, server_class, _QuietHandler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                log.error("cannot serve metrics on %s:%s: %s", addr, port, exc)
                return
            if not told:
                log.info("metrics port %s is held by another process; trying again", port)
                told = True
            time.sleep(RETRY_BIND_S)
            continue
        _no_fork_mid_scrape()
        log.info("serving this host's metrics on %s:%s/metrics", addr, port)
        server.serve_forever()
        return


@worker_init.connect
def _serve_worker_metrics(**kwargs: Any) -> None:
    """Any Celery worker, GPU or light: its host's folder only (shared state is
    served by the sweeper and the web)."""
    serve_metrics()
