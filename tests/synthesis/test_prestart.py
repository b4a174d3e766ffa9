"""A job's engine started from its first message while the claim is on its way
(`synthesis.prestart`): used only when the claimed row asks for exactly that,
closed otherwise; the real synthetic engine, PostgreSQL and Redis."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import redis
import soundfile as sf

from chorus.errors import EngineOutOfMemory
from synthesis import prestart
from synthesis.engines.base import Engine, PreparedVoice, Samples
from synthesis.models import Job, JobStatus, Voice
from synthesis.prestart import HEADER, Prestart
from synthesis.services import execution
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.services.voices import voice_create
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage
from synthesis.voice_cache import VoicePromptCache
from tests.audio_files import audio_file
from tests.conftest import Persona
from tests.fake_engines import WrappedEngine

pytestmark = pytest.mark.django_db

TEXT = "Hello there, from the first message."


@dataclass
class Call:
    text: str
    thread: str
    others_open: int  # this engine's other streams not yet let go when this one began
    chunks: int = 0
    closed: bool = False  # ended before its last chunk, or after it: either way let go


class RecordingEngine(WrappedEngine):
    """The real synthetic engine, noting each stream it makes: for which text, on
    which thread, how many chunks went out, and whether it was let go."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.calls: list[Call] = []
        self.first_chunk_made = threading.Event()

    def synthesize(
        self, *, text: str, voice: PreparedVoice | None, speed: float = 1.0, instruction: str = ""
    ) -> Iterator[Samples]:
        others_open = sum(1 for earlier in self.calls if not earlier.closed)
        call = Call(text=text, thread=threading.current_thread().name, others_open=others_open)
        self.calls.append(call)
        stream = self.inner.synthesize(text=text, voice=voice, speed=speed, instruction=instruction)
        return self._noted(call, stream)

    def _noted(self, call: Call, stream: Iterator[Samples]) -> Iterator[Samples]:
        try:
            for chunk in stream:
                call.chunks += 1
                self.first_chunk_made.set()
                yield chunk
        finally:
            call.closed = True


@pytest.fixture
def recording(engine: Engine) -> RecordingEngine:
    return RecordingEngine(engine)


def submit(persona: Persona, text: str = TEXT, voice: Voice | None = None) -> Job:
    speech = SpeechRequest(text=text, voice_id=voice.id if voice else None)
    return job_create(tenant=persona.tenant, api_key=None, speech=speech)


def as_sent(job: Job) -> Prestart:
    prestart = Prestart.of_job(job)
    assert prestart is not None
    return prestart


def claim_waits_for_first_chunk(
    monkeypatch: pytest.MonkeyPatch, recording: RecordingEngine
) -> list[bool]:
    """The claim held until the engine has made a first chunk (at most 5 s): the
    list says, per claim, whether that happened before the claim went out."""
    made_before: list[bool] = []
    real_claim = execution.job_claim

    def claim(**kwargs: Any) -> Any:
        made_before.append(recording.first_chunk_made.wait(timeout=5))
        return real_claim(**kwargs)

    monkeypatch.setattr(execution, "job_claim", claim)
    return made_before


def test_the_engine_makes_the_first_chunk_while_the_claim_is_on_its_way(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis, monkeypatch: Any
) -> None:
    job = submit(alice)
    made_before = claim_waits_for_first_chunk(monkeypatch, recording)

    result = job_execute(
        job_id=job.id, engine=recording, worker="w", epoch=job.epoch, prestart=as_sent(job)
    )

    assert result["status"] == "succeeded"
    assert made_before == [True]
    [call] = recording.calls  # one stream, the early one, carried on to the end
    assert call.text == TEXT
    assert call.thread.startswith("first-chunk")
    assert call.closed
    assert call.chunks >= 1
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED


def test_the_engines_thread_has_the_stream_before_the_claim_goes_out(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis, monkeypatch: Any
) -> None:
    # The claim has the first chunk's time to spare; the engine's start has
    # none, so it is not left to take turns with the claim. A generous wait,
    # and threads that give way only where they block: neither a slow host nor
    # the scheduler's timing decides this.
    monkeypatch.setattr(prestart, "_START_WAIT_S", 10)
    # Two jobs: the second's early start goes to a thread that waits idle for
    # work, as a worker's usually does (a new thread runs first as it starts).
    jobs = [submit(alice), submit(alice, "And a second one.")]
    streams_at_claim: list[int] = []
    real_claim = execution.job_claim

    def claim(**kwargs: Any) -> Any:
        streams_at_claim.append(len(recording.calls))
        return real_claim(**kwargs)

    monkeypatch.setattr(execution, "job_claim", claim)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        results = [
            job_execute(
                job_id=job.id, engine=recording, worker="w", epoch=job.epoch, prestart=as_sent(job)
            )
            for job in jobs
        ]
    finally:
        sys.setswitchinterval(switch_interval)

    assert [result["status"] for result in results] == ["succeeded", "succeeded"]
    assert streams_at_claim == [1, 2]


