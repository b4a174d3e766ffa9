"""A realtime session on its worker, once claimed: its voice prepared, the
session run (`synthesis.realtime.runner`), its audio stored if asked, the job
succeeded and charged for what was spoken, together.

`synthesis.services.execution` runs every job's claim and hands a realtime one
here (`register_session_run`, below): this module is built on its steps.
"""

from __future__ import annotations

import logging
from typing import Any

from chorus.errors import ChorusError
from chorus.redis_client import get_redis
from synthesis.audio_out import check_output, encode_output
from synthesis.engines.base import Engine
from synthesis.job_events import job_finished
from synthesis.lanes import realtime_sessions
from synthesis.models import Job, JobStatus
from synthesis.realtime.runner import (
    CLIENT_GONE,
    NOT_OWNED,
    EventSink,
    Liveness,
    SessionInputLost,
    SessionResult,
    session_run,
)
from synthesis.services.execution import (
    Claim,
    job_fail,
    owned_rows,
    prepare_voice,
    register_session_run,
    store_output,
    succeed,
    through_outage,
    why_stopped,
)
from synthesis.voice_cache import VoicePromptCache

log = logging.getLogger(__name__)


def session_execute(*, claim: Claim, engine: Engine, prompts: VoicePromptCache) -> dict[str, Any]:
    """Run a realtime session (`synthesis.realtime.runner`): its text comes while
    it runs. A session is not run again after its worker died: its client was
    told (`worker_lost`) and starts a new one, so a second attempt only ends it."""
    job = claim.job
    client = get_redis()
    if client is None or claim.attempt > 1:
        message = "The worker running this session stopped; start a new session."
        job_fail(claim=claim, code="worker_lost", message=message)
        return {"job_id": str(job.id), "status": "failed", "code": "worker_lost"}
    # Its client's web tier watches the session's liveness until its end is out.
    with Liveness(client=client, job_id=job.id):
        return _session_execute(claim=claim, engine=engine, prompts=prompts, client=client)


def _session_execute(
    *, claim: Claim, engine: Engine, prompts: VoicePromptCache, client: Any
) -> dict[str, Any]:
    job = claim.job

    def fail(code: str, message: str) -> dict[str, Any]:
        """The job failed and its client told why (not `worker_lost`)."""
        if job_fail(claim=claim, code=code, message=message):
            sink = EventSink(client=client, job_id=job.id, attempt=claim.attempt, engine=engine)
            sink.fail(code=code, message=message)
        return {"job_id": str(job.id), "status": "failed", "code": code}

    try:
        voice = prepare_voice(claim=claim, engine=engine, prompts=prompts)
        # While it runs, its card takes no more streams than it keeps up with
        # in real time (`synthesis.lanes`).
        with realtime_sessions.running():
            result, sink = session_run(
                job_id=job.id,
                attempt=claim.attempt,
                engine=engine,
                voice=voice,
                instruction=job.instruction,
                sample_rate=check_output(job.format, job.requested_sample_rate),
                client=client,
                owned=lambda: bool(through_outage(owned_rows(claim).exists)),
            )
    except SessionInputLost as exc:
        return fail("session_lost", f"The session ended: {exc}.")
    except ChorusError as exc:
        return fail(exc.code, exc.message)
    except Exception:
        log.exception("session %s failed", job.id)
        return fail(
            "internal_error",
            "The session failed because of an internal error; nothing was charged. Start a "
            "new session; if it keeps failing, contact the operator.",
        )
    if result.ending == NOT_OWNED:  # cancelled through the API, which told its client
        return {"job_id": str(job.id), "status": through_outage(lambda: why_stopped(job))}
    values: dict[str, Any] = {
        "engine": engine.name,
        "text": result.text,
        "characters": result.characters,
        "sample_rate": result.sample_rate,
        "duration_s": round(result.audio_samples / result.sample_rate, 3),
    }
    if result.samples is not None:  # "store": the session's audio as the job's file
        values.update(_store_session(job=job, engine=engine, result=result))
    finished_at = through_outage(lambda: succeed(claim, spoken=result.characters, **values))
    if finished_at is None:
        return {"job_id": str(job.id), "status": through_outage(lambda: why_stopped(job))}
    job.finished_at = finished_at
    sink.finish(result.ending if result.ending != CLIENT_GONE else "")
    job_finished(job=job, status=JobStatus.SUCCEEDED, attempt=claim.attempt, at=finished_at)
    return {"job_id": str(job.id), "status": "succeeded"}


def _store_session(*, job: Job, engine: Engine, result: SessionResult) -> dict[str, Any]:
    """The session's audio stored as its file (the stored file's usual treatment:
    fades, peak, provenance), and the job's columns that say so."""
    assert result.samples is not None
    audio = encode_output(
        result.samples, result.sample_rate, format=job.format, sample_rate=result.sample_rate
    )
    key, signed = store_output(job=job, engine=engine.name, audio=audio)
    return {"output_key": key, "output_bytes": len(signed.data), "provenance": signed.mode}


register_session_run(session_execute)
