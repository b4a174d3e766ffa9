"""Chorus's overrides of kombu internals (`chorus.kombu_overrides`) hold only for
the pinned versions: these fail when an upgrade moves what they rely on, and
check on a real channel to Redis that kombu still drives them as assumed."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from kombu import Connection, Consumer, Queue
from kombu.transport import redis as kombu_redis
from kombu.utils.scheduling import cycle_by_name

from chorus import kombu_overrides
from synthesis import lanes
from synthesis.lanes import NARROW_BRPOP_TIMEOUT_S, QUEUE_ORDER_STRATEGY, AdmittedQueues
from synthesis.stream_limits import StreamLimits

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@pytest.mark.parametrize("package", ["kombu", "celery", "redis"])
def test_the_pinned_broker_libraries_are_the_installed_ones(package: str) -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [d for d in dependencies if re.fullmatch(rf"{package}==[\w.]+", d)]
    assert importlib.metadata.version(package) == pin.split("==")[1]


@pytest.mark.parametrize(("name", "parameters"), kombu_overrides.RELIED_ON["methods"].items())
def test_kombus_channel_still_has_the_methods_the_overrides_replace(
    name: str, parameters: tuple[str, ...]
) -> None:
    replaced = getattr(kombu_redis.Channel, name)
    assert tuple(inspect.signature(replaced).parameters) == parameters


def test_the_queue_order_names_the_lanes_cycle() -> None:
    strategy = settings.CELERY_BROKER_TRANSPORT_OPTIONS["queue_order_strategy"]
    assert strategy == QUEUE_ORDER_STRATEGY
    assert cycle_by_name(strategy) is AdmittedQueues


@pytest.fixture
def channel() -> Iterator[Any]:
    """A channel of Chorus's transport to the test Redis, with the settings' options,
    consuming the three priority queues."""
    connection = Connection(
        settings.CELERY_BROKER_URL,
        transport=kombu_overrides.Transport,
        transport_options=settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    )
    channel = connection.channel()
    queues = [Queue(name, channel=channel) for name in settings.SYNTH_QUEUES]
    Consumer(channel, queues=queues, callbacks=[lambda body, message: None]).consume()
    try:
        yield channel
    finally:
        connection.release()


def test_a_channel_kombu_builds_has_what_the_overrides_read(channel: Any) -> None:
    for attribute in kombu_overrides.RELIED_ON["attributes"]:
        assert hasattr(channel, attribute), attribute
    assert isinstance(channel._queue_cycle, AdmittedQueues)
    assert channel.active_queues == list(settings.SYNTH_QUEUES)
    # One client for the channel's synchronous operations; the BRPOP's apart.
    assert channel._create_client() is channel._create_client()
    assert channel._create_client(asynchronous=True) is not channel._create_client()


@pytest.mark.parametrize("kept_a_client", [False, True])
def test_a_closed_channel_asked_for_a_client_raises_a_connection_error(
    channel: Any, kept_a_client: bool
) -> None:
    """After a failover closes the connection, restoring unacked messages asks for
    a client: Celery's reconnect ignores a connection error, not an AttributeError.
    Whether or not the channel kept a client from before: checking that client's
    pool against the channel's builds a new pool, from the missing URL."""
    if kept_a_client:
        channel._create_client()
    else:
        channel._shared_client = None
    channel._pool = None
    channel.connection.client = None
    with pytest.raises(tuple(channel.connection.connection_errors)):
        channel._create_client()


def _brpop_sent(channel: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sent: list[Any] = []
    # As kombu's poller does before its first BRPOP: the BRPOP client's own connection.
    channel.client.connection = channel.client.connection_pool.get_connection()
    monkeypatch.setattr(channel.client.connection, "send_command", lambda *a, **k: sent.extend(a))
    channel._brpop_start()
    return sent


@pytest.mark.parametrize(
    ("taken", "asked", "timeout"),
    [
        (0, ("synth.high", "synth.normal", "synth.low"), 1),  # the channel's usual second
        (3, ("synth.high", "synth.normal"), NARROW_BRPOP_TIMEOUT_S),
        (6, ("synth.high",), NARROW_BRPOP_TIMEOUT_S),
        (7, (), None),  # nothing admitted: no BRPOP at all
    ],
)
def test_kombus_brpop_asks_only_for_the_queues_the_lanes_admit(
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
    taken: int,
    asked: tuple[str, ...],
    timeout: float | None,
) -> None:
    """A worker with 2 low, 5 normal and 7 high streams and `taken` jobs in hand."""
    monkeypatch.setattr(lanes, "_limits", lambda: StreamLimits(2, 5, 7))
    holding = [type("Request", (), {})() for _ in range(taken)]
    monkeypatch.setattr(lanes.worker_state, "reserved_requests", set(holding))

    sent = _brpop_sent(channel, monkeypatch)

    if not asked:
        assert sent == []
        return
    command, *keys, sent_timeout = sent
    assert command == "BRPOP"
    assert {key.split("\x06")[0] for key in keys} == set(asked)
    assert sent_timeout == timeout
