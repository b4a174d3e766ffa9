"""The operator's overview: what it counts, and that it counts it in a few bounded queries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from quotas.services import usage_period_current
from synthesis.calibration.models import CalibratedProfile, ProfileStatus, WorkerLimits
from synthesis.engines.base import EngineInfo
from synthesis.heartbeat import Heartbeat
from synthesis.models import Job, WorkerHeartbeat
from synthesis.overview import (
    WINDOW,
    last_hour_latency,
    overview_parts,
    overview_read,
    percentile,
)
from synthesis.overview_charts import jobs_per_minute, latency_by_priority, nice_ceiling
from synthesis.templatetags.chorus_overview import duration
from tests.conftest import Persona

# Also on SQLite: `make run` serves this page too (percentiles are computed in Python there).
pytestmark = [pytest.mark.django_db, pytest.mark.embedded]


def _job(persona: Persona, **fields: Any) -> Job:
    job = Job.objects.create(
        tenant=persona.tenant, text="x" * fields.pop("characters", 10), characters=10, **fields
    )
    if "created_at" in fields:  # auto_now_add ignores what it is given
        Job.objects.filter(pk=job.pk).update(created_at=fields["created_at"])
    return job


def _finished(persona: Persona, *, ago_s: float, status: str = "succeeded", **fields: Any) -> Job:
    now = timezone.now()
    finished = now - timedelta(seconds=ago_s)
    return _job(
        persona,
        status=status,
        created_at=finished - timedelta(seconds=3),
        started_at=finished - timedelta(seconds=2),
        first_audio_at=finished - timedelta(seconds=1.5),
        finished_at=finished,
        worker="gpu-1:100",
        **fields,
    )


@pytest.fixture
def fleet(alice: Persona, bob: Persona, broker: Any) -> None:
    for _ in range(3):
        _finished(alice, ago_s=120, priority="high")
    _finished(alice, ago_s=60, status="failed", error_code="engine_failed")
    _finished(bob, ago_s=2 * 3600)  # before the window: not counted
    _job(alice, status="pending", priority="low", created_at=timezone.now() - timedelta(minutes=7))
    _job(bob, status="queued", priority="normal")
    _job(bob, status="queued", priority="normal")
    _job(bob, status="running", priority="normal", worker="gpu-1:100")
    broker.rpush("synth.normal", "m1", "m2")
    info = EngineInfo(name="synthetic", sample_rate=24000, device="cuda:0", memory_bytes=3 * 2**30)
    Heartbeat(name="gpu-1:100", info=info, slots=7).beat()
    Heartbeat(name="gpu-0:99", info=info).beat()
    WorkerHeartbeat.objects.filter(name="gpu-0:99").update(
        seen_at=timezone.now() - timedelta(minutes=5)
    )
    Heartbeat(name="gpu-0:1", info=info).beat()  # dead long ago: hidden
    WorkerHeartbeat.objects.filter(name="gpu-0:1").update(
        seen_at=timezone.now() - timedelta(hours=3)
    )
    WorkerLimits.objects.create(
        worker="gpu-1:100", low=2, normal=5, high=7, source="stored", profile_name="Tesla T4"
    )
    CalibratedProfile.objects.create(  # an A10's first worker measures it now
        key="b" * 64,
        engine="cosyvoice2",
        card="NVIDIA A10",
        parts={},
        status=ProfileStatus.CALIBRATING,
        owner="gpu-2:7",
        deadline=timezone.now() + timedelta(minutes=2),
    )
    CalibratedProfile.objects.create(  # its measurer died and its time ran out
        key="c" * 64,
        engine="cosyvoice2",
        card="NVIDIA L4",
        parts={},
        status=ProfileStatus.CALIBRATING,
        owner="gpu-3:8",
        deadline=timezone.now() - timedelta(seconds=1),
    )
    period = usage_period_current(tenant=alice.tenant)
    period.characters_used = 1234
    period.save()
    usage_period_current(tenant=bob.tenant)


def test_it_counts_queues_workers_the_last_hour_and_usage(fleet: None) -> None:
    o = overview_read()

    queues = {q.priority: q for q in o.queues}
    assert (queues["normal"].in_broker, queues["normal"].queued, queues["normal"].running) == (
        2,
        2,
        1,
    )
    assert (queues["low"].pending, queues["low"].waiting) == (1, 1)
    assert o.oldest_waiting_at is not None
    assert 419 < (o.now - o.oldest_waiting_at).total_seconds() < 425
    assert [(t.slug, t.waiting, t.pending) for t in o.tenants_waiting] == [
        ("bob", 2, 0),
        ("alice", 1, 1),
    ]
    assert [(w.name, w.alive) for w in o.workers] == [("gpu-1:100", True), ("gpu-0:99", False)]
    assert o.workers[0].served == {"high": 3, "normal": 1}  # the failed one too
    assert (o.workers[0].capacity, o.workers[0].device) == (7, "cuda:0")
    # Why those limits: the stored curve of its card; the other never said.
    assert [(w.limits_source, w.profile_name) for w in o.workers] == [
        ("stored", "Tesla T4"),
        ("", ""),
    ]
    assert [(c.card, c.owner) for c in o.calibrations] == [("NVIDIA A10", "gpu-2:7")]
    assert (o.finished["succeeded"], o.finished["failed"]) == (3, 1)
    assert sum(m.total for m in o.minutes) == 4
    assert len(o.minutes) == 60
    high = next(row for row in o.latency if row.priority == "high")
    assert high.jobs == 3
    assert high.queue_wait == pytest.approx((1.0, 1.0))
    assert high.first_audio == pytest.approx((0.5, 0.5))
    assert high.total == pytest.approx((3.0, 3.0))
    assert [(f.code, f.jobs) for f in o.failures] == [("engine_failed", 1)]
    assert [(u.slug, u.characters_used) for u in o.top_usage] == [("alice", 1234), ("bob", 0)]


def test_the_waiting_line_is_read_once_for_the_queues_and_the_tenants(
    fleet: None, bob: Persona
) -> None:
    """Both tables come from one pass over the waiting line, the longest thing
    the page reads (100,000 waiting jobs are 100,000 index entries a pass)."""
    earlier = timezone.now() - timedelta(hours=1)
    _job(bob, status="pending", priority="high", created_at=earlier)
    with CaptureQueriesContext(connection) as queries:
        o = overview_read()

    over_the_line = [q["sql"] for q in queries.captured_queries if "'pending'" in q["sql"]]
    assert len(over_the_line) == 1, over_the_line
    # Bob: 3 waiting (1 pending) and the oldest; Alice 1 (pending).
    assert [(t.slug, t.waiting, t.pending) for t in o.tenants_waiting] == [
        ("bob", 3, 1),
        ("alice", 1, 1),
    ]
    assert (
        o.tenants_waiting[0].oldest_waiting_at
        == Job.objects.get(tenant=bob.tenant, priority="high").created_at
    )
    queues = {q.priority: q for q in o.queues}
    assert (queues["high"].pending, queues["high"].queued, queues["high"].running) == (1, 0, 0)
    assert queues["high"].oldest_waiting_at == o.tenants_waiting[0].oldest_waiting_at


def test_without_postgresql_the_percentiles_come_out_the_same(
    alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        _finished(alice, ago_s=60 + i, priority=("high", "low")[i % 2])
    # Spread the spans so the percentiles differ from the median.
    for i, job in enumerate(Job.objects.order_by("finished_at")):
        Job.objects.filter(pk=job.pk).update(started_at=job.created_at + timedelta(seconds=i))
    since = timezone.now() - WINDOW
    in_database = last_hour_latency(since)

    monkeypatch.setattr(connection, "vendor", "sqlite")
    in_python = last_hour_latency(since)

    assert in_python == in_database
    assert in_database[0].queue_wait == (9.0, 19.0)  # high waited 1, 3, ... 19 s


def test_the_failure_link_lists_exactly_those_jobs(fleet: None, alice: Persona) -> None:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    link = overview_read().failures[0].url

    listed = client.get(link)

    assert listed.status_code == 200
    assert [job.error_code for job in listed.context["cl"].result_list] == ["engine_failed"]


def test_the_admin_index_shows_the_overview_in_a_bounded_number_of_queries(
    fleet: None, django_assert_max_num_queries: Any
) -> None:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(user)

    with django_assert_max_num_queries(13):
        page = client.get(reverse("admin:index"))

    html = page.content.decode()
    assert page.status_code == 200
    for section in ("overview-queues", "overview-workers", "overview-last-hour", "overview-usage"):
        assert f'id="{section}"' in html
    assert "engine_failed" in html
    assert "<svg" in html
    assert 'href="/admin/synthesis/job/?status__exact=failed' in html
    assert "stored: Tesla T4" in html
    assert "<strong>Calibrating</strong> cosyvoice2 on NVIDIA A10: gpu-2:7" in html


def test_staff_without_access_to_jobs_see_only_the_app_list(fleet: None) -> None:
    user = get_user_model().objects.create_user("clerk", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)

    page = client.get(reverse("admin:index"))

    assert page.status_code == 200
    assert 'id="overview"' not in page.content.decode()


def test_an_empty_fleet_renders(db: None) -> None:
    o = overview_read()

    assert (o.workers, o.failures, o.oldest_waiting_at) == ([], [], None)
    assert "<svg" in jobs_per_minute(o.minutes)
    assert "<svg" in latency_by_priority(o.latency)


def test_percentiles_are_observed_values() -> None:
    values = [float(v) for v in range(1, 101)]

    assert (percentile(values, 0.5), percentile(values, 0.95)) == (50.0, 95.0)
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.95) == 7.0


def test_axes_end_on_round_numbers_and_durations_read_as_people_say_them() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 3, 12, 2001)] == [1, 1, 5, 20, 5000]
    assert [duration(v) for v in (None, 0.2345, 42.4, 95, 7300, 200_000)] == [
        "-",
        "0.234 s",
        "42 s",
        "1 m 35 s",
        "2 h 1 m",
        "2 d 7 h",
    ]


def test_each_part_of_the_overview_runs_alone_and_answers_as_in_the_whole(fleet: None) -> None:
    now = timezone.now()
    whole = overview_read(now=now)

    parts = dict(overview_parts(now=now))

    assert len(parts) == 9
    answers = {name: run() for name, run in parts.items()}
    assert answers["queues (waiting/running by status, priority)"] == whole.queues
    assert answers["tenants with most waiting jobs"] == whole.tenants_waiting
    assert answers["failures by code"] == whole.failures
    assert answers["top tenants by characters this period"] == whole.top_usage
    assert answers["cards being calibrated"] == whole.calibrations


def test_a_long_texts_segments_are_not_counted_as_jobs(alice: Persona, broker: Any) -> None:
    for _ in range(3):
        _finished(alice, ago_s=60)
    parent = _finished(alice, ago_s=30, segments_total=5)
    for index in range(5):
        _finished(alice, ago_s=40, parent=parent, segment_index=index)
    _finished(alice, ago_s=40, status="failed", error_code="engine_failed", parent=parent)

    overview = overview_read()

    assert overview.finished == {"succeeded": 4}  # as the API lists them: 3 + the long text
    assert sum(m.total for m in overview.minutes) == 4
    assert overview.failures == []
    assert sum(row.jobs for row in overview.latency) == 4
