"""Where Redis is: one server (`redis://`, `rediss://`, `unix://`), or a master
that Redis Sentinel names and moves on failover (`sentinel://`).

    sentinel://[:password@]host1:26379,host2:26379,host3:26379/0?master=chorus

lists the Sentinels (any that answers will do), the database number and the name
the Sentinels monitor (`master`, default `chorus`). The password, if any, is the
master's and the replicas' (`requirepass`/`masterauth`); Sentinels that need one
of their own take `sentinel_password=`. Every client asks a Sentinel for the
current master when it connects, so after a failover web processes, workers and
the sweeper follow the promoted replica on their next reconnect, with no restart.

Celery's broker takes the same place through kombu's Sentinel transport, which
spells it differently (`sentinel://h1:26379;sentinel://h2:26379/0` and a
`master_name` transport option): `kombu_url` translates.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "sentinel"
DEFAULT_MASTER = "chorus"
DEFAULT_SENTINEL_PORT = 26379
SENTINEL_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class RedisLocation:
    url: str
    sentinels: tuple[tuple[str, int], ...] = ()  # empty: `url` names the server itself
    master: str = DEFAULT_MASTER
    db: int = 0
    password: str | None = None
    sentinel_password: str | None = None

    @property
    def uses_sentinel(self) -> bool:
        return bool(self.sentinels)

    def client(self, **options: Any) -> redis.Redis:
        """A client of the server, or of whichever server is master now."""
        if not self.uses_sentinel:
            return redis.Redis.from_url(self.url, **options)
        sentinel = Sentinel(
            list(self.sentinels),
            sentinel_kwargs={**self._sentinel_kwargs(options), "retry": Retry(NoBackoff(), 0)},
            password=self.password,
            **options,
        )
        return sentinel.master_for(self.master, db=self.db)

    def async_client(self, **options: Any) -> aioredis.Redis:
        """The same, for asyncio code (a client is bound to its event loop)."""
        if not self.uses_sentinel:
            return aioredis.Redis.from_url(self.url, **options)
        sentinel = AsyncSentinel(
            list(self.sentinels),
            sentinel_kwargs={**self._sentinel_kwargs(options), "retry": AsyncRetry(NoBackoff(), 0)},
            password=self.password,
            **options,
        )
        return sentinel.master_for(self.master, db=self.db)

    def kombu_url(self) -> str:
        """The broker URL kombu's transports read."""
        if not self.uses_sentinel:
            return self.url
        auth = f":{self.password}@" if self.password else ""
        hosts = ";".join(f"sentinel://{auth}{host}:{port}" for host, port in self.sentinels)
        return f"{hosts}/{self.db}"

    def kombu_transport_options(self) -> dict[str, Any]:
        if not self.uses_sentinel:
            return {}
        # kombu asks the Sentinels the same way (with each reconnect of a
        # publish's retries): the same short timeouts, no retries of their own.
        return {
            "master_name": self.master,
            "sentinel_kwargs": {**self._sentinel_kwargs({}), "retry": Retry(NoBackoff(), 0)},
        }

    def _sentinel_kwargs(self, options: dict[str, Any]) -> dict[str, Any]:
        # Every connect asks the Sentinels in turn until one answers: with a
        # Sentinel host unreachable (no answer, not a refusal) each costs its
        # connect timeout, so theirs is short and never retried (the next Sentinel
        # is the retry). They sit on the deployment's network.
        timeouts = {
            "socket_timeout": min(
                options.get("socket_timeout", SENTINEL_TIMEOUT_S), SENTINEL_TIMEOUT_S
            ),
            "socket_connect_timeout": min(
                options.get("socket_connect_timeout", SENTINEL_TIMEOUT_S), SENTINEL_TIMEOUT_S
            ),
        }
        if self.sentinel_password:
            timeouts["password"] = self.sentinel_password
        return timeouts


@cache
def parse_redis_url(url: str) -> RedisLocation:
    """A REDIS_URL's location; ValueError naming what is wrong with it. Parsed
    once per URL (every stream's client asks)."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        if parts.scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(
                f"scheme must be redis, rediss, unix or sentinel, got {parts.scheme!r}"
            )
        return RedisLocation(url=url)
    hosts_part = parts.netloc.rpartition("@")[2]
    password = unquote(parts.password) if parts.password else None
    sentinels = tuple(_host_port(item) for item in hosts_part.split(",") if item.strip())
    if not sentinels:
        raise ValueError("a sentinel:// URL lists at least one Sentinel (host:port)")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"the database must be a number, got {path!r}")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(query) - {"master", "sentinel_password"}
    if unknown:
        raise ValueError(f"unknown sentinel:// option(s): {', '.join(sorted(unknown))}")
    return RedisLocation(
        url=url,
        sentinels=sentinels,
        master=query.get("master", DEFAULT_MASTER),
        db=int(path or 0),
        password=password,
        sentinel_password=query.get("sentinel_password"),
    )


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.strip().rpartition(":")
    if not host:  # no port given
        return item.strip(), DEFAULT_SENTINEL_PORT
    if not port.isdigit():
        raise ValueError(f"a Sentinel's port must be a number, got {item!r}")
    return host.strip("[]"), int(port)
