"""Billing periods, effective limits and the character ledger's settlement rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from quotas.errors import QuotaExceeded, StorageQuotaExceeded
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.periods import billing_period
from quotas.plans import tenant_limits, validate_overrides
from quotas.services import (
    quota_admit,
    quota_commit,
    quota_refund,
    tenant_anchor,
    usage_period_current,
)
from synthesis.models import Job
from synthesis.services.jobs import job_create
from synthesis.services.voices import voice_create
from synthesis.speech_request import SpeechRequest
from tests.audio_files import audio_file
from tests.conftest import Persona


def at(year: int, month: int, day: int, hour: int = 12) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


def midnight(year: int, month: int, day: int) -> datetime:
    return datetime(year, month, day, tzinfo=UTC)


# --- billing periods --------------------------------------------------------------


@pytest.mark.parametrize(
    ("anchor", "now", "period"),
    [
        # An anchor on the 31st falls on the last day of February...
        (date(2025, 1, 31), at(2025, 2, 28), (midnight(2025, 2, 28), midnight(2025, 3, 31))),
        (date(2025, 1, 31), at(2025, 2, 27), (midnight(2025, 1, 31), midnight(2025, 2, 28))),
        # ...and of February in a leap year.
        (date(2024, 1, 31), at(2024, 2, 29), (midnight(2024, 2, 29), midnight(2024, 3, 31))),
        (date(2024, 1, 31), at(2024, 2, 28), (midnight(2024, 1, 31), midnight(2024, 2, 29))),
        # Back to the 31st in a month that has one.
        (date(2025, 1, 31), at(2025, 3, 30), (midnight(2025, 2, 28), midnight(2025, 3, 31))),
        (date(2025, 1, 31), at(2025, 3, 31), (midnight(2025, 3, 31), midnight(2025, 4, 30))),
        # Month rollover: before the anchor day, the period began last month.
        (date(2025, 1, 15), at(2025, 6, 14), (midnight(2025, 5, 15), midnight(2025, 6, 15))),
        (date(2025, 1, 15), at(2025, 6, 15, 0), (midnight(2025, 6, 15), midnight(2025, 7, 15))),
        # Year rollover, both ways.
        (date(2024, 3, 10), at(2025, 1, 5), (midnight(2024, 12, 10), midnight(2025, 1, 10))),
        (date(2024, 3, 10), at(2025, 12, 20), (midnight(2025, 12, 10), midnight(2026, 1, 10))),
        (date(2024, 3, 1), at(2025, 12, 31, 23), (midnight(2025, 12, 1), midnight(2026, 1, 1))),
    ],
)
def test_the_billing_period_starts_on_the_anchor_day(
    anchor: date, now: datetime, period: tuple[datetime, datetime]
) -> None:
    assert billing_period(anchor, now) == period


@pytest.mark.parametrize("day", [1, 15, 28, 29, 30, 31])
def test_consecutive_billing_periods_tile_the_year_without_gaps(day: int) -> None:
    anchor = date(2024, 1, day)
    start, end = billing_period(anchor, at(2024, 1, 1))
    for _ in range(24):
        assert start <= end - timedelta(days=28)
        next_start, next_end = billing_period(anchor, end)
        assert next_start == end
        start, end = next_start, next_end


def test_a_new_period_starts_with_nothing_used(alice: Persona) -> None:
    tenant = alice.tenant
    tenant.billing_anchor = date(2025, 1, 31)
    tenant.save(update_fields=["billing_anchor"])
    february = usage_period_current(tenant=tenant, now=at(2025, 2, 20))
    UsagePeriod.objects.filter(pk=february.pk).update(characters_used=999, characters_reserved=7)

    march = usage_period_current(tenant=tenant, now=at(2025, 2, 28, 0))

    assert march.pk != february.pk
    assert (march.starts_at, march.ends_at) == (midnight(2025, 2, 28), midnight(2025, 3, 31))
    assert (march.characters_used, march.characters_reserved) == (0, 0)
    assert usage_period_current(tenant=tenant, now=at(2025, 3, 30)).pk == march.pk


def test_a_full_previous_period_does_not_stop_submissions_after_the_anchor(
    alice: Persona,
) -> None:
    tenant = alice.tenant
    tenant.limit_overrides = {"monthly_characters": 100}
    tenant.save(update_fields=["limit_overrides"])
    anchor = tenant_anchor(tenant)
    start, _ = billing_period(anchor, timezone.now())
    previous_start, previous_end = billing_period(anchor, start - timedelta(microseconds=1))
    assert previous_end == start
    UsagePeriod.objects.create(
        tenant=tenant, starts_at=previous_start, ends_at=previous_end, characters_used=100
    )

    job = job_create(tenant=tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 100))

    current = usage_period_current(tenant=tenant)
    assert current.starts_at == start
    assert (current.characters_used, current.characters_reserved) == (0, 100)
    assert job.characters == 100


# --- effective limits -------------------------------------------------------------


def test_tenant_overrides_replace_the_plans_limits(alice: Persona) -> None:
    plan = alice.tenant.plan
    alice.tenant.limit_overrides = {
        "monthly_characters": 123,
        "max_concurrent_jobs": 2,
        "allowed_priorities": ["low"],
    }

    limits = tenant_limits(alice.tenant)

    assert limits.monthly_characters == 123
    assert limits.max_concurrent_jobs == 2
    assert limits.allowed_priorities == ("low",)
    assert limits.voice_slots == plan.voice_slots  # not overridden: the plan's
    assert limits.requests_per_minute == plan.requests_per_minute


def test_an_override_below_usage_refuses_the_next_job(alice: Persona) -> None:
    job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 50))
    alice.tenant.limit_overrides = {"monthly_characters": 60}
    alice.tenant.save(update_fields=["limit_overrides"])

    with pytest.raises(QuotaExceeded) as caught:
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="y" * 11))

    assert caught.value.details["limit"] == 60
    assert caught.value.details["reserved"] == 50
    assert caught.value.details["requested"] == 11
    job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="y" * 10)
    )  # exactly fits


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        "monthly_characters=5",
        {"monthly_chars": 5},
        {"plan": 1},
        {"monthly_characters": -1},
        {"max_reference_seconds": -0.5},
        {"monthly_characters": "1000"},
        {"monthly_characters": None},
        {"monthly_characters": True},
        {"allowed_priorities": "high"},
        {"allowed_priorities": []},
        {"allowed_priorities": ["urgent"]},
        {"allowed_priorities": ["high", "NORMAL"]},
        {"allowed_priorities": [["high"]]},
        {"allowed_priorities": [{"high": 1}]},
    ],
)
def test_validate_overrides_refuses_what_an_admin_could_mistype(overrides: object) -> None:
    with pytest.raises(ValidationError):
        validate_overrides(overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"monthly_characters": 0},
        {"monthly_characters": 500_000, "requests_per_minute": 5},
        {"max_reference_seconds": 12.5},
        {"allowed_priorities": ["high", "low"]},
    ],
)
def test_validate_overrides_accepts_plan_limit_names_with_sane_values(overrides: object) -> None:
    validate_overrides(overrides)


def test_a_tenant_with_bad_overrides_does_not_pass_model_validation(alice: Persona) -> None:
    alice.tenant.limit_overrides = {"monthly_characters": -5}

    with pytest.raises(ValidationError) as caught:
        alice.tenant.clean()

    assert "limit_overrides" in caught.value.message_dict


# --- settlement -------------------------------------------------------------------


def entries(job: Job) -> list[tuple[str, int]]:
    rows = LedgerEntry.objects.filter(job=job).order_by("id")
    return list(rows.values_list("kind", "characters"))


def test_a_commit_charges_the_reservation_once(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 40)
    )

    assert quota_commit(job_id=job.id) is True
    assert quota_commit(job_id=job.id) is False
    assert quota_refund(job_id=job.id) is False

    period = usage_period_current(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (40, 0)
    assert entries(job) == [(LedgerKind.RESERVE, 40), (LedgerKind.COMMIT, 40)]


def test_a_refund_releases_the_reservation_once(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 40)
    )

    assert quota_refund(job_id=job.id) is True
    assert quota_refund(job_id=job.id) is False
    assert quota_commit(job_id=job.id) is False

    period = usage_period_current(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (0, 0)
    assert entries(job) == [(LedgerKind.RESERVE, 40), (LedgerKind.REFUND, 40)]


def test_a_second_settlement_inside_a_transaction_leaves_it_usable(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 40)
    )
    quota_commit(job_id=job.id)

    with transaction.atomic():
        assert quota_refund(job_id=job.id) is False
        # The refused insert was rolled back to its savepoint, not the whole block.
        assert Job.objects.filter(pk=job.pk).exists()


def test_settling_a_job_without_a_reservation_does_nothing(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 40)
    )
    LedgerEntry.objects.filter(job=job).delete()

    assert quota_commit(job_id=job.id) is False
    assert quota_refund(job_id=job.id) is False
    assert not LedgerEntry.objects.filter(job=job).exists()


def test_a_settlement_lands_in_the_period_of_the_reservation(alice: Persona) -> None:
    job = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="x" * 40)
    )
    reserved_in = LedgerEntry.objects.get(job=job, kind=LedgerKind.RESERVE).period
    # The month turned over while the job ran: a new period now exists.
    UsagePeriod.objects.create(
        tenant=alice.tenant, starts_at=reserved_in.ends_at, ends_at=reserved_in.ends_at
    )

    quota_commit(job_id=job.id)

    reserved_in.refresh_from_db()
    assert (reserved_in.characters_used, reserved_in.characters_reserved) == (40, 0)
    later = UsagePeriod.objects.get(tenant=alice.tenant, starts_at=reserved_in.ends_at)
    assert (later.characters_used, later.characters_reserved) == (0, 0)


# --- admission --------------------------------------------------------------------


def test_admission_refuses_a_job_once_storage_is_full(alice: Persona) -> None:
    audio = audio_file(4.0, 24000)
    voice_create(tenant=alice.tenant, name="narrator", audio=audio)
    alice.tenant.limit_overrides = {"storage_bytes": len(audio)}
    alice.tenant.save(update_fields=["limit_overrides"])

    with pytest.raises(StorageQuotaExceeded) as caught:
        job_create(tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Hello."))

    assert caught.value.details == {"limit": len(audio), "value": len(audio)}
    assert not Job.objects.filter(tenant=alice.tenant).exists()
    period = usage_period_current(tenant=alice.tenant)
    assert period.characters_reserved == 0


def test_admission_allows_a_job_while_storage_has_room(alice: Persona) -> None:
    audio = audio_file(4.0, 24000)
    voice_create(tenant=alice.tenant, name="narrator", audio=audio)
    limits = replace(tenant_limits(alice.tenant), storage_bytes=len(audio) + 1)

    with transaction.atomic():
        period = quota_admit(tenant=alice.tenant, limits=limits, characters=10, in_flight=0)

    assert period == usage_period_current(tenant=alice.tenant)
