"""What a test run leaves behind, removed when it ends, Ctrl-C included: the
processes the tests started (a sweeper, a worker, a web server whose test was
interrupted before its own teardown) and the Redis keys the run made (queue
bindings, live streams, rate windows).

pytest ends the session's fixtures in `pytest_sessionfinish`, which it calls after
an interrupt too, so one session fixture covers both. Keys that were there before
the run stay: REDIS_URL may name a database that is not the tests' alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import psutil
import pytest
import redis

from chorus.redis_client import get_redis

# Long enough for a worker to hand back its jobs on SIGTERM; a child still there
# after it is killed.
_GRACE_S = 10.0


def stop_children() -> list[str]:
    """Terminate this process's descendants, then kill the ones that outlive the
    grace; their command lines, for the report."""
    children = psutil.Process(os.getpid()).children(recursive=True)
    names = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            names.append(" ".join(child.cmdline()[:4]))
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=_GRACE_S)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=_GRACE_S)
    return names


def _keys(client: redis.Redis) -> set[bytes]:
    return set(client.scan_iter(count=1000))


@pytest.fixture(scope="session", autouse=True)
def _leave_nothing_behind() -> Iterator[None]:
    client = get_redis()
    before: set[bytes] = set()
    if client is not None:
        try:
            before = _keys(client)
        except redis.RedisError:
            client = None  # no Redis at the start: nothing of the run's to remove
    yield
    stopped = stop_children()
    if stopped:
        print(f"\nstopped {len(stopped)} processes the tests left running: {stopped}")
    if client is not None:
        with contextlib.suppress(redis.RedisError):
            made = _keys(client) - before
            if made:
                client.delete(*made)
