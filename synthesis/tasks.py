"""Celery tasks: interfaces only. Pass ids, call a service, return something small."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from synthesis.services.execution import job_execute
from synthesis.worker import process_engine, worker_name


@shared_task(name="synthesis.synthesize_job")
def synthesize_job_task(job_id: str) -> dict[str, Any]:
    return job_execute(job_id=job_id, engine=process_engine(), worker=worker_name())
