"""What the operator's overview page shows: queues, workers, the last hour, usage.

Every query is bounded, so the page costs the same at a million job rows as at a
hundred: the waiting line is read in one pass over its partial index, running
jobs through the (status, priority, created_at) index, the last hour through
`job_finished_at`, usage from the current periods' counters (never the jobs),
workers from their heartbeat rows.
The last hour's jobs are grouped in the database (by minute and outcome, by
worker, by error code; percentiles with PostgreSQL's `percentile_disc`), so a
busy hour returns a few hundred rows, not its jobs.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
)
from django.db.models.functions import TruncMinute
from django.urls import reverse
from django.utils import timezone

from chorus.redis_client import get_redis
from quotas.models import UsagePeriod
from synthesis.calibration.models import CalibratedProfile, ProfileStatus, WorkerLimits
from synthesis.heartbeat import worker_is_alive
from synthesis.models import WAITING, Job, JobStatus, Priority, WorkerHeartbeat
from tenants.models import Tenant

PRIORITIES: tuple[str, ...] = tuple(Priority.values)
WINDOW = timedelta(hours=1)
# A worker that stopped reporting stays listed (as dead) this long, then drops
# off the page; the Worker heartbeats admin keeps every row.
DEAD_SHOWN_FOR = timedelta(hours=1)
TOP = 10
# kombu's Redis transport keeps a message sent with a priority in a list of its
# own, "<queue>\x06\x16<step>", beside the plain one.
_KOMBU_PRIORITY_STEPS = (3, 6, 9)
_KOMBU_SEP = "\x06\x16"


@dataclass(frozen=True)
class QueueRow:
    priority: str
    in_broker: int | None  # messages in Redis; None when Redis did not answer
    queued: int  # rows the broker should hold
    pending: int  # held back in the database by fair admission
    running: int
    oldest_waiting_at: datetime | None

    @property
    def waiting(self) -> int:
        return self.queued + self.pending


@dataclass(frozen=True)
class TenantWaiting:
    slug: str
    tenant_id: int
    waiting: int
    pending: int
    oldest_waiting_at: datetime


@dataclass(frozen=True)
class WorkerRow:
    name: str
    alive: bool
    seen_at: datetime
    heartbeat_age_s: float
    started_at: datetime
    engine: str
    device: str
    node: str  # Celery's node name (gpu0@host); `name` is host:pid
    queues: str  # the priorities it takes, in its order
    streams_running: int
    capacity: int
    limits: str  # streams below which it starts low / normal / high jobs
    limits_source: str  # why those: calibrated, stored, profile, by hand, engine ("" if unknown)
    profile_name: str  # the named profile or card whose curve chose them
    memory_bytes: int  # the engine's (device memory), or else the process's RSS
    jobs_done: int
    jobs_failed: int
    last_error: str
    served: dict[str, int]  # jobs it finished in the last hour, by priority


@dataclass(frozen=True)
class Calibration:
    """A card being measured now by its first worker; the card's other workers
    wait for its curve."""

    card: str
    engine: str
    owner: str  # host:pid
    deadline: datetime  # when its measuring ends at the latest


@dataclass(frozen=True)
class Latency:
    priority: str
    jobs: int
    queue_wait: tuple[float | None, float | None]  # p50, p95 in seconds
    first_audio: tuple[float | None, float | None]
    total: tuple[float | None, float | None]


@dataclass(frozen=True)
class FailureRow:
    code: str
    jobs: int
    url: str  # the Jobs admin, filtered to these jobs


@dataclass(frozen=True)
class Minute:
    at: datetime
    succeeded: int
    failed: int
    cancelled: int

    @property
    def total(self) -> int:
        return self.succeeded + self.failed + self.cancelled


@dataclass(frozen=True)
class TenantUsage:
    slug: str
    tenant_id: int
    characters_used: int
    characters_reserved: int
    period_ends_at: datetime


@dataclass
class Overview:
    now: datetime
    queues: list[QueueRow]
    tenants_waiting: list[TenantWaiting]
    workers: list[WorkerRow]
    calibrations: list[Calibration]
    minutes: list[Minute]
    latency: list[Latency]
    failures: list[FailureRow]
    top_usage: list[TenantUsage]
    finished: Counter[str] = field(default_factory=Counter)  # last hour, by status

    @property
    def oldest_waiting_at(self) -> datetime | None:
        return min((q.oldest_waiting_at for q in self.queues if q.oldest_waiting_at), default=None)

    @property
    def workers_alive(self) -> int:
        return sum(w.alive for w in self.workers)


def overview_read(*, now: datetime | None = None) -> Overview:
    now = now or timezone.now()
    since = now - WINDOW
    minutes, finished = _minutes(now, since)
    line = _waiting_line()
    return Overview(
        now=now,
        queues=_queues(line),
        tenants_waiting=_tenants_waiting(line),
        workers=_workers(now, since),
        calibrations=_calibrations(now),
        minutes=minutes,
        latency=last_hour_latency(since),
        failures=_failures(since),
        top_usage=_top_usage(now),
        finished=finished,
    )


def overview_parts(*, now: datetime) -> list[tuple[str, Callable[[], object]]]:
    """The overview's queries by name, each runnable alone: what `bench/overview.py`
    times one by one at a million jobs (the parts of `overview_read`)."""
    since = now - WINDOW
    return [
        ("queues (waiting/running by status, priority)", lambda: _queues(_waiting_line())),
        ("broker depth (Redis LLEN)", broker_depth),
        ("tenants with most waiting jobs", lambda: _tenants_waiting(_waiting_line())),
        ("workers (heartbeats of the last hour, jobs served)", lambda: _workers(now, since)),
        ("cards being calibrated", lambda: _calibrations(now)),
        ("jobs per minute (the last hour)", lambda: _minutes(now, since)),
        ("latency p50/p95 by priority", lambda: last_hour_latency(since)),
        ("failures by code", lambda: _failures(since)),
        ("top tenants by characters this period", lambda: _top_usage(now)),
    ]


# --- queues ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Waiting:
    """One (tenant, status, priority) group of the waiting line."""

    tenant_id: int
    status: str
    priority: str
    n: int
    oldest: datetime


def _waiting_line() -> list[_Waiting]:
    """The waiting line grouped by tenant, status and priority: one pass over its
    partial index (`job_waiting`), from which both the queues and the tenants
    with the most waiting are summed. Two aggregates over it (per queue, then
    per tenant, joined to the tenant for its slug) each read every waiting job:
    46 and 58 ms at 100,000 waiting (`bench/growth.py`)."""
    return [
        _Waiting(tenant_id, status, priority, n, oldest)
        for tenant_id, status, priority, n, oldest in Job.objects.filter(status__in=WAITING)
        .order_by()
        .values_list("tenant_id", "status", "priority")
        .annotate(n=Count("id"), oldest=Min("created_at"))
    ]


def _queues(line: list[_Waiting]) -> list[QueueRow]:
    counts: dict[tuple[str, str], int] = Counter()
    oldest: dict[str, datetime] = {}
    for group in line:
        counts[group.status, group.priority] += group.n
        if group.priority not in oldest or group.oldest < oldest[group.priority]:
            oldest[group.priority] = group.oldest
    running = dict(
        Job.objects.filter(status=JobStatus.RUNNING)
        .order_by()
        .values_list("priority")
        .annotate(n=Count("id"))
    )
    depth = broker_depth()
    return [
        QueueRow(
            priority=priority,
            in_broker=None if depth is None else depth.get(priority, 0),
            queued=counts[JobStatus.QUEUED, priority],
            pending=counts[JobStatus.PENDING, priority],
            running=running.get(priority, 0),
            oldest_waiting_at=oldest.get(priority),
        )
        for priority in PRIORITIES
    ]


def broker_depth() -> dict[str, int] | None:
    """Messages waiting in each priority's Redis list (LLEN), or None without Redis."""
    client = get_redis()
    if client is None:
        return None
    names = {queue.removeprefix("synth."): queue for queue in settings.SYNTH_QUEUES}
    try:
        with client.pipeline(transaction=False) as pipe:
            for queue in names.values():
                pipe.llen(queue)
                for step in _KOMBU_PRIORITY_STEPS:
                    pipe.llen(f"{queue}{_KOMBU_SEP}{step}")
            lengths = pipe.execute()
    except Exception:  # an unreachable broker is shown as such, not as a 500
        return None
    per = 1 + len(_KOMBU_PRIORITY_STEPS)
    return {priority: sum(lengths[i * per : (i + 1) * per]) for i, priority in enumerate(names)}


