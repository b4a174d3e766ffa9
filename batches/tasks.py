"""Celery tasks of batches: interfaces only."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from batches.archive import batch_archive_build

# The CPU workers' queue: building an archive needs no engine.
LIGHT_QUEUE = "light"


@shared_task(name="batches.build_archive")
def build_archive_task(batch_id: str) -> dict[str, Any]:
    return {"batch_id": batch_id, "status": batch_archive_build(batch_id=batch_id)}
