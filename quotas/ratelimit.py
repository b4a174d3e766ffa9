"""Requests per minute, per tenant and per key, exact under concurrency.

A sliding-window log in Redis: each admitted request is a member of a sorted set
scored by its time. One Lua script trims both windows, checks both counts and
admits into both, atomically, using Redis's own clock so web processes on
different machines agree. A refused request is not recorded, so a client that
keeps hammering does not push its own window forward.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis

from chorus.redis_client import (
    get_redis,
    note_redis_answer,
    note_redis_failure,
    redis_failed_lately,
)

log = logging.getLogger(__name__)

WINDOW_MS = 60_000

_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local window = tonumber(ARGV[1])
local member = ARGV[2]
local remaining = {}
local resets = {}
for i, key in ipairs(KEYS) do
  local limit = tonumber(ARGV[2 + i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local count = redis.call('ZCARD', key)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local reset = window
  if oldest[2] then reset = tonumber(oldest[2]) + window - now end
  if count >= limit then
    return {0, 0, reset, i}  -- refused by window i
  end
  remaining[i] = limit - count - 1
  resets[i] = reset
end
local binding = 1
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now, member)
  redis.call('PEXPIRE', key, window)
  if remaining[i] < remaining[binding] then binding = i end
end
return {1, remaining[binding], resets[binding], binding}
"""


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    limit: int
    remaining: int
    reset_ms: int
    scope: str  # the window that decided: "tenant" or "key"

    @property
    def reset_seconds(self) -> int:
        return max(1, -(-self.reset_ms // 1000))  # ceiling


_script: Any = None


def rate_limit_hit(
    *, tenant_id: int, key_id: int, tenant_limit: int, key_limit: int, reads: bool = False
) -> RateDecision | None:
    """Count one request against the tenant's and the key's windows (the read
    windows when `reads`: reads and writes are counted apart, so polling a job
    never uses up the requests that submit work).

    None when Redis is unavailable: the limiter fails open (logged) rather than
    taking the whole API down with it; admission of work still fails closed.
    """
    global _script
    client = get_redis()
    if client is None or redis_failed_lately():
        return None
    if _script is None or _script.registered_client is not client:  # a new client: its own
        _script = client.register_script(_SCRIPT)
    kind = "rl:read" if reads else "rl"
    keys = [f"chorus:{kind}:tenant:{tenant_id}", f"chorus:{kind}:key:{key_id}"]
    try:
        allowed, remaining, reset_ms, window = _script(
            keys=keys, args=[WINDOW_MS, uuid.uuid4().hex, tenant_limit, key_limit]
        )
    except redis.RedisError:
        note_redis_failure()
        log.warning("rate limiter unavailable; request admitted", exc_info=True)
        return None
    note_redis_answer(client)
    scope = "tenant" if int(window) == 1 else "key"
    return RateDecision(
        allowed=bool(allowed),
        limit=tenant_limit if scope == "tenant" else key_limit,
        remaining=int(remaining),
        reset_ms=int(reset_ms),
        scope=scope,
    )
