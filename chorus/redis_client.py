"""One Redis connection pool per process, for everything that is not Celery."""

from __future__ import annotations

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