def _tenants_waiting(line: list[_Waiting]) -> list[TenantWaiting]:
    waiting: Counter[int] = Counter()
    pending: Counter[int] = Counter()
    oldest: dict[int, datetime] = {}
    for group in line:
        waiting[group.tenant_id] += group.n
        if group.status == JobStatus.PENDING:
            pending[group.tenant_id] += group.n
        if group.tenant_id not in oldest or group.oldest < oldest[group.tenant_id]:
            oldest[group.tenant_id] = group.oldest
    top = sorted(waiting, key=lambda tenant_id: (-waiting[tenant_id], oldest[tenant_id]))[:TOP]
    slugs = dict(Tenant.objects.filter(pk__in=top).values_list("pk", "slug"))
    return [
        TenantWaiting(
            slug=slugs.get(tenant_id, ""),
            tenant_id=tenant_id,
            waiting=waiting[tenant_id],
            pending=pending[tenant_id],
            oldest_waiting_at=oldest[tenant_id],
        )
        for tenant_id in top
    ]


# --- workers --------------------------------------------------------------------


def _workers(now: datetime, since: datetime) -> list[WorkerRow]:
    served: dict[str, Counter[str]] = defaultdict(Counter)
    for worker, priority, n in (
        _finished_since(since).values_list("worker", "priority").annotate(n=Count("id"))
    ):
        served[worker][priority] = n
    chosen = WorkerLimits.objects.filter(worker=OuterRef("name"))
    beats = (
        WorkerHeartbeat.objects.filter(seen_at__gte=now - DEAD_SHOWN_FOR)
        .annotate(
            limits_source=Subquery(chosen.values("source")[:1]),
            profile_name=Subquery(chosen.values("profile_name")[:1]),
        )
        .order_by("name")
    )
    rows = [
        WorkerRow(
            name=b.name,
            alive=worker_is_alive(b.seen_at, now),
            seen_at=b.seen_at,
            heartbeat_age_s=max(0.0, (now - b.seen_at).total_seconds()),
            started_at=b.started_at,
            engine=b.engine,
            device=b.device,
            node=b.node,
            queues=",".join(q.removeprefix("synth.") for q in b.queues.split(",") if q),
            streams_running=b.slots_busy,
            capacity=b.slots,
            limits=f"{b.streams_low} / {b.streams_normal} / {b.slots}",
            limits_source=b.limits_source or "",
            profile_name=b.profile_name or "",
            memory_bytes=b.memory_bytes or b.rss_bytes,
            jobs_done=b.jobs_done,
            jobs_failed=b.jobs_failed,
            last_error=b.last_error,
            served={p: served[b.name][p] for p in PRIORITIES if served[b.name][p]},
        )
        for b in beats[:100]
    ]
    return sorted(rows, key=lambda w: (not w.alive, w.name))


