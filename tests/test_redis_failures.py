"""A broker that stops answering costs a request its timeouts once, not every
request: for a few seconds after a failure, what can do without Redis (the
rate limiter, the check before a stream, /readyz) does not wait on it again."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chorus import redis_client
from chorus.health import check_broker
from chorus.redis_client import get_redis
from quotas.ratelimit import rate_limit_hit
from synthesis.services.jobs import _streams_reachable


@pytest.fixture
def silent_broker(settings: Any) -> Iterator[None]:
    """A Redis address that accepts connections and never answers (a host cut
    off behind a proxy, a hung server): each call waits out its socket timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        settings.REDIS_URL = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        get_redis.cache_clear()
        yield
    get_redis.cache_clear()


def _timed(call: Any) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        call()
    except Exception as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_after_one_broker_failure_the_next_checks_fail_at_once(silent_broker: None) -> None:
    first, error = _timed(check_broker)
    assert error is not None
    assert first >= 1.5
    again, error = _timed(check_broker)
    assert isinstance(error, ConnectionError)
    assert again < 0.1


def test_the_rate_limiter_admits_without_waiting_after_a_failure(silent_broker: None) -> None:
    # The script registered on an earlier test's client is registered again on
    # this one: the first call waits on the silent broker.
    first, _ = _timed(lambda: rate_limit_hit(tenant_id=1, key_id=1, tenant_limit=5, key_limit=5))
    assert first >= 1.5
    started = time.monotonic()
    assert rate_limit_hit(tenant_id=1, key_id=1, tenant_limit=5, key_limit=5) is None  # fails open
    assert time.monotonic() - started < 0.1


def test_the_broker_is_tried_again_once_the_pause_is_over(
    silent_broker: None, monkeypatch: Any
) -> None:
    _timed(check_broker)
    monkeypatch.setattr(redis_client, "SKIP_AFTER_FAILURE_S", 0.0)
    again, error = _timed(check_broker)
    assert error is not None
    assert again >= 1.5


def test_a_stream_takes_the_rate_limiters_answer_of_a_moment_ago_for_a_working_broker(
    monkeypatch: Any,
) -> None:
    """No PING of its own on the way to first audio (the rate limiter's call in
    the same request answered), but one when no answer is that recent."""
    get_redis.cache_clear()
    redis_client.redis_failures_forget()
    assert rate_limit_hit(tenant_id=1, key_id=1, tenant_limit=100, key_limit=100) is not None
    pings: list[int] = []
    client = get_redis()
    assert client is not None
    real_ping = client.ping
    monkeypatch.setattr(client, "ping", lambda: pings.append(1) or real_ping())

    assert _streams_reachable()
    assert pings == []

    monkeypatch.setattr(redis_client, "ANSWERED_WITHIN_S", 0.0)
    assert _streams_reachable()
    assert pings == [1]
