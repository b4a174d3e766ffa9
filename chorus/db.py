"""Database connections in long-lived requests.

Django hands a request's connection back (to the pool) when the request ends.
A streamed response ends when its audio does, seconds or minutes later, and a
connection held that long by every open stream exhausts the pool: new requests
would queue behind streams that are only waiting on Redis. Streaming code calls
the database through `released`, which gives the connection back at once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import connections

P = ParamSpec("P")
R = TypeVar("R")


def release_connections() -> None:
    """Close this thread's connections (with a pool: return them to it), except
    one inside a transaction, which its owner still needs."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def released(func: Callable[P, R]) -> Callable[P, R]:
    """`func`, then `release_connections()`: for sync code run from a stream."""

    @functools.wraps(func)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        finally:
            release_connections()

    return call