def _calibrations(now: datetime) -> list[Calibration]:
    """Calibrations under way (a past deadline is one the next worker takes over)."""
    rows = CalibratedProfile.objects.filter(
        status=ProfileStatus.CALIBRATING, deadline__gt=now
    ).order_by("created_at")
    return [
        Calibration(card=row.card, engine=row.engine, owner=row.owner, deadline=row.deadline)
        for row in rows[:20]
        if row.deadline is not None
    ]


# --- the last hour --------------------------------------------------------------


def _finished_since(since: datetime) -> QuerySet[Job]:
    """Jobs finished since `since`: an index range on finished_at (`job_finished_at`),
    grouped by the caller so only a few rows come back however busy the hour was.
    A long text's segments are work a worker served, not jobs of their own."""
    return Job.objects.filter(finished_at__gte=since).order_by()


def _jobs_finished_since(since: datetime) -> QuerySet[Job]:
    """Jobs as tenants see them (and as usage counts them): a long text is one,
    whatever its segments."""
    return _finished_since(since).filter(parent__isnull=True)


def _minutes(now: datetime, since: datetime) -> tuple[list[Minute], Counter[str]]:
    end = now.replace(second=0, microsecond=0)
    start = end - WINDOW + timedelta(minutes=1)
    counts: dict[datetime, Counter[str]] = defaultdict(Counter)
    finished: Counter[str] = Counter()
    for minute, status, n in (
        _jobs_finished_since(since)
        .annotate(minute=TruncMinute("finished_at"))
        .values_list("minute", "status")
        .annotate(n=Count("id"))
    ):
        finished[status] += n
        if minute >= start:
            counts[minute][status] += n
    out = []
    for i in range(int(WINDOW.total_seconds() // 60)):
        at = start + timedelta(minutes=i)
        c = counts.get(at, Counter())
        out.append(Minute(at, c["succeeded"], c["failed"], c["cancelled"]))
    return out, finished


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (what `percentile_disc` gives): an observed value."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _span(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() if a and b else None


class PercentileDisc(Aggregate):
    """PostgreSQL's ordered-set aggregate: the observed value at fraction `q`."""

    function = "PERCENTILE_DISC"
    template = "%(function)s(%(q)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, *, q: float) -> None:
        super().__init__(expression, output_field=DurationField(), q=float(q))


_SPANS = {  # as the API reports them
    "queue_wait": ("created_at", "started_at"),
    "first_audio": ("started_at", "first_audio_at"),
    "total": ("created_at", "finished_at"),
}


def last_hour_latency(since: datetime) -> list[Latency]:
    """p50 and p95 of queue wait (submitted → started), first audio (started →
    first chunk) and total (submitted → finished) of jobs that succeeded since
    `since`, per priority. PostgreSQL computes them; elsewhere (SQLite, the
    embedded default, which has no percentile aggregate) the spans come back
    and are sorted here."""
    jobs = _jobs_finished_since(since).filter(status=JobStatus.SUCCEEDED)
    if connection.vendor == "postgresql":
        return _latency_in_database(jobs)
    spans: dict[str, dict[str, list[float]]] = {p: {k: [] for k in _SPANS} for p in PRIORITIES}
    for priority, created, started, first_audio, finished in jobs.values_list(
        "priority", "created_at", "started_at", "first_audio_at", "finished_at"
    ):
        for name, value in (
            ("queue_wait", _span(created, started)),
            ("first_audio", _span(started, first_audio)),
            ("total", _span(created, finished)),
        ):
            if priority in spans and value is not None:
                spans[priority][name].append(value)
    return [
        Latency(
            priority=p,
            jobs=len(s["total"]),
            **{k: (percentile(v, 0.50), percentile(v, 0.95)) for k, v in s.items()},
        )
        for p, s in spans.items()
    ]


def _latency_in_database(jobs: QuerySet[Job]) -> list[Latency]:
    aggregates: dict[str, Any] = {"n": Count("id")}
    for name, (a, b) in _SPANS.items():
        span = ExpressionWrapper(F(b) - F(a), output_field=DurationField())
        aggregates[f"{name}_50"] = PercentileDisc(span, q=0.50)
        aggregates[f"{name}_95"] = PercentileDisc(span, q=0.95)
    rows = {row["priority"]: row for row in jobs.values("priority").annotate(**aggregates)}

    def seconds(value: timedelta | None) -> float | None:
        return None if value is None else value.total_seconds()

    out = []
    for p in PRIORITIES:
        row = rows.get(p, {})
        spans = {
            name: (seconds(row.get(f"{name}_50")), seconds(row.get(f"{name}_95")))
            for name in _SPANS
        }
        out.append(Latency(priority=p, jobs=row.get("n", 0), **spans))
    return out


def jobs_admin_url(**filters: str) -> str:
    return f"{reverse('admin:synthesis_job_changelist')}?{urlencode(filters)}"


def _failures(since: datetime) -> list[FailureRow]:
    codes = (
        _jobs_finished_since(since)
        .filter(status=JobStatus.FAILED)
        .values_list("error_code")
        .annotate(n=Count("id"))
        .order_by("-n", "error_code")
    )
    return [
        FailureRow(
            code=code or "(none)",
            jobs=n,
            url=jobs_admin_url(
                status__exact=JobStatus.FAILED,
                error_code__exact=code,
                finished_at__gte=since.isoformat(timespec="seconds"),
            ),
        )
        for code, n in codes
    ]


# --- usage ----------------------------------------------------------------------


def _top_usage(now: datetime) -> list[TenantUsage]:
    """The current period of every tenant (periods are at most a month long, so
    `starts_at` bounds the rows read), most characters first."""
    periods = (
        UsagePeriod.objects.filter(
            starts_at__gt=now - timedelta(days=32), starts_at__lte=now, ends_at__gt=now
        )
        .select_related("tenant")
        .order_by("-characters_used", "tenant_id")[:TOP]
    )
    return [
        TenantUsage(
            slug=p.tenant.slug,
            tenant_id=p.tenant_id,
            characters_used=p.characters_used,
            characters_reserved=p.characters_reserved,
            period_ends_at=p.ends_at,
        )
        for p in periods
    ]
