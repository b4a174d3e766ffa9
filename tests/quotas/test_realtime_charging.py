"""A realtime session's characters: reserved as its text arrives (a little
ahead), charged when it ends for what was sent to the engine, the rest released."""

from __future__ import annotations

from typing import Any

import pytest

from quotas.errors import QuotaExceeded
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.services import quota_commit_spoken
from synthesis.models import Job, JobStatus
from synthesis.realtime.sessions import (
    RESERVE_AHEAD,
    SessionRequest,
    TooManySessions,
    session_open,
    session_reserve,
)
from tests.conftest import Persona

pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = SessionRequest(
    voice_id=None,
    format="pcm",
    sample_rate=None,
    priority=None,
    language="",
    instruction="",
    context="default",
    store=False,
)


def _period(persona: Persona) -> tuple[int, int]:
    period = UsagePeriod.objects.get(tenant=persona.tenant)
    return period.characters_used, period.characters_reserved


def _reserved(job: Job) -> int:
    return LedgerEntry.objects.get(job=job, kind=LedgerKind.RESERVE).characters


def test_appends_reserve_ahead_and_the_end_charges_only_what_was_spoken(
    alice: Persona, broker: Any
) -> None:
    session = session_open(api_key=alice.api_key, request=REQUEST)
    assert (_reserved(session.job), _period(alice)) == (0, (0, 0))

    session_reserve(session=session, characters=5)
    assert _reserved(session.job) == RESERVE_AHEAD  # one write for many small appends
    session_reserve(session=session, characters=RESERVE_AHEAD - 5)
    assert _reserved(session.job) == RESERVE_AHEAD
    session_reserve(session=session, characters=1)
    assert _reserved(session.job) == 2 * RESERVE_AHEAD
    assert _period(alice) == (0, 2 * RESERVE_AHEAD)

    # The session ends having sent 150 characters to the engine (a cancel dropped the rest).
    Job.objects.filter(pk=session.job.pk).update(
        status=JobStatus.SUCCEEDED, characters=150, duration_s=9.5
    )
    assert quota_commit_spoken(job_id=session.job.pk, characters=150)
    assert not quota_commit_spoken(job_id=session.job.pk, characters=150)  # once
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (150, 0)
    assert (period.jobs_succeeded, period.audio_ms) == (1, 9500)


def test_an_append_past_the_months_characters_is_refused_and_reserves_nothing(
    alice: Persona, broker: Any
) -> None:
    alice.tenant.limit_overrides = {"monthly_characters": 250}
    alice.tenant.save()
    session = session_open(api_key=alice.api_key, request=REQUEST)
    session_reserve(session=session, characters=10)
    assert _reserved(session.job) == RESERVE_AHEAD  # ahead, as far as the month allows
    session_reserve(session=session, characters=RESERVE_AHEAD - 10 + 40)
    assert _reserved(session.job) == 250  # the last 50: less than ahead, all that is left
    with pytest.raises(QuotaExceeded) as refused:
        session_reserve(session=session, characters=11)
    assert refused.value.details["requested"] == 1
    assert _reserved(session.job) == 250
    assert session.sent == 240  # the refused text was not taken


def test_a_tenant_opens_no_more_sessions_than_its_plan_allows(alice: Persona, broker: Any) -> None:
    alice.tenant.plan.max_realtime_sessions = 1
    alice.tenant.plan.save()
    session_open(api_key=alice.api_key, request=REQUEST)
    inputs = set(broker.scan_iter("chorus:rt:*:in"))
    with pytest.raises(TooManySessions):
        session_open(api_key=alice.api_key, request=REQUEST)
    assert Job.objects.filter(tenant=alice.tenant, realtime=True).count() == 1
    # The refused session's input stream, written before its admission, is gone.
    assert set(broker.scan_iter("chorus:rt:*:in")) == inputs


def test_a_session_ends_within_the_task_time_limit_whatever_its_plan_allows(
    alice: Persona, settings: Any
) -> None:
    from quotas.plans import tenant_realtime_limits
    from synthesis.realtime.sessions import TASK_LIMIT_MARGIN_S, session_seconds

    settings.TASK_TIME_LIMIT_S = 600
    alice.tenant.plan.max_session_seconds = 3600
    assert session_seconds(tenant_realtime_limits(alice.tenant)) == 600 - TASK_LIMIT_MARGIN_S
    alice.tenant.plan.max_session_seconds = 120
    assert session_seconds(tenant_realtime_limits(alice.tenant)) == 120
