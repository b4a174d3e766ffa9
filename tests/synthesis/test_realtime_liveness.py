"""A session's liveness key (real Redis): held from the claim until the
session's end is published, settling included, and gone after it."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from synthesis.realtime import runner
from synthesis.realtime.channel import alive_key
from synthesis.realtime.runner import Liveness


def test_the_key_outlives_its_own_life_while_held_and_goes_with_the_holder(
    broker: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "ALIVE_TTL_MS", 1000)
    monkeypatch.setattr(runner, "ALIVE_EVERY_S", 0.05)
    job_id = uuid.uuid4()
    with Liveness(client=broker, job_id=job_id):
        assert broker.exists(alive_key(job_id))  # from the start, not the first renewal
        time.sleep(2.0)  # twice the key's life: renewed meanwhile
        assert broker.exists(alive_key(job_id))
    assert not broker.exists(alive_key(job_id))
