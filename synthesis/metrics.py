"""`/metrics`: what the processes of this host counted (`chorus.metrics`), plus
what is read at scrape time: queue depth per priority from the broker, waiting
and running jobs from the database, and each worker's gauges from its heartbeat
row.

The web serves all of it at `/metrics`; the sweeper serves it on its metrics
port (`chorus.metrics_server`), so a deployment whose web hosts are not scraped
still has the line's gauges. They describe shared state: every instance that
serves them (two sweepers, several web hosts) reports the same values, so
queries take `max` across instances, never `sum`. Workers serve only their
host's counts.

Protected by a bearer token (`CHORUS_METRICS_TOKEN`); without one configured the
route does not exist (404). The database reads use the index on (status,
priority, created_at) and touch only jobs in flight, so a scrape stays cheap at
millions of finished jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Min
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from chorus.db_clock import db_now
from chorus.metrics_server import authorized, exposition
from chorus.redis_client import get_redis
from synthesis.calibration.models import WorkerLimits
from synthesis.heartbeat import worker_is_alive
from synthesis.models import IN_FLIGHT, WAITING, Job, WorkerHeartbeat

log = logging.getLogger(__name__)

PRIORITIES = ("high", "normal", "low")
# Workers not seen for this long drop out of the gauges (the admin keeps them).
WORKER_FORGET_AFTER = timedelta(minutes=10)


class BrokerCollector(Collector):
    """Messages waiting in each priority's queue, read from Redis now."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("chorus_broker_up", "1 when the broker answered this scrape.")
        depth = GaugeMetricFamily(
            "chorus_queue_depth",
            "Messages waiting in the broker's queue, by priority.",
            labels=["priority"],
        )
        client = get_redis()
        try:
            if client is None:
                raise ConnectionError("no broker configured")
            with client.pipeline(transaction=False) as pipe:
                for priority in PRIORITIES:
                    pipe.llen(f"synth.{priority}")
                lengths = pipe.execute()
        except Exception as exc:
            log.warning("metrics: broker unreachable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        for priority, length in zip(PRIORITIES, lengths, strict=True):
            depth.add_metric([priority], length)
        yield up
        yield depth


class DatabaseCollector(Collector):
    """Jobs in flight and workers, read from the database now."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("chorus_database_up", "1 when the database answered this scrape.")
        try:
            families = [*self._jobs(), *self._workers()]
        except Exception as exc:
            log.warning("metrics: database unreachable: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _jobs(self) -> list[Metric]:
        in_flight = GaugeMetricFamily(
            "chorus_jobs_in_flight",
            "Jobs pending (held back by fair admission), queued or running, by priority.",
            labels=["priority", "status"],
        )
        counts = {(p, s): 0 for p in PRIORITIES for s in IN_FLIGHT}
        rows = (
            Job.objects.filter(status__in=IN_FLIGHT)
            .order_by()
            .values_list("priority", "status")
            .annotate(n=Count("pk"))
        )
        for priority, status, n in rows:
            counts[(priority, status)] = n
        for (priority, status), n in counts.items():
            in_flight.add_metric([priority, status], n)
        oldest = GaugeMetricFamily(
            "chorus_oldest_waiting_job_age_seconds",
            "Age of the oldest job still waiting to start (0 when none), by priority.",
            labels=["priority"],
        )
        firsts = dict(
            Job.objects.filter(status__in=WAITING)
            .order_by()
            .values_list("priority")
            .annotate(first=Min("created_at"))
        )
        now = db_now()  # not this host's clock: the one the waits are measured on
        for priority in PRIORITIES:
            first = firsts.get(priority)
            oldest.add_metric([priority], max(0.0, (now - first).total_seconds()) if first else 0.0)
        return [in_flight, oldest]

    def _workers(self) -> list[Metric]:
        now = timezone.now()
        labels = ["worker"]
        up = GaugeMetricFamily(
            "chorus_worker_up", "1 while the worker's heartbeat is fresh.", labels=labels
        )
        info = GaugeMetricFamily(
            "chorus_worker_info",
            "The worker's engine and device (value 1).",
            labels=["worker", "engine", "device"],
        )
        running = GaugeMetricFamily(
            "chorus_worker_streams_running", "Jobs the worker runs now.", labels=labels
        )
        capacity = GaugeMetricFamily(
            "chorus_worker_streams_capacity", "Jobs the worker may run at once.", labels=labels
        )
        memory = GaugeMetricFamily(
            "chorus_worker_engine_memory_bytes",
            "Memory the worker's engine holds (device memory on a GPU).",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "chorus_worker_heartbeat_age_seconds",
            "Seconds since the worker's last heartbeat.",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "chorus_worker_stream_limit",
            "Streams below which the worker starts a job of this priority, with where the "
            "limits came from (source: calibrated, stored, profile, by hand, engine).",
            labels=["worker", "priority", "source", "profile"],
        )
        beats = list(WorkerHeartbeat.objects.filter(seen_at__gte=now - WORKER_FORGET_AFTER))
        chosen = {
            row.worker: row
            for row in WorkerLimits.objects.filter(worker__in=[beat.name for beat in beats])
        }
        for name, row in chosen.items():
            for priority in PRIORITIES:
                limit.add_metric(
                    [name, priority, row.source, row.profile_name], getattr(row, priority)
                )
        for beat in beats:
            alive = worker_is_alive(beat.seen_at, now)
            up.add_metric([beat.name], int(alive))
            info.add_metric([beat.name, beat.engine, beat.device], 1)
            running.add_metric([beat.name], beat.slots_busy if alive else 0)
            capacity.add_metric([beat.name], beat.slots)
            memory.add_metric([beat.name], beat.memory_bytes)
            age.add_metric([beat.name], (now - beat.seen_at).total_seconds())
        return [up, info, running, capacity, memory, age, limit]


def live_collectors() -> list[Collector]:
    """What is read at scrape time from state every process shares (the broker,
    the database): served by the web and the sweeper, not by every worker."""
    return [BrokerCollector(), DatabaseCollector()]


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not settings.METRICS_TOKEN:
        raise Http404("Metrics are not enabled (CHORUS_METRICS_TOKEN).")
    if not authorized(request.headers.get("Authorization", "")):
        response = HttpResponse("Unauthorized: send Authorization: Bearer <token>\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(exposition(live_collectors()), content_type=CONTENT_TYPE_LATEST)
