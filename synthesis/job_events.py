"""A job's state changes, as the services make them: one JSON log line each
(job id, tenant, priority, status, code, attempt, worker, and the request id
when the change happens inside a request or a task that carries one) and the
matching metrics (`chorus.metrics`). Services call one function per change.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.utils import timezone

from chorus import metrics
from chorus.logs import log_bind
from synthesis import signals
from synthesis.models import Job

log = logging.getLogger("chorus.jobs")


def _line(job: Job, status: str, *, code: str = "", **fields: Any) -> None:
    log.info(
        "job %s %s%s",
        job.id,
        status,
        f" ({code})" if code else "",
        extra={
            "event": "job",
            "job_id": str(job.id),
            "tenant_id": job.tenant_id,
            "priority": job.priority,
            "status": status,
            "code": code,
            **fields,
        },
    )


def _since_submit(job: Job, at: datetime | None = None) -> float:
    return ((at or timezone.now()) - job.created_at).total_seconds()


def job_admitted(*, job: Job) -> None:
    log_bind(job_id=str(job.id))  # the request's own line carries the job too
    metrics.observe_job_admitted(priority=job.priority)
    _line(job, job.status)


def job_started(*, job: Job, attempt: int) -> None:
    log_bind(job_id=str(job.id), tenant_id=job.tenant_id, attempt=attempt)
    metrics.observe_job_started(
        priority=job.priority, attempt=attempt, waited_s=_since_submit(job, job.started_at)
    )
    _line(job, "running", attempt=attempt, worker=job.worker)


def job_first_audio(*, job: Job, at: datetime) -> None:
    metrics.observe_first_audio(priority=job.priority, seconds=_since_submit(job, at))


def job_finished(
    *,
    job: Job,
    status: str,
    code: str = "",
    attempt: int | None = None,
    at: datetime | None = None,
) -> None:
    """`at`: the end as written on the row (the database's time, from a worker);
    this host's time when not given."""
    total = _since_submit(job, at)
    metrics.observe_job_finished(priority=job.priority, status=status, code=code, total_s=total)
    extra: dict[str, Any] = {"total_s": round(total, 3)}
    if attempt is not None:
        extra["attempt"] = attempt
    if job.worker:
        extra["worker"] = job.worker
    _line(job, status, code=code, **extra)
    # Robust: a receiver's failure (another app's) must not undo or fail the
    # finishing path that called this; it is logged.
    for receiver, answer in signals.job_finished.send_robust(sender=Job, job=job, status=status):
        if isinstance(answer, Exception):
            log.error("job_finished receiver %r failed", receiver, exc_info=answer)


def job_finished_by_id(*, job_id: uuid.UUID | str, status: str, code: str) -> None:
    fields = ("id", "tenant_id", "priority", "created_at", "finished_at", "worker", "attempts")
    job = Job.objects.filter(pk=job_id).only(*fields, "parent_id")
    for found in job:
        job_finished(
            job=found, status=status, code=code, attempt=found.attempts, at=found.finished_at
        )


def job_requeued(*, job: Job, reason: str, attempt: int | None = None) -> None:
    metrics.observe_job_requeued(priority=job.priority, reason=reason)
    extra: dict[str, Any] = {"attempt": attempt} if attempt else {}
    _line(job, "queued", reason=reason, **extra)


def jobs_released(*, jobs: list[Job]) -> None:
    """Pending jobs that fair admission let into the broker."""
    for job in jobs:
        _line(job, "queued", reason="released")
