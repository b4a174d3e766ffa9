"""Celery tasks of batches: interfaces only."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from batches.archive import batch_archive_build


# Routed to the light queue (`CELERY_TASK_ROUTES`): building an archive needs no engine.
@shared_task(name="batches.build_archive")
def build_archive_task(batch_id: str) -> dict[str, Any]:
    return {"batch_id": batch_id, "status": batch_archive_build(batch_id=batch_id)}
