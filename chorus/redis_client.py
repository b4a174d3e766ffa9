"""One Redis connection pool per process, for everything that is not Celery."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def get_redis() -> redis.Redis | None:
    """None when no Redis is configured (a management command outside the stack)."""
    if not settings.REDIS_URL:
        return None
    return redis.Redis.from_url(
        settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2, health_check_interval=30
    )
