"""What a web process would otherwise do on its first request, done as it starts.

Django imports the URLconf (and with it every view, serializer and service) on the
first request it resolves; the database pool, the broker's producer connection and
the Redis client connect on first use. Each is a one-off, and together they made
the first stream after a start wait longer than the next ones
(`bench/first_stream.py`). A failure here is only logged: the request that needs
the part reports it as it always has.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery import Celery
from celery.utils.nodenames import host_format
from django.db import connection
from django.urls import get_resolver

from chorus.celery import app
from chorus.redis_client import get_redis
from chorus.redis_location import parse_redis_url

log = logging.getLogger(__name__)


def web_warm_up() -> list[str]:
    """Load and connect what a request uses; the names of the parts that failed."""
    failed = []
    for name, part in _PARTS:
        try:
            part()
        except Exception as exc:  # the first request will meet it and report it
            log.warning("warm-up of %s failed: %s", name, exc)
            failed.append(name)
    return failed


def _urls() -> None:
    get_resolver().url_patterns  # noqa: B018  (imports every view, serializer, service)


def _database() -> None:
    # With PostgreSQL's pool, the connection goes back to the pool for the first request.
    connection.ensure_connection()
    connection.close()


def _broker() -> None:
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=1)


def _redis() -> None:
    client = get_redis()
    if client is not None:
        client.ping()


_PARTS: list[tuple[str, Callable[[], None]]] = [
    ("the URLs", _urls),
    ("the database", _database),
    ("the broker", _broker),
    ("redis", _redis),
]


def workers_wait_ready(
    *, redis_url: str, nodes: list[str], deadline: float, alive: Callable[[], None]
) -> None:
    """Until every Celery node in `nodes` (`worker1@%h`) answers a ping: it has
    loaded its engine and consumes its queues. Before, a stack said it was up when
    its web server answered, and a job sent at once waited for the worker's start.
    `alive` raises if a process of the stack exited meanwhile."""
    waiting = {host_format(node) for node in nodes}
    while True:
        alive()
        waiting -= workers_answering(redis_url=redis_url, timeout=0.5)
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{', '.join(sorted(waiting))} did not answer in time")


def workers_answering(*, redis_url: str, timeout: float) -> set[str]:
    """The Celery nodes that answer a ping through the broker at `redis_url`. An app
    of its own: the project's app publishes through the broker named in the settings
    when this process started, before an embedded broker had its address."""
    location = parse_redis_url(redis_url)
    probe = Celery("chorus-probe", broker=location.kombu_url(), set_as_current=False)
    probe.conf.broker_transport_options = location.kombu_transport_options()
    probe.conf.accept_content = ["json"]
    try:
        replies = probe.control.ping(timeout=timeout)
    finally:
        probe.close()
    return {name for reply in replies or [] for name in reply}
