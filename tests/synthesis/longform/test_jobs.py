# ruff: noqa: RUF001 (full-width sentence marks are what these tests split at)
"""Long-form jobs through the services: submit, segments run (in-process here,
with the synthetic engine), join, cancel, failure, and what is charged.

The end-to-end tests (`tests/e2e/test_longform.py`) run the same with real
worker processes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import soundfile as sf
from django.conf import settings

from quotas.counters import counters_reconcile, period_recount
from quotas.errors import TooManyConcurrentJobs
from quotas.models import LedgerEntry, UsagePeriod
from synthesis.engines.base import Engine
from synthesis.longform.join import longform_join
from synthesis.longform.split import PAUSE_S
from synthesis.longform.submit import longform_split_rest, segment_chars
from synthesis.models import Job, JobStatus
from synthesis.selectors import job_list, jobs_in_flight
from synthesis.services.execution import job_claim, job_execute, job_fail
from synthesis.services.jobs import job_cancel, job_create
from synthesis.speech_request import SpeechRequest
from synthesis.streaming import STREAM_TTL_AFTER_END_S, stream_key
from tenants.models import Plan
from tests.assertions import assert_error
from tests.conftest import Persona

SENTENCES = [
    "Dr. Smith opened the door at 9.30 in the morning.",
    "The hallway was quiet, e.g. no footsteps, no voices.",
    "He walked to the window and looked out over the river.",
    "Boats moved slowly under the grey sky.",
    "Somewhere a bell rang twice, then stopped.",
]
LONG_TEXT = " ".join(SENTENCES * 12)  # ~2,800 characters: several segments


# Long texts run on the embedded default too (`make run`'s pro demo tenant has them).
pytestmark = pytest.mark.embedded


@pytest.fixture(autouse=True)
def _segments_reach_the_broker(settings: Any) -> None:
    """These tests run a job's segments themselves, in the order they choose, so
    every segment must be queued rather than held back by fair admission (two per
    tenant in production); the test of held-back segments sets the default again."""
    settings.TENANT_BROKER_SLOTS = 1_000


@pytest.fixture(autouse=True)
def _longform_plan(plan: Plan) -> None:
    plan.max_longform_chars = 10_000
    plan.save()


def submit(persona: Persona, text: str = LONG_TEXT, **speech: Any) -> Job:
    """Submit, then split the rest as the `light` worker does after commit."""
    job = job_create(
        tenant=persona.tenant,
        api_key=persona.api_key,
        speech=SpeechRequest(text=text, **speech),
    )
    if not job.is_longform:
        return job
    first = Job.objects.get(parent=job, segment_index=0)
    longform_split_rest(
        parent_id=job.pk, after=first.characters, max_chars=segment_chars(settings.ENGINE)
    )
    job.refresh_from_db()
    return job


def segments_of(job: Job) -> list[Job]:
    return list(Job.objects.filter(parent=job).order_by("segment_index"))


def stored(persona: Persona, key: str) -> Path:
    return Path(settings.STORAGE["local_root"]) / persona.tenant.bucket / key


def ledger(job: Job) -> dict[str, int]:
    return {e.kind: e.characters for e in LedgerEntry.objects.filter(job=job)}


def run(segment: Job, engine: Engine) -> None:
    assert job_execute(job_id=segment.pk, engine=engine, worker="w1")["status"] == "succeeded"


def test_a_text_over_the_one_job_limit_becomes_a_parent_and_ordered_segments(
    alice: Persona,
) -> None:
    job = submit(alice)

    segments = segments_of(job)
    assert job.is_longform
    assert job.segments_total == len(segments) > 5
    assert job.status == JobStatus.RUNNING
    assert job.language == "en"
    assert [s.segment_index for s in segments] == list(range(len(segments)))
    assert segments[0].text == SENTENCES[0]  # the first sentence alone: quick first audio
    assert all(len(s.text) <= segment_chars(settings.ENGINE) for s in segments)
    assert sum(s.characters for s in segments) == len(LONG_TEXT)
    assert all(s.status == JobStatus.QUEUED and s.format == "pcm" for s in segments)
    # One reservation, on the parent, for the whole text; segments are not charged.
    assert ledger(job) == {"reserve": len(LONG_TEXT)}
    assert not LedgerEntry.objects.filter(job__parent=job).exists()
    # Segments are internal: the tenant sees one job, in flight once.
    assert list(job_list(tenant=alice.tenant)) == [job]
    assert jobs_in_flight(tenant=alice.tenant) == 1
    jobs = alice.client.get("/v1/usage").json()["jobs"]
    assert (jobs["running"], jobs["queued"], jobs["pending"]) == (1, 0, 0)


def test_a_long_texts_segments_do_not_hold_the_plans_jobs_at_once(
    alice: Persona, plan: Plan
) -> None:
    plan.max_concurrent_jobs = 2
    plan.save()
    job = submit(alice)
    assert Job.objects.filter(parent=job, status=JobStatus.QUEUED).count() > 2

    single = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello.")
    )
    assert single.status == JobStatus.QUEUED
    with pytest.raises(TooManyConcurrentJobs):  # the long job and this one: two
        job_create(
            tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello again.")
        )


def test_a_short_text_stays_one_ordinary_job(alice: Persona) -> None:
    job = submit(alice, text="Hello there.")
    assert not job.is_longform
    assert job.parent_id is None
    assert not Job.objects.filter(parent=job).exists()


def test_segments_beyond_the_tenants_broker_slots_wait_pending_in_order(
    alice: Persona, settings: object
) -> None:
    settings.TENANT_BROKER_SLOTS = 2  # type: ignore[attr-defined]
    job = submit(alice)
    statuses = [s.status for s in segments_of(job)]
    assert statuses[:2] == [JobStatus.QUEUED] * 2
    assert set(statuses[2:]) == {JobStatus.PENDING}


def test_segments_finishing_out_of_order_are_joined_in_text_order(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice, format="wav")
    segments = segments_of(job)
    for segment in reversed(segments):  # the last segment finishes first
        run(segment, engine)
    pieces = []
    for segment in segments_of(job):
        raw = stored(alice, segment.output_key).read_bytes()
        pieces.append(np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767)

    assert longform_join(parent_id=job.pk)["status"] == "succeeded"

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert job.format == "wav"
    joined, rate = sf.read(io.BytesIO(stored(alice, job.output_key).read_bytes()), dtype="float32")
    pause = round(PAUSE_S * rate)
    assert len(joined) == sum(len(p) for p in pieces) + pause * (len(pieces) - 1)
    assert job.duration_s == pytest.approx(len(joined) / rate, abs=1e-3)
    gain = float(np.max(np.abs(joined))) / max(float(np.max(np.abs(p))) for p in pieces)
    at = 0
    for index, piece in enumerate(pieces):
        # Each stretch of the file is that segment's audio, under one gain.
        np.testing.assert_allclose(joined[at : at + len(piece)], piece * gain, atol=2e-3)
        at += len(piece)
        if index < len(pieces) - 1:
            assert np.max(np.abs(joined[at : at + pause])) == 0.0
            at += pause
    # Segment audio is internal and gone once joined.
    assert all(s.output_deleted_at is not None for s in segments_of(job))
    assert not any(stored(alice, s.output_key).exists() for s in segments_of(job))


def test_the_whole_text_is_charged_once_when_the_job_succeeds(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice)
    for segment in segments_of(job):
        run(segment, engine)
    longform_join(parent_id=job.pk)
    longform_join(parent_id=job.pk)  # a redelivered join changes nothing

    assert ledger(job) == {"reserve": len(LONG_TEXT), "commit": len(LONG_TEXT)}
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (len(LONG_TEXT), 0)
    assert (period.jobs_succeeded, period.jobs_failed, period.jobs_cancelled) == (1, 0, 0)
    assert period_recount(period_id=period.pk).jobs_succeeded == 1


def test_the_join_is_sent_to_the_light_queue_when_the_last_segment_succeeds(
    alice: Persona, engine: Engine, broker: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    broker.delete("light")
    job = submit(alice)
    segments = segments_of(job)
    with django_capture_on_commit_callbacks(execute=True):
        for segment in segments[:-1]:
            run(segment, engine)
    assert broker.llen("light") == 0
    with django_capture_on_commit_callbacks(execute=True):
        run(segments[-1], engine)
    assert broker.llen("light") == 1
    message = json.loads(broker.lpop("light"))
    assert message["headers"]["task"] == "synthesis.join_longform"
    assert message["headers"]["argsrepr"] == repr((str(job.pk),))


def test_progress_counts_segments_done_and_audio_so_far(alice: Persona, engine: Engine) -> None:
    job = submit(alice)
    segments = segments_of(job)
    run(segments[0], engine)
    run(segments[1], engine)

    body = alice.client.get(f"/v1/speech/{job.pk}").json()

    done = Job.objects.filter(pk__in=[segments[0].pk, segments[1].pk])
    progress = body["progress"]
    assert progress["segments_done"] == 2
    assert progress["segments_total"] == len(segments)
    assert progress["audio_seconds"] == pytest.approx(sum(s.duration_s for s in done), abs=1e-3)
    assert progress["estimated_finish_at"] is not None
    assert body["status"] == "running"
    assert body["timings"]["first_audio_at"] is not None  # segment 0's first audio


def test_segments_are_not_reachable_through_the_api(alice: Persona) -> None:
    job = submit(alice)
    segment = segments_of(job)[0]
    assert alice.client.get(f"/v1/speech/{segment.pk}").status_code == 404
    assert alice.client.post(f"/v1/speech/{segment.pk}/cancel").status_code == 404
    listed = [j["id"] for j in alice.client.get("/v1/speech").json()["results"]]
    assert listed == [str(job.pk)]


def test_cancel_mid_way_charges_started_segments_and_refunds_the_rest_exactly(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice)
    segments = segments_of(job)
    run(segments[0], engine)
    run(segments[1], engine)
    assert job_claim(job_id=segments[2].pk, worker="w2") is not None  # running now
    started = sum(s.characters for s in segments[:3])

    body = alice.client.post(f"/v1/speech/{job.pk}/cancel").json()

    assert body["status"] == "cancelled"
    assert ledger(job) == {"reserve": len(LONG_TEXT), "commit": started}
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (started, 0)
    assert (period.jobs_succeeded, period.jobs_cancelled) == (0, 1)
    assert counters_reconcile() == 0  # the recount agrees with the partial charge
    assert {s.status for s in segments_of(job)} == {JobStatus.SUCCEEDED, JobStatus.CANCELLED}
    assert [s.status for s in segments_of(job)][2:] == [JobStatus.CANCELLED] * (len(segments) - 2)
    # The running segment stops at its next chunk; nothing joins.
    assert job_execute(job_id=segments[2].pk, engine=engine, worker="w2")["status"] in {
        "skipped",
        "cancelled",
    }
    assert longform_join(parent_id=job.pk)["status"] == "skipped"
    assert not any(stored(alice, s.output_key).exists() for s in segments if s.output_key)
    again = alice.client.post(f"/v1/speech/{job.pk}/cancel")
    assert_error(again, 409, "job_not_cancellable")


def test_a_cancel_after_every_segment_is_made_lets_the_join_deliver_the_file(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice)
    for segment in segments_of(job):
        run(segment, engine)

    response = alice.client.post(f"/v1/speech/{job.pk}/cancel")

    # Too late to cancel: the whole text is made. Cancelling it charged all of it
    # and delivered nothing; the join goes on instead.
    error = assert_error(response, 409, "job_not_cancellable")
    assert error["details"] == {"status": "running", "joining": True}
    assert ledger(job) == {"reserve": len(LONG_TEXT)}
    assert {s.status for s in segments_of(job)} == {JobStatus.SUCCEEDED}
    assert longform_join(parent_id=job.pk)["status"] == "succeeded"
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert stored(alice, job.output_key).exists()
    assert ledger(job) == {"reserve": len(LONG_TEXT), "commit": len(LONG_TEXT)}
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (len(LONG_TEXT), 0)
    assert (period.jobs_succeeded, period.jobs_cancelled) == (1, 0)
    assert counters_reconcile() == 0


def test_cancel_before_any_segment_started_refunds_everything(alice: Persona) -> None:
    job = submit(alice)
    job_cancel(tenant=alice.tenant, job=job)
    assert ledger(job) == {"reserve": len(LONG_TEXT), "refund": len(LONG_TEXT)}
    assert set(Job.objects.filter(parent=job).values_list("status", flat=True)) == {"cancelled"}


def test_a_segment_that_fails_for_good_fails_the_job_and_refunds_it(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice)
    segments = segments_of(job)
    run(segments[0], engine)
    claim = job_claim(job_id=segments[1].pk, worker="w1")
    assert claim is not None

    job_fail(claim=claim, code="engine_error", message="The engine failed.")

    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "engine_error"
    assert ledger(job) == {"reserve": len(LONG_TEXT), "refund": len(LONG_TEXT)}
    others = [s.status for s in segments_of(job)[2:]]
    assert set(others) == {JobStatus.CANCELLED}
    assert job_execute(job_id=segments[2].pk, engine=engine, worker="w1")["status"] == "skipped"


def test_a_text_over_the_long_form_limit_is_refused_with_nothing_created(
    alice: Persona,
) -> None:
    text = "A sentence that repeats. " * 500  # 12,500 > 10,000

    response = alice.client.post("/v1/speech", {"text": text}, format="json")

    error = assert_error(response, 413, "longform_text_too_long")
    assert error["details"] == {"limit": 10_000, "value": len(text.strip())}
    assert not Job.objects.exists()
    assert not LedgerEntry.objects.exists()


def test_a_plan_without_long_form_keeps_the_one_job_limit(alice: Persona, plan: Plan) -> None:
    plan.max_longform_chars = 0
    plan.save()

    response = alice.client.post("/v1/speech", {"text": "x. " * 200}, format="json")

    assert_error(response, 422, "text_too_long")
    assert not Job.objects.exists()


def test_the_api_takes_a_language_and_submits_a_chinese_text(alice: Persona) -> None:
    text = "我今天很高兴。你呢？我们去公园吧！" * 30

    response = alice.client.post("/v1/speech", {"text": text, "language": "zh"}, format="json")

    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.language == "zh"
    assert next(s.text for s in segments_of(job)) == "我今天很高兴。"
    assert response.json()["progress"]["segments_done"] == 0


def test_segment_0_is_admitted_at_submit_and_the_rest_once_split(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=LONG_TEXT)
    )

    # Before the split: the parent, the reservation and segment 0 only.
    assert job.segments_total == 0
    assert [(s.segment_index, s.text) for s in segments_of(job)] == [(0, SENTENCES[0])]
    assert ledger(job) == {"reserve": len(LONG_TEXT)}
    first = segments_of(job)[0]

    made = longform_split_rest(parent_id=job.pk, after=first.characters, max_chars=250)

    job.refresh_from_db()
    assert job.segments_total == made + 1 == len(segments_of(job))
    again = longform_split_rest(parent_id=job.pk, after=first.characters, max_chars=250)
    assert again == 0  # a redelivered split changes nothing
    assert len(segments_of(job)) == job.segments_total


def test_segment_0_done_before_the_split_waits_for_the_rest(alice: Persona, engine: Engine) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=LONG_TEXT)
    )
    run(segments_of(job)[0], engine)
    assert longform_join(parent_id=job.pk)["status"] == "skipped"  # not split yet

    first = segments_of(job)[0]
    longform_split_rest(parent_id=job.pk, after=first.characters, max_chars=250)
    for segment in segments_of(job)[1:]:
        run(segment, engine)

    assert longform_join(parent_id=job.pk)["status"] == "succeeded"


def test_a_job_cancelled_before_its_split_is_not_split(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=LONG_TEXT)
    )
    job_cancel(tenant=alice.tenant, job=job)

    first = Job.objects.get(parent=job, segment_index=0)
    assert longform_split_rest(parent_id=job.pk, after=first.characters, max_chars=250) == 0
    assert len(segments_of(job)) == 1
    assert ledger(job) == {"reserve": len(LONG_TEXT), "refund": len(LONG_TEXT)}


def test_a_segments_stream_outlives_its_end_until_the_client_reaches_it(
    alice: Persona, engine: Engine, broker: redis.Redis
) -> None:
    job = submit(alice, stream=True)
    segment = segments_of(job)[3]
    broker.delete(stream_key(segment.pk))

    run(segment, engine)  # made long before a client playing from the start needs it

    assert broker.ttl(stream_key(segment.pk)) > STREAM_TTL_AFTER_END_S
    ordinary = submit(alice, text="Hello there.", stream=True)
    job_execute(job_id=ordinary.pk, engine=engine, worker="w1")
    assert 0 < broker.ttl(stream_key(ordinary.pk)) <= STREAM_TTL_AFTER_END_S
    broker.delete(stream_key(segment.pk), stream_key(ordinary.pk))


def test_a_long_texts_timings_come_from_its_segments(alice: Persona, engine: Engine) -> None:
    job = submit(alice)
    segments = segments_of(job)
    for segment in segments:
        run(segment, engine)
    longform_join(parent_id=job.pk)
    segments = segments_of(job)
    job.refresh_from_db()

    timings = alice.client.get(f"/v1/speech/{job.pk}").json()["timings"]

    started = min(s.started_at for s in segments if s.started_at)
    assert timings["started_at"] == started.isoformat().replace("+00:00", "Z")
    assert timings["queue_wait_s"] == round((started - job.created_at).total_seconds(), 3)
    assert segments[0].first_audio_at is not None
    assert timings["first_audio_s"] == round(
        (segments[0].first_audio_at - started).total_seconds(), 3
    )
    assert timings["total_s"] is not None
    assert all(timings[key] is not None for key in timings), timings


def test_a_poll_of_a_running_long_text_has_its_start_before_segment_0_is_done(
    alice: Persona,
) -> None:
    job = submit(alice)
    first = segments_of(job)[0]
    Job.objects.filter(pk=first.pk).update(status=JobStatus.RUNNING, started_at=job.created_at)

    timings = alice.client.get(f"/v1/speech/{job.pk}").json()["timings"]

    assert timings["started_at"] is not None
    assert timings["queue_wait_s"] == 0.0
    assert timings["first_audio_at"] is None


def test_a_poll_can_leave_the_long_text_out(alice: Persona) -> None:
    job = submit(alice)

    polled = alice.client.get(f"/v1/speech/{job.pk}", {"fields": "id,status,progress,timings"})
    full = alice.client.get(f"/v1/speech/{job.pk}")

    assert polled.status_code == 200
    assert set(polled.json()) == {"id", "status", "progress", "timings"}
    assert polled.json()["progress"] == full.json()["progress"]
    assert full.json()["text"] == LONG_TEXT  # without `fields`, every field as before
    assert len(polled.content) < len(LONG_TEXT)


def test_fields_that_a_job_does_not_have_are_refused(alice: Persona, bob: Persona) -> None:
    job = submit(alice)

    for fields in ("id,txt", "", ","):
        error = assert_error(
            alice.client.get(f"/v1/speech/{job.pk}", {"fields": fields}), 400, "invalid_request"
        )
        assert error["details"]["field"] == "fields"
    assert_error(alice.client.get("/v1/speech", {"fields": "nope"}), 400, "invalid_request")
    # An outsider learns nothing more with `fields` than without.
    assert bob.client.get(f"/v1/speech/{job.pk}", {"fields": "id"}).status_code == 404
