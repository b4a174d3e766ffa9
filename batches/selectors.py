"""Reads, scoped to one tenant: another tenant's batches do not exist."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet

from batches.models import Batch, BatchItem
from chorus.errors import NotFound
from synthesis.models import JobStatus
from tenants.models import Tenant


def batch_list(*, tenant: Tenant) -> QuerySet[Batch]:
    return Batch.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def batch_get(*, tenant: Tenant, batch_id: uuid.UUID | str) -> Batch:
    try:
        return Batch.objects.select_related("tenant__plan").get(tenant=tenant, pk=batch_id)
    except (Batch.DoesNotExist, ValueError, ValidationError):
        raise NotFound("No batch with this id.", details={"batch_id": str(batch_id)}) from None


def batch_counts(*, batches: Iterable[Batch]) -> dict[uuid.UUID, dict[str, int]]:
    """Items per job status of each batch, for a page of batches in one query."""
    ids = [batch.pk for batch in batches]
    counts: dict[uuid.UUID, dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(JobStatus.values, 0)
    )
    rows = (
        BatchItem.objects.filter(batch_id__in=ids)
        .order_by()
        .values_list("batch_id", "job__status")
        .annotate(n=Count("id"))
    )
    for batch_id, status, n in rows:
        counts[batch_id][status] = n
    return {batch_id: counts[batch_id] for batch_id in ids}


def batch_items(*, batch: Batch, after: int, limit: int) -> list[BatchItem]:
    """Items in submitted order, from the one after index `after` (-1: the first)."""
    return list(
        BatchItem.objects.filter(batch=batch, index__gt=after)
        .select_related("job__tenant__plan")
        .order_by("index")[:limit]
    )
