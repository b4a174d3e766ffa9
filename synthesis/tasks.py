"""Celery tasks: interfaces only. Pass ids, call a service, return something small."""

from __future__ import annotations

import contextlib
from typing import Any

from celery import Task, shared_task

# Registers how a claimed realtime session runs (with `job_execute`).
import synthesis.realtime.execution  # noqa: F401
from chorus.errors import StorageError
from chorus.logs import log_scope, task_log_context
from chorus.task_publish import publish_task
from synthesis.drain import is_draining, record_sent_back
from synthesis.longform.join import longform_join
from synthesis.longform.lifecycle import JOIN_QUEUE, longform_fail
from synthesis.longform.submit import longform_split_rest
from synthesis.prestart import Prestart
from synthesis.publishers import send_longform_join, send_longform_split, send_synthesis
from synthesis.services.dispatch import BEFORE_COMMIT_HEADER, retry_delay, sent_before_commit
from synthesis.services.execution import MAX_ATTEMPTS, job_execute, submit_wait
from synthesis.services.recovery import job_send_back
from synthesis.worker import (
    process_engine,
    process_heartbeat,
    prompt_cache,
    stop_worker,
    worker_name,
)


@shared_task(name="synthesis.synthesize_job", bind=True)
def synthesize_job_task(
    self: Task, job_id: str, epoch: int | None = None, request_id: str = ""
) -> dict[str, Any]:
    # Every log line of this job's run carries these (and the tenant and attempt
    # once claimed): the request id ties them to the submit's line.
    fields = {"job_id": job_id, "worker": worker_name()}
    with log_scope(**fields, **({"request_id": request_id} if request_id else {})):
        request = self.request.__dict__
        return _synthesize(
            job_id=job_id,
            epoch=epoch,
            prestart=Prestart.from_request(request),
            before_commit=sent_before_commit(request),
        )


def _synthesize(
    *, job_id: str, epoch: int | None, prestart: Prestart | None, before_commit: int | None
) -> dict[str, Any]:
    if is_draining():
        # Taken in the moment between a SIGTERM and the consumer's stop: not
        # started here, but sent again at once for a worker that stays (once
        # the row is committed, when the message came before it).
        if before_commit is not None:
            submit_wait(before_commit)
        sent = job_send_back(job_id=job_id, epoch=epoch)
        record_sent_back(sent)
        return {"job_id": job_id, "status": "sent_back" if sent else "skipped"}
    try:
        engine = process_engine()
    except Exception:
        # This worker cannot synthesize; another one can. Leaving without an ack
        # puts the message back on its queue (reject on worker lost).
        stop_worker()
    heartbeat = process_heartbeat()
    with heartbeat.working() if heartbeat else contextlib.nullcontext():
        result = job_execute(
            job_id=job_id,
            engine=engine,
            worker=worker_name(),
            prompts=prompt_cache,
            epoch=epoch,
            prestart=prestart,
            before_commit=before_commit,
        )
    if heartbeat is not None:
        heartbeat.record(status=result["status"], error=result.get("code", ""))
    return result


@shared_task(name="synthesis.join_longform", bind=True, max_retries=MAX_ATTEMPTS)
def join_longform_task(self: Any, job_id: str) -> dict[str, Any]:
    # A CPU task (the `light` queue): no engine, any worker with storage access.
    with log_scope(job_id=job_id, worker=worker_name()):
        try:
            return longform_join(parent_id=job_id)
        except StorageError as exc:  # the store may be back in a moment
            if self.request.retries < MAX_ATTEMPTS:
                raise self.retry(exc=exc, countdown=retry_delay(self.request.retries + 1)) from exc
            longform_fail(parent_id=job_id, code=exc.code, message=exc.message)
            return {"job_id": job_id, "status": "failed", "code": exc.code}


@shared_task(name="synthesis.split_longform")
def split_longform_task(job_id: str, after: int, max_chars: int) -> dict[str, Any]:
    # A CPU task (the `light` queue): the text after segment 0, split and admitted.
    with log_scope(job_id=job_id, worker=worker_name()):
        return {
            "job_id": job_id,
            "segments": 1 + longform_split_rest(parent_id=job_id, after=after, max_chars=max_chars),
        }


# The senders the services call (`synthesis.publishers`): they never import this module.
_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2}
# A send made before its job's commit is tried once: after a failure the job is
# published again after the commit, under a new epoch (`dispatch.job_publish_sent`).
_SEND_ONCE = {"max_retries": 0}


def _send_synthesis(
    job_id: str, epoch: int, priority: str, countdown: float, headers: dict[str, Any]
) -> None:
    # On the path to a stream's first audio: `apply_async`'s message, made with
    # less Python (`chorus.task_publish`).
    publish_task(
        synthesize_job_task,
        args=(job_id, epoch),
        kwargs=task_log_context(),
        queue=f"synth.{priority}",
        countdown=countdown,
        retry_policy=_SEND_ONCE if BEFORE_COMMIT_HEADER in headers else _PUBLISH_RETRY,
        headers=headers,
    )


def _send_split(parent_id: str, after: int, max_chars: int) -> None:
    split_longform_task.apply_async(
        args=(parent_id, after, max_chars),
        queue=JOIN_QUEUE,
        retry=True,
        retry_policy=_PUBLISH_RETRY,
    )


def _send_join(parent_id: str) -> None:
    join_longform_task.apply_async(args=(parent_id,), queue=JOIN_QUEUE)


send_synthesis.register(_send_synthesis)
send_longform_split.register(_send_split)
send_longform_join.register(_send_join)
