"""A session whose engine breaks in a way nobody planned for (not an engine
error it reports) fails with `internal_error`, told to its client, and charges
nothing: real PostgreSQL and Redis, the session run in this process."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from quotas.models import UsagePeriod
from synthesis.engines.base import PreparedVoice, Samples
from synthesis.engines.synthetic import SyntheticEngine
from synthesis.models import Job, JobStatus
from synthesis.realtime.channel import Append, Close, Gone, Start, decode_input, input_key, send
from synthesis.realtime.execution import session_execute
from synthesis.realtime.sessions import session_open, session_reserve
from synthesis.services import jobs
from synthesis.services.execution import job_claim
from synthesis.stream_protocol import Failed, decode
from synthesis.streaming import stream_key
from synthesis.voice_cache import VoicePromptCache
from tests.conftest import Persona
from tests.quotas.test_realtime_charging import REQUEST  # a pcm session on the default voice
from tests.test_disk_wait import wait_cut_short

pytestmark = pytest.mark.django_db(transaction=True)


class BrokenEngine(SyntheticEngine):
    """Breaks at its first text, as a bug would (not an EngineError)."""

    def synthesize_text_stream(
        self, *, texts: Iterator[str], voice: PreparedVoice | None, instruction: str = ""
    ) -> Generator[Samples, None, None]:
        next(texts)
        raise RuntimeError("a bug in the engine")
        yield  # a generator, as the real ones are


def test_an_unplanned_failure_fails_the_session_tells_its_client_and_charges_nothing(
    alice: Persona, broker: Any
) -> None:
    session = session_open(api_key=alice.api_key, request=REQUEST)
    text = "Nobody expected this."
    session_reserve(session=session, characters=len(text))
    send(broker, session.job.pk, Append(context="default", text=text))
    send(broker, session.job.pk, Close())
    claim = job_claim(job_id=session.job.pk, worker="test")
    assert claim is not None
    engine = BrokenEngine(state_dir=tempfile.mkdtemp(), device="broken")
    engine.load()
    try:
        result = session_execute(claim=claim, engine=engine, prompts=VoicePromptCache(1))
    finally:
        engine.close()

    assert result["code"] == "internal_error"
    job = Job.objects.get(pk=session.job.pk)
    assert (job.status, job.error_code) == (JobStatus.FAILED, "internal_error")
    events = [decode(fields) for _, fields in broker.xrange(stream_key(job.pk))]
    assert isinstance(events[-1], Failed)
    assert events[-1].code == "internal_error"
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (0, 0)


def test_a_session_whose_job_is_unconfirmed_is_ended_by_its_worker_at_once(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database failed while the session's job waited for the disk
    (`chorus.disk_wait`): the job was committed and published, the client was
    told it did not open, so its worker finds the client gone and ends it."""
    monkeypatch.setattr(jobs, "wait_for_disk", wait_cut_short)

    with pytest.raises(jobs.JobUnconfirmed):
        session_open(api_key=alice.api_key, request=REQUEST)

    job = Job.objects.get(tenant=alice.tenant)
    items = [decode_input(fields) for _, fields in broker.xrange(input_key(job.pk))]
    assert [type(item) for item in items] == [Start, Gone]
    claim = job_claim(job_id=job.pk, worker="test")
    assert claim is not None
    engine = SyntheticEngine(state_dir=tempfile.mkdtemp(), device="unconfirmed")
    engine.load()
    try:
        started = time.monotonic()
        session_execute(claim=claim, engine=engine, prompts=VoicePromptCache(1))
        assert time.monotonic() - started < 5  # not its idle timeout
    finally:
        engine.close()
    job.refresh_from_db()
    assert job.status not in (JobStatus.QUEUED, JobStatus.RUNNING)
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert (period.characters_used, period.characters_reserved) == (0, 0)
