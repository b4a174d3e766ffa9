"""Every place Chorus reaches into kombu's or Celery's internals, and why no
supported hook does it. Everything else goes through their options: the queue
order and the stream lanes (`queue_order_strategy` names `synthesis.lanes`'s
cycle), prefetch (`worker_prefetch_multiplier`,
`worker_enable_prefetch_count_reduction`), timeouts and Sentinel
(`broker_transport_options`, `chorus.redis_location`), the lanes' log line (a
consumer bootstep).

Two overrides of kombu's Redis channel remain, for one server and through
Sentinel alike (`CELERY_BROKER_TRANSPORT` names the transports below):

* `_create_client`: kombu builds a new `redis.Redis` client for every
  synchronous operation (taking a message into its unacknowledged set,
  acknowledging it, publishing one), and redis-py fills a table of some 170
  response callbacks in each client it builds: about 0.2 ms of CPU, three
  times per job on a worker and once more per job it releases. A client holds
  no connection of its own (it borrows one from the channel's pool per
  command) and is safe to share between threads, so the channel keeps one, and
  builds a new one only when its pool was replaced (after a reconnect). kombu
  has no option for it.
* `_brpop_start`: the BRPOP's timeout is the channel's `brpop_timeout`, one
  number for the channel's life. While a GPU worker's lanes leave some of its
  queues out, the pending BRPOP must end soon, so that a queue admitted again
  is asked at once (`synthesis.lanes`, `NARROW_BRPOP_TIMEOUT_S`).

kombu and Celery are pinned (pyproject.toml) and
`tests/test_kombu_overrides.py` fails when the installed versions or the
internals these rely on (the names, signatures and attributes in `RELIED_ON`)
change: check them again before moving a pin.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis
from redis import exceptions as redis_errors

# What the overrides assume of kombu's `redis.Channel`: the methods they replace
# (with their parameters) and the attributes they read.
RELIED_ON = {
    "methods": {"_create_client": ("self", "asynchronous"), "_brpop_start": ("self", "timeout")},
    "attributes": ("_queue_cycle", "active_queues", "pool", "brpop_timeout"),
}


class _SharedClient:
    """The overrides, for a channel to one server and one through Sentinel alike."""

    _shared_client: Any = None
    # Provided by the kombu channel this is mixed into.
    pool: Any
    connection: Any
    active_queues: Any
    _queue_cycle: Any

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:  # the BRPOP client: kombu already keeps that one
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        if getattr(self.connection, "client", None) is None:
            # The connection is already closed, as when a failover drops it while
            # unacked messages are being restored: kombu would fail on its missing
            # URL with an AttributeError (building a pool, whether or not a client
            # is kept), which Celery's reconnect does not catch, and the worker
            # would stop consuming for good. A connection error is what it ignores
            # there (the sweeper republishes what was not restored).
            raise redis_errors.ConnectionError("the broker connection is closed")
        client = self._shared_client
        if client is None or client.connection_pool is not self.pool:
            client = self._shared_client = super()._create_client()  # type: ignore[misc]
        return client

    def _brpop_start(self, timeout: float | None = None) -> Any:
        if timeout is None:
            narrowed = getattr(self._queue_cycle, "brpop_timeout", None)  # a GPU worker's lanes
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
