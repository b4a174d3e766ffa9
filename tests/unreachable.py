"""A broker address where nothing listens, for tests of what happens without one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from chorus.redis_client import get_redis


def dead_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def unreachable_broker(settings: Any) -> Iterator[None]:
    settings.REDIS_URL = f"redis://127.0.0.1:{dead_port()}/0"
    get_redis.cache_clear()
    yield
    get_redis.cache_clear()
