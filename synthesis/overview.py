"""What the operator's overview page shows: queues, workers, the last hour, usage.

Every query is bounded, so the page costs the same at a million job rows as at a
hundred: waiting and running jobs are read through the (status, priority,
created_at) index, the last hour through `job_finished_at`, usage from the
current periods' counters (never the jobs), workers from their heartbeat rows.
The last hour's jobs are read once, a few narrow columns each, and summed here
(percentiles in Python work on SQLite, the embedded default, as on PostgreSQL).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import Count, Min, Q
from django.urls import reverse
from django.utils import timezone

from chorus.redis_client import get_redis
from quotas.models import UsagePeriod
from synthesis.heartbeat import worker_is_alive
from synthesis.models import WAITING, Job, JobStatus, Priority, WorkerHeartbeat

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
    streams_running: int
    capacity: int
    memory_bytes: int
    jobs_done: int
    jobs_failed: int
    last_error: str
    served: dict[str, int]  # jobs it finished in the last hour, by priority


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
    recent = _finished_since(since)
    finished = Counter(status for _, status, *_ in recent)
    return Overview(
        now=now,
        queues=_queues(),
        tenants_waiting=_tenants_waiting(),
        workers=_workers(now, recent),
        minutes=_minutes(now, recent),
        latency=_latency(recent),
        failures=_failures(since, recent),
        top_usage=_top_usage(now),
        finished=finished,
    )


# --- queues ---------------------------------------------------------------------


def _queues() -> list[QueueRow]:
    counts: dict[tuple[str, str], tuple[int, datetime | None]] = {
        (status, priority): (n, oldest)
        for status, priority, n, oldest in Job.objects.filter(
            status__in=(*WAITING, JobStatus.RUNNING)
        )
        .order_by()
        .values_list("status", "priority")
        .annotate(n=Count("id"), oldest=Min("created_at"))
    }
    depth = broker_depth()
    rows = []
    for priority in PRIORITIES:
        queued, oldest_queued = counts.get((JobStatus.QUEUED, priority), (0, None))
        pending, oldest_pending = counts.get((JobStatus.PENDING, priority), (0, None))
        running, _ = counts.get((JobStatus.RUNNING, priority), (0, None))
        oldest = min((t for t in (oldest_queued, oldest_pending) if t), default=None)
        rows.append(
            QueueRow(
                priority=priority,
                in_broker=None if depth is None else depth.get(priority, 0),
                queued=queued,
                pending=pending,
                running=running,
                oldest_waiting_at=oldest,
            )
        )
    return rows


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


def _tenants_waiting() -> list[TenantWaiting]:
    rows = (
        Job.objects.filter(status__in=WAITING)
        .order_by()
        .values_list("tenant_id", "tenant__slug")
        .annotate(
            n=Count("id"),
            pending=Count("id", filter=Q(status=JobStatus.PENDING)),
            oldest=Min("created_at"),
        )
        .order_by("-n", "oldest")[:TOP]
    )
    return [
        TenantWaiting(slug=slug, tenant_id=tid, waiting=n, pending=p, oldest_waiting_at=oldest)
        for tid, slug, n, p, oldest in rows
    ]


# --- workers --------------------------------------------------------------------


def _workers(now: datetime, recent: Sequence[tuple]) -> list[WorkerRow]:
    served: dict[str, Counter[str]] = defaultdict(Counter)
    for priority, _status, worker, *_ in recent:
        served[worker][priority] += 1
    beats = WorkerHeartbeat.objects.filter(seen_at__gte=now - DEAD_SHOWN_FOR).order_by("name")
    rows = [
        WorkerRow(
            name=b.name,
            alive=worker_is_alive(b.seen_at, now),
            seen_at=b.seen_at,
            heartbeat_age_s=max(0.0, (now - b.seen_at).total_seconds()),
            started_at=b.started_at,
            engine=b.engine,
            device=b.device,
            streams_running=b.slots_busy,
            capacity=b.slots,
            memory_bytes=b.memory_bytes,
            jobs_done=b.jobs_done,
            jobs_failed=b.jobs_failed,
            last_error=b.last_error,
            served={p: served[b.name][p] for p in PRIORITIES if served[b.name][p]},
        )
        for b in beats[:100]
    ]
    return sorted(rows, key=lambda w: (not w.alive, w.name))


# --- the last hour --------------------------------------------------------------


def _finished_since(since: datetime) -> list[tuple]:
    """(priority, status, worker, error_code, created, started, first audio, finished)
    of every job finished since `since`: an index range on finished_at."""
    return list(
        Job.objects.filter(finished_at__gte=since)
        .order_by()
        .values_list(
            "priority",
            "status",
            "worker",
            "error_code",
            "created_at",
            "started_at",
            "first_audio_at",
            "finished_at",
        )
    )


def _minutes(now: datetime, recent: Iterable[tuple]) -> list[Minute]:
    end = now.replace(second=0, microsecond=0)
    start = end - WINDOW + timedelta(minutes=1)
    counts: dict[datetime, Counter[str]] = defaultdict(Counter)
    for _priority, status, *_, finished_at in recent:
        minute = finished_at.replace(second=0, microsecond=0)
        if minute >= start:
            counts[minute][status] += 1
    out = []
    for i in range(int(WINDOW.total_seconds() // 60)):
        at = start + timedelta(minutes=i)
        c = counts.get(at, Counter())
        out.append(Minute(at, c["succeeded"], c["failed"], c["cancelled"]))
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (what `percentile_disc` gives): an observed value."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _span(a: datetime | None, b: datetime | None) -> float | None:
    return (b - a).total_seconds() if a and b else None


def _latency(recent: Iterable[tuple]) -> list[Latency]:
    """Timings as the API reports them (queue wait: submitted → started; first
    audio: started → first chunk; total: submitted → finished), of jobs that
    succeeded in the window."""
    spans: dict[str, dict[str, list[float]]] = {
        p: {"queue_wait": [], "first_audio": [], "total": []} for p in PRIORITIES
    }
    for priority, status, _w, _c, created, started, first_audio, finished in recent:
        if status != JobStatus.SUCCEEDED or priority not in spans:
            continue
        for name, value in (
            ("queue_wait", _span(created, started)),
            ("first_audio", _span(started, first_audio)),
            ("total", _span(created, finished)),
        ):
            if value is not None:
                spans[priority][name].append(value)

    def p50_p95(values: list[float]) -> tuple[float | None, float | None]:
        return percentile(values, 0.50), percentile(values, 0.95)

    return [
        Latency(
            priority=p,
            jobs=len(s["total"]),
            queue_wait=p50_p95(s["queue_wait"]),
            first_audio=p50_p95(s["first_audio"]),
            total=p50_p95(s["total"]),
        )
        for p, s in spans.items()
    ]


def jobs_admin_url(**filters: str) -> str:
    return f"{reverse('admin:synthesis_job_changelist')}?{urlencode(filters)}"


def _failures(since: datetime, recent: Iterable[tuple]) -> list[FailureRow]:
    codes = Counter(code or "(none)" for _, status, _, code, *_ in recent if status == "failed")
    return [
        FailureRow(
            code=code,
            jobs=n,
            url=jobs_admin_url(
                status__exact=JobStatus.FAILED,
                error_code__exact="" if code == "(none)" else code,
                finished_at__gte=since.isoformat(timespec="seconds"),
            ),
        )
        for code, n in codes.most_common()
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
