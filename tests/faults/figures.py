"""What every fault test asserts and prints: no job lost, none charged twice, none
stuck past the bound, in one line of figures.

- lost: a job not finished (still pending, queued or running) when the bound is up;
- double-charged: a job whose ledger is not one reservation and one settlement
  matching its end (a commit if it succeeded, a refund otherwise), or a tenant
  whose committed characters are not those of its succeeded jobs;
- stall: from the moment the fault ended (an outage when the service is back, a
  kill when it happens) or the job was submitted, if later, to the job's end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q, Sum

from quotas.models import LedgerEntry, LedgerKind
from quotas.services import ledger_total
from synthesis.models import FINISHED, Job, JobStatus
from tenants.models import Tenant


@dataclass(frozen=True)
class Outcome:
    jobs: int
    lost: int
    double_charged: int
    longest_stall_s: float
    statuses: dict[str, int]

    def line(self, name: str, client_saw: str) -> str:
        return (
            f"FAULT {name}: jobs {self.jobs}, lost {self.lost}, "
            f"double-charged {self.double_charged}, "
            f"longest stall {self.longest_stall_s:.1f} s, client saw {client_saw}"
        )


def wait_until_finished(job_ids: Iterable[uuid.UUID | str], *, bound_s: float) -> None:
    """Return once every job has ended, or when `bound_s` is up (the check that
    follows counts what is still in flight as lost)."""
    ids = list(job_ids)
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not Job.objects.filter(pk__in=ids).exclude(status__in=FINISHED).exists():
            return
        time.sleep(0.1)


def outcome(
    *, tenant: Tenant, job_ids: Iterable[uuid.UUID | str], repaired_at: datetime
) -> Outcome:
    ids = list(job_ids)
    jobs = list(Job.objects.filter(pk__in=ids))
    lost = len(ids) - len(jobs) + sum(job.status not in FINISHED for job in jobs)
    ledger = {
        row["job_id"]: row
        for row in LedgerEntry.objects.filter(job_id__in=ids)
        .values("job_id")
        .annotate(
            reserves=Count("id", filter=Q(kind=LedgerKind.RESERVE)),
            commits=Count("id", filter=Q(kind=LedgerKind.COMMIT)),
            refunds=Count("id", filter=Q(kind=LedgerKind.REFUND)),
        )
    }
    double_charged = 0
    for job in jobs:
        if job.status not in FINISHED:
            continue  # counted as lost
        row = ledger.get(job.pk, {"reserves": 0, "commits": 0, "refunds": 0})
        expected = (1, 1, 0) if job.status == JobStatus.SUCCEEDED else (1, 0, 1)
        double_charged += (row["reserves"], row["commits"], row["refunds"]) != expected
    succeeded = Job.objects.filter(tenant=tenant, status=JobStatus.SUCCEEDED)
    charged = succeeded.aggregate(n=Sum("characters"))["n"] or 0
    if ledger_total(tenant=tenant, kind=LedgerKind.COMMIT) != charged:
        double_charged = max(double_charged, 1)
    stalls = [
        (job.finished_at - max(job.created_at, repaired_at)).total_seconds()
        for job in jobs
        if job.finished_at is not None
    ]
    statuses: dict[str, int] = {}
    for job in jobs:
        statuses[job.status] = statuses.get(job.status, 0) + 1
    return Outcome(
        jobs=len(ids),
        lost=lost,
        double_charged=double_charged,
        longest_stall_s=max([0.0, *stalls]),
        statuses=statuses,
    )
