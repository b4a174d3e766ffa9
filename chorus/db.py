"""Database connections in long-lived requests, and through an outage.

Django hands a request's connection back (to the pool) when the request ends.
A streamed response ends when its audio does, seconds or minutes later, and a
connection held that long by every open stream exhausts the pool: new requests
would queue behind streams that are only waiting on Redis. Streaming code calls
the database through `released`, which gives the connection back at once.

A worker that loses the database mid-job (a restart, a failover) makes each of
its writes `patiently`: a job must not be stranded, `running` with nobody
writing its end, because one statement met a dead connection.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import (
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
)

from chorus.db_liveness import connection_ended

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


def release_connections() -> None:
    """Close this thread's connections (with a pool: return them to it), except
    one inside a transaction, which its owner still needs."""
    for each in connections.all(initialized_only=True):
        if not each.in_atomic_block:
            each.close()


def released(func: Callable[P, R]) -> Callable[P, R]:
    """`func`, then `release_connections()`: for sync code run from a stream."""

    @functools.wraps(func)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        finally:
            release_connections()

    return call


def recycle_connections() -> None:
    """What Django does around a request, for a process that keeps its
    connections (a worker): close this thread's connections that are past their
    age or met an error, and those the server has ended (`chorus.db_liveness`:
    seen on the socket, with no query, so the next job's first statement does not
    wait for a health check's round trip)."""
    close_old_connections()
    for each in connections.all(initialized_only=True):
        raw = each.connection
        if (
            raw is not None
            and each.vendor == "postgresql"
            and not each.in_atomic_block
            and connection_ended(raw)
        ):
            each.close()


# Backoff between tries: the first soon (a connection cut by a restart is
# replaced at once), then doubling up to a cap that bounds how long after the
# database's return a waiting write notices it.
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 2.0


def patiently(step: Callable[[], R], *, patience_s: float) -> R:
    """`step`, tried again with backoff and jitter while the database is
    unreachable, for up to `patience_s`; then its error.

    `step` must be whole: a transaction it opens is opened again on every try.
    Inside a caller's transaction nothing is tried again: the transaction died
    with its connection, and only the code that opened it can start over.
    """
    deadline = time.monotonic() + patience_s
    delay = FIRST_DELAY_S
    while True:
        try:
            return step()
        except (OperationalError, InterfaceError) as exc:
            if connection.in_atomic_block or time.monotonic() + delay > deadline:
                raise
            log.warning("database unavailable; trying again in %.1f s: %s", delay, exc)
            # Closed, not reused: a connection that failed may be dead, and this
            # thread would be handed it again.
            connection.close()
            # Jitter: a worker's threads that failed together do not all come
            # back to the database in the same instant.
            time.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, MAX_DELAY_S)
