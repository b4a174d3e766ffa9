"""What the webhooks app does when the layers below it signal: every job or
batch ending may be an event, and each sweeper pass publishes due retries."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from batches.signals import batch_completed
from synthesis.signals import job_finished, sweep_finished
from webhooks.events import batch_event_publish, job_event_publish
from webhooks.services.deliveries import deliveries_publish_due, events_forget


@receiver(job_finished)
def _job_event(*, job: Any, status: str, **kwargs: Any) -> None:
    if job.is_segment:  # a part of a long text: its job's own ending is the event
        return
    job_event_publish(job_id=job.pk, tenant_id=job.tenant_id, status=status)


@receiver(batch_completed)
def _batch_event(*, batch: Any, status: str, **kwargs: Any) -> None:
    batch_event_publish(batch=batch, status=status)


@receiver(sweep_finished)
def _sweep_deliveries(*, report: Any, **kwargs: Any) -> None:
    report.webhooks_published = deliveries_publish_due()
    report.webhooks_forgotten = events_forget()