def test_an_engine_that_refuses_a_stream_at_once_holds_the_claim_no_longer(
    alice: Persona, engine: Engine, broker: redis.Redis, monkeypatch: Any
) -> None:
    monkeypatch.setattr(prestart, "_START_WAIT_S", 10)
    job = submit(alice)

    def refusing(**_: Any) -> Iterator[Samples]:
        raise EngineOutOfMemory("The device has no memory left for this stream.")

    broken = RecordingEngine(engine)
    broken.synthesize = refusing  # type: ignore[method-assign]
    started = time.monotonic()

    result = job_execute(job_id=job.id, engine=broken, worker="w", prestart=as_sent(job))

    assert time.monotonic() - started < 5  # not the start's wait of 10 s
    assert (result["status"], result["code"]) == ("failed", "engine_out_of_memory")


def test_without_a_prestart_the_engine_waits_for_the_claim(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis
) -> None:
    job = submit(alice)

    result = job_execute(job_id=job.id, engine=recording, worker="w", epoch=job.epoch)

    assert result["status"] == "succeeded"
    [call] = recording.calls
    assert call.thread == threading.current_thread().name


def test_the_same_audio_either_way(
    alice: Persona, engine: Engine, broker: redis.Redis, tmp_path: Any
) -> None:
    early, late = submit(alice), submit(alice)

    job_execute(job_id=early.id, engine=engine, worker="w", prestart=as_sent(early))
    job_execute(job_id=late.id, engine=engine, worker="w")

    early.refresh_from_db()
    late.refresh_from_db()
    assert (early.status, late.status) == (JobStatus.SUCCEEDED, JobStatus.SUCCEEDED)
    bucket = alice.tenant.bucket
    made_early = get_storage().get(bucket=bucket, key=early.output_key)
    made_late = get_storage().get(bucket=bucket, key=late.output_key)
    # The same samples (the files differ in their signed manifests, which name the job).
    early_samples, _ = sf.read(io.BytesIO(made_early), dtype="int16")
    late_samples, _ = sf.read(io.BytesIO(made_late), dtype="int16")
    assert len(early_samples) > 1000
    assert np.array_equal(early_samples, late_samples)


@pytest.mark.parametrize(
    "differs",
    [
        {"text": "Some other text altogether."},
        {"speed": 1.5},
        {"instruction": "Whisper."},
        {"tenant_id": "another-tenant"},
    ],
)
def test_an_early_stream_the_row_does_not_ask_for_is_closed_and_the_row_is_made(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis, differs: dict[str, Any]
) -> None:
    job = submit(alice)
    sent = as_sent(job)
    wrong = Prestart(**{**sent.__dict__, **differs})

    result = job_execute(job_id=job.id, engine=recording, worker="w", prestart=wrong)

    assert result["status"] == "succeeded"
    early, made = early_and_made(recording.calls)
    assert made.text == TEXT
    assert made.thread == threading.current_thread().name
    assert early.closed
    assert made.others_open == 0  # closed before the job's own stream began
    assert early.chunks == 1  # its first chunk only, never sent anywhere


def test_a_job_not_claimed_closes_its_early_stream(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis
) -> None:
    job = submit(alice)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.CANCELLED)

    result = job_execute(job_id=job.id, engine=recording, worker="w", prestart=as_sent(job))

    assert result["status"] == "skipped"
    [early] = recording.calls
    assert early.closed  # before the task ended: the next message finds it gone


def test_a_voice_in_memory_starts_early_and_one_not_there_waits_for_the_claim(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis, monkeypatch: Any
) -> None:
    voice = voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 24000))
    cache = VoicePromptCache()
    cold = submit(alice, voice=voice)
    assert as_sent(cold).voice == (str(voice.id), 1)

    job_execute(job_id=cold.id, engine=recording, worker="w", prompts=cache, prestart=as_sent(cold))
    warm = submit(alice, voice=voice)
    job_execute(job_id=warm.id, engine=recording, worker="w", prompts=cache, prestart=as_sent(warm))

    cold_call, warm_call = recording.calls
    assert cold_call.thread == threading.current_thread().name  # prepared after the claim
    assert warm_call.thread.startswith("first-chunk")
    warm.refresh_from_db()
    assert (warm.status, warm.prompt_source) == (JobStatus.SUCCEEDED, "memory")


def test_a_header_naming_another_tenants_voice_never_serves_the_job(
    alice: Persona, bob: Persona, recording: RecordingEngine, broker: redis.Redis
) -> None:
    """Whatever a message says, the audio is the claimed row's: alice's job is
    never made with bob's voice, even when bob's is prepared in this worker."""
    cache = VoicePromptCache()
    reference = audio_file(4.0, 24000)
    bobs = voice_create(tenant=bob.tenant, name="bob's", audio=reference)
    job_execute(job_id=submit(bob, voice=bobs).id, engine=recording, worker="w", prompts=cache)
    alices = voice_create(tenant=alice.tenant, name="alice's", audio=reference)
    job = submit(alice, voice=alices)
    forged = Prestart(
        tenant_id=str(bob.tenant.pk), text=TEXT, voice=(str(bobs.id), 1), speed=1.0, instruction=""
    )

    result = job_execute(
        job_id=job.id, engine=recording, worker="w", prompts=cache, prestart=forged
    )

    assert result["status"] == "succeeded"
    early, made = early_and_made(recording.calls[1:])
    assert made.thread == threading.current_thread().name
    assert (early.closed, made.others_open, early.chunks) == (True, 0, 1)
    job.refresh_from_db()
    assert job.prompt_source == "computed"  # alice's own voice, prepared for her job


