"""Deliveries: signed the Standard Webhooks way, retried on the schedule, logged,
deduplicable, never sent to a disabled endpoint, and sent only once an ending commits."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from synthesis.engines.base import Engine
from synthesis.longform.join import longform_join
from synthesis.longform.submit import longform_split_rest, segment_chars
from synthesis.models import Job
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.services.sweeper import sweep
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import Persona
from tests.fake_engines import FailingEngine
from tests.webhooks.conftest import Published, endpoint_for
from tests.webhooks.receiver import Receiver
from webhooks.events import event_publish
from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEvent
from webhooks.schedule import retry_delay_s

pytestmark = pytest.mark.django_db(transaction=True)


def verified(receiver_request: Any, secret: str) -> dict[str, Any]:
    return Webhook(secret).verify(receiver_request.body, receiver_request.headers)  # type: ignore[no-any-return]


def batch_event(persona: Persona, **data: Any) -> Any:
    return event_publish(
        tenant_id=persona.tenant.pk,
        event_type="batch.completed",
        data={"id": "batch_1", "jobs": 3, **data},
    )


def test_a_delivery_verifies_with_the_standard_webhooks_library(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint = endpoint_for(alice, receiver)
    event = batch_event(alice)
    [result] = published.run_all()

    assert result["status"] == "succeeded"
    [request] = receiver.received
    payload = verified(request, endpoint.secret)
    assert payload == {
        "type": "batch.completed",
        "timestamp": event.created_at.isoformat().replace("+00:00", "Z"),
        "data": {"id": "batch_1", "jobs": 3},
    }
    assert request.headers["webhook-id"] == event.webhook_id
    assert request.headers["Content-Type"] == "application/json"
    with pytest.raises(WebhookVerificationError):  # another secret does not verify it
        Webhook("whsec_" + "A" * 43 + "=").verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):  # nor a changed body
        Webhook(endpoint.secret).verify(request.body.replace(b"3", b"4"), request.headers)


def test_a_500_is_retried_with_the_same_webhook_id_until_it_succeeds(
    alice: Persona, receiver: Receiver, published: Published, short_schedule: list[float]
) -> None:
    endpoint = endpoint_for(alice, receiver)
    receiver.statuses = [500, 503]
    batch_event(alice)
    results = published.run_all()

    assert [r["status"] for r in results] == ["retrying", "retrying", "succeeded"]
    ids = {request.headers["webhook-id"] for request in receiver.received}
    assert len(receiver.received) == 3
    assert len(ids) == 1  # a receiver dedupes on it
    for request in receiver.received:
        verified(request, endpoint.secret)
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("succeeded", 3)
    log = list(delivery.log.values_list("number", "response_status", "error", "succeeded"))
    assert log == [(1, 500, "HTTP 500", False), (2, 503, "HTTP 503", False), (3, 204, "", True)]
    assert all(attempt.latency_ms > 0 for attempt in delivery.log.all())
    assert delivery.log.first().response_body == "answer 500"  # type: ignore[union-attr]


def test_a_timeout_is_retried(
    alice: Persona, receiver: Receiver, published: Published, short_schedule: list[float]
) -> None:
    endpoint_for(alice, receiver)
    receiver.stalls = [1.5]  # past the timeout of 0.5 s
    batch_event(alice)
    results = published.run_all()

    assert [r["status"] for r in results] == ["retrying", "succeeded"]
    first = WebhookAttempt.objects.get(number=1)
    assert first.error == "timeout: ReadTimeout"
    assert first.response_status is None
    assert 400 < first.latency_ms < 1400


def test_it_gives_up_after_the_last_retry_of_the_schedule(
    alice: Persona, receiver: Receiver, published: Published, short_schedule: list[float]
) -> None:
    endpoint_for(alice, receiver)
    receiver.statuses = [500] * 10
    batch_event(alice)
    results = published.run_all()

    assert [r["status"] for r in results] == ["retrying"] * 3 + ["failed"]
    assert len(receiver.received) == len(short_schedule) + 1
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.next_attempt_at) == ("failed", None)
    assert delivery.finished_at is not None


def test_each_retry_waits_per_the_schedule_with_jitter(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_RETRY_SCHEDULE_S = [5, 300, 1800]
    endpoint_for(alice, receiver)
    receiver.statuses = [500]
    batch_event(alice)
    published.run_next()  # the first attempt fails

    delivery = WebhookDelivery.objects.get()
    waited = (delivery.next_attempt_at - timezone.now()).total_seconds()  # type: ignore[operator]
    assert 3.9 < waited <= 6.0  # 5 s +/- 20 %
    # Five seconds ride on the message as a countdown...
    assert len(published.calls) == 1
    assert 4.0 <= published.calls[0][1] <= 6.0
    # ... and what the schedule says afterwards.
    for attempts_made, nominal in [(1, 5), (2, 300), (3, 1800)]:
        delay = retry_delay_s(attempts_made=attempts_made)
        assert delay is not None
        assert nominal * 0.8 <= delay <= nominal * 1.2
    assert retry_delay_s(attempts_made=4) is None


def test_a_long_wait_is_published_by_the_sweeper_when_due_and_only_once(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_RETRY_SCHEDULE_S = [300]
    endpoint_for(alice, receiver)
    receiver.statuses = [500]
    batch_event(alice)
    published.run_all()
    assert published.calls == []  # five minutes: not a countdown on the message
    assert sweep().webhooks_published == 0  # not due yet

    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        next_attempt_at=timezone.now() - timedelta(seconds=30)
    )
    assert sweep().webhooks_published == 1
    assert sweep().webhooks_published == 0  # not again while its message waits for a worker
    assert published.ids() == [str(delivery.pk)]
    assert [r["status"] for r in published.run_all()] == ["succeeded"]


def test_a_duplicated_message_does_not_send_an_attempt_twice(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint_for(alice, receiver)
    batch_event(alice)
    [delivery_id] = published.ids()
    published.calls.append((delivery_id, 0))  # the broker delivered it twice

    results = published.run_all()
    assert [r["status"] for r in results] == ["succeeded", "skipped"]
    assert len(receiver.received) == 1


def test_a_disabled_endpoint_receives_nothing(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint_for(alice, receiver, enabled=False)
    assert batch_event(alice) is None
    assert published.calls == []
    assert WebhookDelivery.objects.count() == 0


def test_disabling_an_endpoint_drops_its_pending_retries(
    alice: Persona, receiver: Receiver, published: Published, short_schedule: list[float]
) -> None:
    endpoint = endpoint_for(alice, receiver)
    receiver.statuses = [500]
    batch_event(alice)
    assert published.run_next()["status"] == "retrying"
    endpoint.enabled = False
    endpoint.save()
    results = published.run_all()

    assert [r["status"] for r in results] == ["cancelled"]
    assert len(receiver.received) == 1
    assert WebhookDelivery.objects.get().status == "cancelled"


def test_an_endpoint_subscribed_to_other_events_gets_none_of_these(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint_for(alice, receiver, event_types=["speech.failed"])
    assert batch_event(alice) is None
    assert published.calls == []


def test_a_redirect_is_not_followed(
    alice: Persona, receiver: Receiver, published: Published, short_schedule: list[float]
) -> None:
    endpoint_for(alice, receiver)
    receiver.statuses = [307]
    receiver.location = "http://169.254.169.254/latest/meta-data/"
    batch_event(alice)
    results = published.run_all()

    assert [r["status"] for r in results] == ["retrying", "succeeded"]
    first = WebhookAttempt.objects.get(number=1)
    assert first.response_status == 307
    assert (
        first.error == "redirect not followed (Location: http://169.254.169.254/latest/meta-data/)"
    )
    assert len(receiver.received) == 2  # both to the endpoint; nothing to the Location


def test_the_ssrf_guard_runs_again_at_delivery(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    endpoint_for(alice, receiver)
    settings.WEBHOOK_ALLOWED_NETWORKS = []  # the operator withdrew the permission
    batch_event(alice)
    result = published.run_next()

    assert result["status"] == "retrying"
    assert receiver.received == []
    assert WebhookAttempt.objects.get().error.startswith("webhook_address_not_allowed")


# --- events from jobs ------------------------------------------------------------------


def test_a_succeeded_job_sends_speech_succeeded_with_a_working_link(
    alice: Persona, receiver: Receiver, published: Published, engine: Engine, broker: Any
) -> None:
    endpoint = endpoint_for(alice, receiver)
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello there.")
    )
    job_execute(job_id=job.id, engine=engine, worker="test:1")
    [result] = published.run_all()

    assert result["status"] == "succeeded"
    [request] = receiver.received
    payload = verified(request, endpoint.secret)
    data = payload["data"]
    job.refresh_from_db()
    assert payload["type"] == "speech.succeeded"
    assert data["id"] == str(job.id)
    assert data["status"] == "succeeded"
    assert data["error"] is None
    assert data["characters"] == len("Hello there.")
    assert data["audio_seconds"] == job.duration_s > 0
    assert data["format"] == "wav"
    assert data["finished_at"] == job.finished_at.isoformat().replace("+00:00", "Z")  # type: ignore[union-attr]
    # The link is signed by the local storage backend for the test server.
    link = httpx.URL(data["audio_url"])
    response = alice.client.get(link.path, dict(link.params))
    assert response.status_code == 200
    audio = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    assert audio[:4] == b"RIFF"
    assert len(audio) == job.output_bytes


def test_a_failed_job_sends_speech_failed_with_its_error(
    alice: Persona, receiver: Receiver, published: Published, engine: Engine, broker: Any
) -> None:
    endpoint = endpoint_for(alice, receiver)
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello there.")
    )
    job_execute(job_id=job.id, engine=FailingEngine(engine), worker="test:1")  # type: ignore[arg-type]
    published.run_all()

    data = verified(receiver.received[0], endpoint.secret)["data"]
    assert data["status"] == "failed"
    assert data["error"]["code"] == "engine_error"
    assert data["error"]["message"]
    assert "audio_url" not in data


def test_a_batch_that_ends_sends_batch_completed_with_its_counts(
    alice: Persona, receiver: Receiver, published: Published, engine: Engine, broker: Any
) -> None:
    endpoint = endpoint_for(alice, receiver, event_types=["batch.completed"])
    created = alice.client.post(
        "/v1/batches", {"items": [{"text": "One."}, {"text": "Two."}]}, format="json"
    )
    assert created.status_code == 202, created.json()
    batch_id = created.json()["id"]
    jobs = Job.objects.filter(batch_item__batch_id=batch_id).order_by("batch_item__index")
    job_execute(job_id=jobs[0].id, engine=engine, worker="test:1")
    assert published.calls == []  # one item still runs: no event yet
    job_execute(job_id=jobs[1].id, engine=FailingEngine(engine), worker="test:1")  # type: ignore[arg-type]
    published.run_all()

    [request] = receiver.received  # no speech.* events: the endpoint takes only this type
    payload = verified(request, endpoint.secret)
    assert payload["type"] == "batch.completed"
    data = payload["data"]
    assert (data["id"], data["status"]) == (batch_id, "completed_with_failures")
    assert (data["item_count"], data["characters"]) == (2, len("One.") + len("Two."))
    assert (data["counts"]["succeeded"], data["counts"]["failed"]) == (1, 1)
    assert data["finished_at"]


def test_a_long_text_sends_one_event_for_its_job_and_none_for_its_segments(
    alice: Persona,
    receiver: Receiver,
    published: Published,
    engine: Engine,
    broker: Any,
    plan: Plan,
    settings: Any,
) -> None:
    settings.TENANT_BROKER_SLOTS = 1_000  # every segment queued: this test runs them itself
    plan.max_text_chars, plan.max_longform_chars = 300, 10_000
    plan.save()
    endpoint = endpoint_for(alice, receiver)
    text = " ".join(["Boats moved slowly under the grey sky."] * 40)
    job = job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=text))
    first = Job.objects.get(parent=job, segment_index=0)
    longform_split_rest(
        parent_id=job.pk, after=first.characters, max_chars=segment_chars(settings.ENGINE)
    )
    segments = list(Job.objects.filter(parent=job).order_by("segment_index"))
    assert len(segments) > 2
    for segment in segments:
        assert job_execute(job_id=segment.pk, engine=engine, worker="test:1")["status"] == (
            "succeeded"
        )
    assert published.calls == []  # segments send nothing
    assert longform_join(parent_id=job.pk)["status"] == "succeeded"
    published.run_all()

    [request] = receiver.received
    payload = verified(request, endpoint.secret)
    assert (payload["type"], payload["data"]["id"]) == ("speech.succeeded", str(job.id))
    assert payload["data"]["characters"] == len(text)


def test_an_ending_rolled_back_sends_nothing(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint_for(alice, receiver)

    def ending_that_fails() -> None:
        with transaction.atomic():
            batch_event(alice)
            raise RuntimeError("the ending's transaction fails")

    with pytest.raises(RuntimeError):
        ending_that_fails()
    assert published.calls == []
    assert WebhookDelivery.objects.count() == 0


def test_a_cancelled_job_sends_nothing(
    alice: Persona, receiver: Receiver, published: Published, broker: Any
) -> None:
    endpoint_for(alice, receiver)
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello there.")
    )
    response = alice.client.post(f"/v1/speech/{job.id}/cancel")
    assert response.status_code == 200
    assert published.calls == []


def test_the_body_is_compact_json_of_type_timestamp_and_data(
    alice: Persona, receiver: Receiver, published: Published
) -> None:
    endpoint_for(alice, receiver)
    batch_event(alice, note="é")
    published.run_all()
    body = receiver.received[0].body
    assert list(json.loads(body)) == ["type", "timestamp", "data"]
    assert b": " not in body


def test_a_webhook_that_cannot_be_recorded_does_not_fail_the_job(
    alice: Persona,
    receiver: Receiver,
    published: Published,
    engine: Engine,
    broker: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint_for(alice, receiver)

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("the webhooks tables are unreachable")

    monkeypatch.setattr("webhooks.events.event_publish", broken)
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello there.")
    )
    result = job_execute(job_id=job.id, engine=engine, worker="test:1")

    assert result["status"] == "succeeded"
    job.refresh_from_db()
    assert job.status == "succeeded"
    assert published.calls == []


def test_the_sweeper_forgets_events_past_retention_once_their_deliveries_ended(
    alice: Persona, receiver: Receiver, published: Published, settings: Any
) -> None:
    settings.WEBHOOK_RETENTION_DAYS = 30
    endpoint_for(alice, receiver)
    receiver.statuses = [500]
    old_done = batch_event(alice, n=1)
    published.run_next()  # fails, retries...
    published.run_all()  # ... and succeeds
    old_pending = batch_event(alice, n=2)
    published.calls.clear()  # still pending
    recent = batch_event(alice, n=3)
    long_ago = timezone.now() - timedelta(days=31)
    WebhookEvent.objects.filter(pk__in=[old_done.pk, old_pending.pk]).update(created_at=long_ago)

    report = sweep()
    assert report.webhooks_forgotten == 1
    assert set(WebhookEvent.objects.values_list("pk", flat=True)) == {old_pending.pk, recent.pk}
    assert not WebhookAttempt.objects.filter(delivery__event_id=old_done.pk).exists()
    assert sweep().webhooks_forgotten == 0


def test_the_sweeper_puts_a_due_delivery_on_the_webhooks_queue_in_redis(
    alice: Persona, receiver: Receiver, settings: Any
) -> None:
    """The real publisher this time: the message a webhook worker would take, on
    a queue of its own (not `light`, whose threads split and join long texts)."""
    import base64

    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(settings.WEBHOOK_QUEUE)
    endpoint_for(alice, receiver)
    event = batch_event(alice)
    assert event is not None
    client.delete(settings.WEBHOOK_QUEUE)  # as if the first message were lost
    delivery = WebhookDelivery.objects.get()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        next_attempt_at=timezone.now() - timedelta(seconds=30)
    )

    assert sweep().webhooks_published == 1
    [raw] = client.lrange(settings.WEBHOOK_QUEUE, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["task"] == "webhooks.deliver"
    assert json.loads(base64.b64decode(message["body"]))[0] == [str(delivery.pk)]
    client.delete(settings.WEBHOOK_QUEUE)
