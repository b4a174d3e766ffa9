"""One Redis connection pool per process, for everything that is not Celery."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from functools import cache

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from chorus.redis_location import parse_redis_url


@cache
def get_redis() -> redis.Redis | None:
    """None when no Redis is configured (a management command outside the stack)."""
    if not settings.REDIS_URL:
        return None
    # One retry, not redis-py's three with backoff: a broker that does not answer
    # must turn into a quick 503 (`queue_unavailable`), not a request held for
    # tens of seconds.
    return parse_redis_url(settings.REDIS_URL).client(
        socket_connect_timeout=2,
        socket_timeout=2,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1),
    )


# After a call to Redis failed, calls that can do without it (the rate limiter,
# the check before a stream) skip it for this long instead of each waiting out
# its timeouts: a broker cut off answers nothing, so every request would hold a
# request thread for seconds, and the web's own health checks would queue
# behind them.
SKIP_AFTER_FAILURE_S = 3.0
_failed_at = -SKIP_AFTER_FAILURE_S
_failures = 0


def redis_failed_lately() -> bool:
    return time.monotonic() - _failed_at < SKIP_AFTER_FAILURE_S


def note_redis_failure() -> None:
    global _failed_at, _failures
    _failed_at = time.monotonic()
    _failures += 1


def redis_failures() -> int:
    """How many calls to Redis this process has noted as failed
    (`note_redis_failure`): a pool's idle connections from before the latest may
    lead to a server that is gone."""
    return _failures


# A call that needs Redis working now (a stream's audio travels through it) may
# take an answer to this process's client within the last second (the rate
# limiter's, usually in the same request) for one: a PING more would cost a round
# trip on the way to first audio and tell little the next command does not.
ANSWERED_WITHIN_S = 1.0
_answered: tuple[Callable[[], redis.Redis | None], float] = (lambda: None, -ANSWERED_WITHIN_S)


def note_redis_answer(client: redis.Redis) -> None:
    global _answered
    _answered = (weakref.ref(client), time.monotonic())


def redis_answered_lately(client: redis.Redis) -> bool:
    """Whether `client` had an answer within `ANSWERED_WITHIN_S`, and no call
    failed since."""
    who, at = _answered
    return (
        who() is client and time.monotonic() - at < ANSWERED_WITHIN_S and not redis_failed_lately()
    )


def redis_failures_forget() -> None:
    """Try Redis at the next call (tests that bring a broker back)."""
    global _failed_at
    _failed_at = -SKIP_AFTER_FAILURE_S