def test_a_new_voice_version_is_not_served_by_the_early_stream(
    alice: Persona, recording: RecordingEngine, broker: redis.Redis
) -> None:
    voice = voice_create(tenant=alice.tenant, name="narrator", audio=audio_file(4.0, 24000))
    cache = VoicePromptCache()
    first = submit(alice, voice=voice)
    job_execute(job_id=first.id, engine=recording, worker="w", prompts=cache)
    job = submit(alice, voice=voice)
    sent = as_sent(job)
    Voice.objects.filter(pk=voice.pk).update(version=2)  # re-recorded meanwhile

    result = job_execute(job_id=job.id, engine=recording, worker="w", prompts=cache, prestart=sent)

    assert result["status"] == "succeeded"
    early, made = early_and_made(recording.calls[1:])
    assert made.thread == threading.current_thread().name
    assert (early.closed, made.others_open) == (True, 0)
    job.refresh_from_db()
    assert job.prompt_source == "computed"  # version 2, prepared for this run


def test_an_engine_error_in_the_early_first_chunk_fails_the_job_as_it_would_have(
    alice: Persona, engine: Engine, broker: redis.Redis
) -> None:
    job = submit(alice)
    raised_on: list[str] = []

    def failing(**_: Any) -> Iterator[Samples]:
        raised_on.append(threading.current_thread().name)
        raise EngineOutOfMemory("The device has no memory left for this stream.")
        yield  # a generator, as engines return

    broken = RecordingEngine(engine)
    broken.synthesize = failing  # type: ignore[method-assign]

    result = job_execute(job_id=job.id, engine=broken, worker="w", prestart=as_sent(job))

    assert (result["status"], result["code"]) == ("failed", "engine_out_of_memory")
    assert raised_on[0].startswith("first-chunk")
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "engine_out_of_memory")


def test_a_jobs_first_message_carries_what_its_engine_needs(
    alice: Persona, broker: redis.Redis, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):  # the publish, after commit
        submit(alice)

    [raw] = broker.lrange("synth.normal", 0, -1)
    header = json.loads(raw)["headers"][HEADER]

    assert Prestart.from_header(header) == Prestart(
        tenant_id=str(alice.tenant.pk), text=TEXT, voice=None, speed=1.0, instruction=""
    )
    assert TEXT not in json.loads(raw)["headers"]["kwargsrepr"]


def test_a_job_released_from_pending_carries_it_too(
    alice: Persona,
    broker: redis.Redis,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    settings.TENANT_BROKER_SLOTS = 1
    with django_capture_on_commit_callbacks(execute=True):
        first = submit(alice)
        held = submit(alice, text="Held back, then released.")
    assert Job.objects.get(pk=held.pk).status == JobStatus.PENDING
    broker.delete("synth.normal")

    with django_capture_on_commit_callbacks(execute=True):  # the release, after commit
        assert execution.job_claim(job_id=first.id, worker="w", epoch=first.epoch)

    [raw] = broker.lrange("synth.normal", 0, -1)
    message = json.loads(raw)
    assert json.loads(base64.b64decode(message["body"]))[0][0] == str(held.id)
    assert Prestart.from_header(message["headers"][HEADER]) == Prestart(
        tenant_id=str(alice.tenant.pk),
        text="Held back, then released.",
        voice=None,
        speed=1.0,
        instruction="",
    )


@pytest.mark.parametrize(
    "header", [None, "text", ["t", "x"], ["t", 3, None, 1.0, ""], ["t", "x", None, "nan", ""]]
)
def test_a_header_of_another_form_is_no_prestart(header: Any) -> None:
    assert Prestart.from_header(header) is None


def early_and_made(calls: list[Call]) -> tuple[Call, Call]:
    """The early stream and the one made from the row, in whichever order their
    threads got to the engine."""
    early = [call for call in calls if call.thread.startswith("first-chunk")]
    made = [call for call in calls if call not in early]
    assert (len(early), len(made)) == (1, 1), calls
    return early[0], made[0]


def test_a_forked_pool_child_makes_threads_of_its_own() -> None:
    prestart._threads.get()  # the parent's, whose threads a fork does not copy
    pid = os.fork()
    if pid == 0:  # the child: nothing but the look, then out without cleanup
        os._exit(1 if prestart._threads.made else 0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert prestart._threads.made


def test_celerys_pool_never_logs_a_task_request_and_its_text() -> None:
    # At CHORUS_LOG_LEVEL=DEBUG Celery's pool would log each request, headers included.
    assert logging.getLogger("celery.pool").getEffectiveLevel() == logging.INFO
