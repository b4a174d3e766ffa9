"""A long-form job whose split or join message was lost gets it again from the
sweeper; a join that finds a segment's audio gone fails the job and refunds it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from quotas.models import LedgerEntry
from synthesis.engines.base import Engine
from synthesis.longform.join import longform_join
from synthesis.longform.recovery import STALE, longform_repair
from synthesis.longform.submit import segment_chars
from synthesis.models import Job, JobStatus
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from tenants.models import Plan
from tests.conftest import Persona
from tests.synthesis.longform.test_jobs import LONG_TEXT, run, segments_of, submit

# Long texts run on the embedded default too (`make run`'s pro demo tenant has them).
pytestmark = pytest.mark.embedded


@pytest.fixture(autouse=True)
def _longform_plan(plan: Plan) -> None:
    plan.max_longform_chars = 10_000
    plan.save()


def light_tasks(broker: redis.Redis) -> list[tuple[str, str]]:
    messages = [json.loads(raw) for raw in broker.lrange("light", 0, -1)]
    return [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in messages]


def test_a_job_never_split_gets_its_split_again(alice: Persona, broker: redis.Redis) -> None:
    from synthesis.services.jobs import job_create

    broker.delete("light")
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text=LONG_TEXT)
    )
    assert longform_repair() == 0  # not overdue yet

    assert longform_repair(now=timezone.now() + STALE + timedelta(seconds=1)) == 1

    first = segments_of(job)[0]
    chars = segment_chars(settings.ENGINE)
    assert light_tasks(broker) == [
        ("synthesis.split_longform", repr((str(job.pk), first.characters, chars)))
    ]
    broker.delete("light")


def test_a_job_whose_segments_all_succeeded_gets_its_join_again(
    alice: Persona, engine: Engine, broker: redis.Redis
) -> None:
    job = submit(alice)
    for segment in segments_of(job):
        run(segment, engine)
    broker.delete("light")

    later = timezone.now() + STALE + timedelta(seconds=1)
    assert longform_repair(now=later) == 1

    assert light_tasks(broker) == [("synthesis.join_longform", repr((str(job.pk),)))]
    broker.delete("light")
    longform_join(parent_id=job.pk)
    assert longform_repair(now=later) == 0  # joined: nothing more to send


def test_a_job_still_running_segments_is_left_alone(alice: Persona, engine: Engine) -> None:
    job = submit(alice)
    run(segments_of(job)[0], engine)
    assert longform_repair(now=timezone.now() + STALE * 10) == 0


def test_a_join_that_finds_segment_audio_gone_fails_and_refunds_the_job(
    alice: Persona, engine: Engine
) -> None:
    job = submit(alice)
    for segment in segments_of(job):
        run(segment, engine)
    lost = segments_of(job)[2]
    get_storage().delete(bucket=alice.tenant.bucket, key=lost.output_key)

    result: dict[str, Any] = longform_join(parent_id=job.pk)

    assert result["status"] == "failed"
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert job.error_code == "internal_error"
    kinds = dict(LedgerEntry.objects.filter(job=job).values_list("kind", "characters"))
    assert kinds == {"reserve": len(LONG_TEXT), "refund": len(LONG_TEXT)}
    assert (
        not Job.objects.filter(parent=job, output_deleted_at__isnull=True)
        .exclude(output_key="")
        .exists()
    )
