"""Opening a realtime session and charging its text as it arrives (web tier).

A session is admitted as any job is (the tenant's lock, its line, its month's
characters, its jobs at once), and also against the plan's realtime sessions at
once. It starts with nothing reserved: each append reserves its characters
before it reaches the worker (`session_reserve`), a little ahead so that an
agent's many small appends need few writes; the worker charges what it sent to
the engine and releases the rest when the session ends.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.conf import settings

from chorus.errors import ChorusError, InstructionNotSupported, VoiceRequired
from chorus.redis_client import get_redis
from quotas.limits import limits_check_priority
from quotas.plans import Limits, RealtimeLimits, tenant_limits, tenant_realtime_limits
from quotas.services import quota_reserve_more
from synthesis.audio_out import check_output
from synthesis.engines import engine_class
from synthesis.models import Job, JobStatus, Voice
from synthesis.realtime.channel import Gone, SessionConfig, Start, input_key, send
from synthesis.services.jobs import JobUnconfirmed, QueueUnavailable, job_admit, voice_for
from tenants.models import ApiKey

# A session is one task on its worker: it must end within the task's time limit
# (past it, and the sweeper's grace, a running job counts as stuck and is taken
# from its worker), with time to store its audio and settle. Longer sessions
# need a longer CHORUS_TASK_TIME_LIMIT.
TASK_LIMIT_MARGIN_S = 60


def session_seconds(realtime: RealtimeLimits) -> float:
    """How long a session may last: its plan's longest, within the task limit."""
    return float(min(realtime.max_seconds, settings.TASK_TIME_LIMIT_S - TASK_LIMIT_MARGIN_S))


# Characters reserved beyond an append's own, where the month has them: an
# agent's appends are a few characters each, and each reservation is a write.
RESERVE_AHEAD = 200


class RealtimeNotAllowed(ChorusError):
    status = 403
    code = "realtime_not_allowed"


class TooManySessions(ChorusError):
    status = 429
    code = "too_many_sessions"


@dataclass(frozen=True)
class SessionRequest:
    voice_id: uuid.UUID | None
    format: str
    sample_rate: int | None
    priority: str | None  # None: high where the plan allows it, else normal
    language: str
    instruction: str
    context: str
    store: bool


@dataclass
class OpenSession:
    job: Job
    limits: Limits
    realtime: RealtimeLimits
    reserved: int = 0  # characters reserved so far
    sent: int = 0  # characters of text sent to the worker


def session_open(*, api_key: ApiKey, request: SessionRequest) -> OpenSession:
    """Admit the session and queue its job; its input stream holds its start."""
    tenant = api_key.tenant
    limits = tenant_limits(tenant)
    realtime = tenant_realtime_limits(tenant)
    if realtime.max_sessions == 0:
        raise RealtimeNotAllowed(
            "Your plan does not include realtime sessions.", details={"limit": 0}
        )
    priority = request.priority or ("high" if "high" in limits.allowed_priorities else "normal")
    limits_check_priority(limits=limits, priority=priority)
    sample_rate = check_output(request.format, request.sample_rate)
    voice = voice_for(tenant=tenant, voice_id=request.voice_id)
    _check_engine(voice=voice, instruction=request.instruction)
    client = get_redis()
    if client is None:
        raise QueueUnavailable("Realtime sessions need Redis; nothing was charged.")
    job_id = uuid.uuid4()
    config = SessionConfig(
        context=request.context,
        idle_timeout_s=float(realtime.idle_timeout_s),
        max_seconds=session_seconds(realtime),
        store=request.store,
    )
    # Before the job can reach a worker: its first read finds the start.
    send(client, job_id, Start(config))

    def room_for_one_more() -> None:
        open_now = Job.objects.filter(
            tenant=tenant,
            realtime=True,
            status__in=[JobStatus.PENDING, JobStatus.QUEUED, JobStatus.RUNNING],
        ).count()
        if open_now >= realtime.max_sessions:
            raise TooManySessions(
                f"You have {open_now} realtime sessions open; your plan allows "
                f"{realtime.max_sessions} at once. Close one first.",
                details={"limit": realtime.max_sessions, "value": open_now},
            )

    fields = dict(
        id=job_id,
        api_key=api_key,
        voice=voice,
        voice_name=voice.name if voice else "",
        text="",
        characters=0,  # its text is reserved as it arrives (`session_reserve`)
        priority=priority,
        format=request.format,
        requested_sample_rate=sample_rate,
        instruction=request.instruction,
        language=request.language,
        stream=True,
        realtime=True,
    )
    try:
        job = job_admit(tenant=tenant, limits=limits, fields=fields, under_lock=room_for_one_more)
    except JobUnconfirmed:
        # Committed and published, so a worker will read the start; the client,
        # told the session did not open, is not coming: the worker ends it at once.
        send(client, job_id, Gone())
        raise
    except BaseException:
        client.delete(input_key(job_id))  # refused: its start has nobody to read it
        raise
    return OpenSession(job=job, limits=limits, realtime=realtime)


def session_reserve(*, session: OpenSession, characters: int) -> None:
    """Reserve an append's characters (and some ahead) before it is sent."""
    needed = session.sent + characters - session.reserved
    if needed > 0:
        session.reserved += quota_reserve_more(
            tenant=session.job.tenant,
            limits=session.limits,
            job_id=session.job.pk,
            needed=needed,
            ahead=RESERVE_AHEAD,
        )
    session.sent += characters


def _check_engine(*, voice: Voice | None, instruction: str) -> None:
    """What the workers' engine would refuse, refused before anything is queued."""
    engine = engine_class(settings.ENGINE)
    if instruction.strip() and not engine.follows_instructions:
        raise InstructionNotSupported(
            f"The {settings.ENGINE} engine cannot follow an instruction; start the session "
            "without one.",
            details={"engine": settings.ENGINE, "field": "instruction"},
        )
    if settings.ENGINE == "cosyvoice2" and voice is None:
        raise VoiceRequired(
            "cosyvoice2 clones a voice: start the session with a voice_id.",
            details={"engine": settings.ENGINE},
        )
