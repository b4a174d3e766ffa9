"""`chorus.task_publish` puts on the broker the message Celery's own
`apply_async` would (real Redis, the app's own broker connection)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from django.conf import settings

from chorus.task_publish import publish_task
from synthesis.tasks import _PUBLISH_RETRY, synthesize_job_task

# What differs between any two messages: their ids.
OWN_HEADERS = ("id", "root_id")
OWN_PROPERTIES = ("correlation_id", "delivery_tag")


@pytest.fixture
def queue() -> Iterator[tuple[redis.Redis, str]]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    name = f"test.publish.{uuid.uuid4().hex}"
    yield client, name
    client.delete(name, *client.keys(f"_kombu.binding*.{name}"))
    client.close()


def both_ways(name: str, *, countdown: float, headers: dict[str, Any] | None = None) -> None:
    """The same publish, through Celery's `apply_async` and `publish_task`."""
    arguments: dict[str, Any] = {
        "args": ("a-job", 3),
        "kwargs": {"request_id": "req-1"},
        "queue": name,
        "countdown": countdown,
        **({"headers": headers} if headers else {}),
    }
    synthesize_job_task.apply_async(**arguments, retry=True, retry_policy=_PUBLISH_RETRY)
    publish_task(synthesize_job_task, **arguments, retry_policy=_PUBLISH_RETRY)


def as_sent(client: redis.Redis, name: str) -> list[dict[str, Any]]:
    """The queue's messages, oldest first, with their ids checked and set aside
    and their bodies decoded."""
    messages = [json.loads(raw) for raw in reversed(client.lrange(name, 0, -1))]
    for message in messages:
        headers, properties = message["headers"], message["properties"]
        assert headers["root_id"] == headers["id"] == properties["correlation_id"]
        for key in OWN_HEADERS:
            headers.pop(key)
        for key in OWN_PROPERTIES:
            properties.pop(key)
        assert properties.pop("body_encoding") == "base64"
        message["body"] = json.loads(base64.b64decode(message["body"]))
    return messages


def test_the_message_is_the_one_apply_async_sends(queue: tuple[redis.Redis, str]) -> None:
    client, name = queue
    both_ways(name, countdown=0)

    by_celery, by_chorus = as_sent(client, name)

    assert by_chorus == by_celery
    assert by_chorus["body"][:2] == [["a-job", 3], {"request_id": "req-1"}]
    assert by_chorus["headers"]["task"] == "synthesis.synthesize_job"
    assert by_chorus["headers"]["eta"] is None
    assert by_chorus["properties"]["delivery_info"]["routing_key"] == name


def test_a_delayed_message_carries_the_same_start(queue: tuple[redis.Redis, str]) -> None:
    client, name = queue
    before = datetime.now().astimezone()
    both_ways(name, countdown=30)

    by_celery, by_chorus = as_sent(client, name)

    etas = [datetime.fromisoformat(m["headers"].pop("eta")) for m in (by_celery, by_chorus)]
    for eta in etas:
        assert before + timedelta(seconds=29) < eta < before + timedelta(seconds=32)
    assert abs(etas[1] - etas[0]) < timedelta(seconds=1)
    assert by_chorus == by_celery


def test_further_headers_travel_as_apply_async_sends_them(queue: tuple[redis.Redis, str]) -> None:
    client, name = queue
    extra = {"chorus_prestart": ["tenant", "Hello there.", None, 1.0, ""]}
    both_ways(name, countdown=0, headers=extra)

    by_celery, by_chorus = as_sent(client, name)

    assert by_chorus == by_celery
    assert by_chorus["headers"]["chorus_prestart"] == extra["chorus_prestart"]
    # Not in what the logs show of a task.
    assert "Hello there." not in by_chorus["headers"]["kwargsrepr"]
