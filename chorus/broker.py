"""The Celery broker's transport: kombu's Redis transport, with one client per
channel instead of one per operation, and a short BRPOP while a GPU worker's
lanes leave some of its queues out (`synthesis.lanes`).

kombu's Redis channel builds a new `redis.Redis` client for every synchronous
operation (taking a message into its unacknowledged set, acknowledging it,
publishing one), and redis-py fills a table of some 170 response callbacks in
each client it builds: about 0.2 ms of CPU, three times per job on a worker and
once more per job it releases. A client holds no connection of its own (it
borrows one from the channel's pool per command) and is safe to share between
threads, so the channel keeps one, and builds a new one only when its pool was
replaced (after a reconnect).

The same for a broker reached through Redis Sentinel (`chorus.redis_location`).

kombu is pinned (pyproject.toml): `_create_client` is its own, not an API.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis


class _SharedClient:
    """The overrides, for a channel to one server and one through Sentinel alike."""

    _shared_client: Any = None
    # Provided by the kombu channel this is mixed into.
    pool: Any
    active_queues: Any

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP client: kombu already keeps that one
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client

    def _brpop_start(self, timeout: float | None = None) -> Any:
        if timeout is None:
            cycle = self._queue_cycle  # type: ignore[attr-defined]
            narrowed = getattr(cycle, "brpop_timeout", None)  # a GPU worker's lanes
            if narrowed is not None:
                timeout = narrowed(len(self.active_queues))
        return super()._brpop_start(timeout)  # type: ignore[misc]


class Channel(_SharedClient, redis.Channel):
    pass


class SentinelChannel(_SharedClient, redis.SentinelChannel):
    """Through Sentinel: the pool asks a Sentinel for the master when it connects,
    so after a failover the reconnect lands on the promoted replica."""


class Transport(redis.Transport):
    Channel = Channel


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel
