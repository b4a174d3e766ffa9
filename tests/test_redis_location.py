"""REDIS_URL names one server or, with `sentinel://`, a master Sentinel watches.

The failover itself (Sentinel promoting a replica while web processes and workers
run) is `tests/cluster/test_broker_failover.py`; these read the URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from chorus.redis_location import parse_redis_url


def test_a_plain_url_names_the_server_itself() -> None:
    location = parse_redis_url("redis://127.0.0.1:6379/3")
    assert not location.uses_sentinel
    assert location.kombu_url() == "redis://127.0.0.1:6379/3"
    assert location.kombu_transport_options() == {}


def test_a_sentinel_url_lists_the_sentinels_the_master_and_the_database() -> None:
    location = parse_redis_url(
        "sentinel://:s3cret@10.0.0.1:26379,10.0.0.2:26380,sentinel-c/2?master=queues"
    )
    assert location.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel-c", 26379))
    assert (location.master, location.db, location.password) == ("queues", 2, "s3cret")
    assert location.kombu_url() == (
        "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2:26380;"
        "sentinel://:s3cret@sentinel-c:26379/2"
    )
    options = location.kombu_transport_options()
    assert options["master_name"] == "queues"
    # A Sentinel that does not answer is passed over in half a second, not retried.
    sentinel_kwargs = options["sentinel_kwargs"]
    assert sentinel_kwargs["socket_connect_timeout"] == 0.5
    assert sentinel_kwargs["retry"].get_retries() == 0


def test_the_master_is_called_chorus_unless_named() -> None:
    location = parse_redis_url("sentinel://a:26379,b:26379")
    assert (location.master, location.db) == ("chorus", 0)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sentinel:///0", "at least one Sentinel"),
        ("sentinel://a:port/0", "port must be a number"),
        ("sentinel://a:26379/zero", "database must be a number"),
        ("sentinel://a:26379/0?mastr=x", "unknown sentinel:// option(s): mastr"),
        ("http://a:6379/0", "scheme must be"),
    ],
)
def test_a_wrong_url_is_refused_with_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_redis_url(url)


def _settings_process(redis_url: str, code: str) -> subprocess.CompletedProcess[str]:
    """A fresh process that reads the settings with this REDIS_URL."""
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "chorus.settings"}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + code],
        env=env,
        capture_output=True,
        text=True,
    )


def test_settings_send_celery_through_chorus_sentinel_transport() -> None:
    """The broker goes through Sentinel with Chorus's transport (one client per
    channel, the lanes' short BRPOP), not kombu's plain one."""
    done = _settings_process(
        "sentinel://h1:26379,h2:26379/1?master=m",
        "from django.conf import settings as s\n"
        "print(s.CELERY_BROKER_URL, s.CELERY_BROKER_TRANSPORT)\n"
        "print(s.CELERY_BROKER_TRANSPORT_OPTIONS['master_name'])",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "sentinel://h1:26379;sentinel://h2:26379/1",
        "chorus.kombu_overrides:SentinelTransport",
        "m",
    ]


def test_a_bad_redis_url_stops_the_process_with_its_fault() -> None:
    done = _settings_process("sentinel://a:x/0", "")
    assert done.returncode != 0
    assert "REDIS_URL: a Sentinel's port must be a number" in done.stderr


def test_every_client_parses_replies_in_c() -> None:
    """The web's and the workers' clients, a stream relay's and the broker's all
    read Redis's replies with hiredis: a stream's chunks are 12 KB bulk strings,
    which redis-py's Python parser reads at about twice the CPU."""
    import asyncio

    from chorus.celery import app
    from chorus.redis_client import get_redis
    from synthesis.streaming import stream_client

    def parser_of(pool: Any) -> str:
        connection = pool.make_connection()
        return type(connection._parser).__name__

    client = get_redis()
    assert client is not None
    assert parser_of(client.connection_pool) == "_HiredisParser"

    async def relays_parser() -> str:
        relay = await stream_client()
        try:
            return parser_of(relay.connection_pool)
        finally:
            await relay.aclose()

    assert asyncio.run(relays_parser()) == "_AsyncHiredisParser"
    with app.connection_for_write() as broker:
        assert parser_of(broker.default_channel.client.connection_pool) == "_HiredisParser"
