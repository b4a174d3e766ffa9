"""job_execute, the worker side: claim, synthesize, store, finish; safe to repeat."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from django.conf import settings
from django.forms.models import model_to_dict

from chorus.errors import EngineError, EngineOutOfMemory
from synthesis.engines.base import Engine, PreparedVoice, Samples
from synthesis.models import Job, JobStatus
from synthesis.services.execution import job_claim, job_execute
from synthesis.services.jobs import job_create, job_output_key
from synthesis.speech_request import SpeechRequest
from tests.conftest import Persona
from tests.fake_engines import WrappedEngine


class ScriptedEngine(WrappedEngine):
    """Wraps a real engine; `before_first_chunk` runs just before it yields audio."""

    def __init__(
        self,
        inner: Engine,
        *,
        before_first_chunk: Callable[[], None] | None = None,
        chunks: list[Samples] | None = None,
    ) -> None:
        super().__init__(inner)
        self.before_first_chunk = before_first_chunk
        self.chunks = chunks

    def synthesize(
        self,
        *,
        text: str,
        voice: PreparedVoice | None,
        speed: float = 1.0,
        instruction: str = "",
    ) -> Iterator[Samples]:
        if self.before_first_chunk is not None:
            self.before_first_chunk()
        if self.chunks is not None:
            yield from self.chunks
            return
        yield from self.inner.synthesize(
            text=text, voice=voice, speed=speed, instruction=instruction
        )


def make_job(persona: Persona, text: str = "Hello there.") -> Job:
    return job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text=text)
    )


def row(job: Job) -> dict[str, Any]:
    return model_to_dict(Job.objects.get(pk=job.pk))


def stored(persona: Persona, key: str) -> Path:
    return Path(settings.STORAGE["local_root"]) / persona.tenant.bucket / key


def raising(exc: BaseException) -> Callable[[], None]:
    def fail() -> None:
        raise exc

    return fail


# --- the happy path ---------------------------------------------------------------


def test_it_runs_a_queued_job_to_success_and_stores_the_audio(
    alice: Persona, engine: Engine
) -> None:
    job = make_job(alice)

    result = job_execute(job_id=job.id, engine=engine, worker="worker-1")

    assert result == {"job_id": str(job.id), "status": "succeeded"}
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert (job.attempts, job.worker, job.engine) == (1, "worker-1", "synthetic")
    assert job.output_key == job_output_key(job_id=job.id, audio_format="wav")
    assert stored(alice, job.output_key).stat().st_size == job.output_bytes
    assert job.started_at <= job.first_audio_at <= job.finished_at
    assert job.error_code == ""


def test_the_output_key_depends_only_on_the_job_and_format() -> None:
    job_id = Job().id

    first = job_output_key(job_id=job_id, audio_format="wav")

    assert first == job_output_key(job_id=job_id, audio_format="wav") == f"speech/{job_id}.wav"
    assert first != job_output_key(job_id=Job().id, audio_format="wav")


def test_a_redelivered_job_writes_the_same_object_again(alice: Persona, engine: Engine) -> None:
    job = make_job(alice)
    job_execute(job_id=job.id, engine=engine, worker="worker-1")
    job.refresh_from_db()
    first_key, first_bytes = job.output_key, stored(alice, job.output_key).read_bytes()
    # The worker died after storing the audio but before its ack: the broker hands
    # the task out again while the row still says running.
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)

    job_execute(job_id=job.id, engine=engine, worker="worker-2")

    job.refresh_from_db()
    assert (job.status, job.attempts, job.output_key) == (JobStatus.SUCCEEDED, 2, first_key)
    # The same audio; its Content Credentials are signed again (a new manifest
    # id and ECDSA signature), so the bytes of the file are not the same.
    again = stored(alice, first_key).read_bytes()
    assert np.array_equal(sf.read(io.BytesIO(again))[0], sf.read(io.BytesIO(first_bytes))[0])
    speech = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / "speech"
    assert [p.name for p in speech.iterdir()] == [f"{job.id}.wav"]


# --- claiming ---------------------------------------------------------------------


@pytest.mark.parametrize("final", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_a_finished_job_is_skipped_and_left_unchanged(
    alice: Persona, engine: Engine, final: str
) -> None:
    job = make_job(alice)
    if final == JobStatus.SUCCEEDED:
        job_execute(job_id=job.id, engine=engine, worker="worker-1")
    else:
        job_execute(
            job_id=job.id,
            engine=ScriptedEngine(engine, before_first_chunk=raising(EngineError("no"))),
            worker="worker-1",
        )
    before = row(job)
    assert before["status"] == final

    result = job_execute(job_id=job.id, engine=engine, worker="worker-2")

    assert result == {"job_id": str(job.id), "status": "skipped"}
    assert row(job) == before


def test_a_job_that_no_longer_exists_is_skipped(alice: Persona, engine: Engine) -> None:
    job = make_job(alice)
    Job.objects.filter(pk=job.pk).delete()

    assert job_execute(job_id=job.id, engine=engine, worker="w")["status"] == "skipped"


def test_each_claim_is_a_new_attempt(alice: Persona) -> None:
    job = make_job(alice)

    first = job_claim(job_id=job.id, worker="worker-1")
    second = job_claim(job_id=job.id, worker="worker-2")

    assert first is not None
    assert second is not None
    assert (first.attempt, second.attempt) == (1, 2)
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker) == (JobStatus.RUNNING, 2, "worker-2")


def test_a_claimed_job_carries_what_its_run_needs_of_its_tenant(
    alice: Persona, django_assert_num_queries: Any
) -> None:
    """The tenant's bucket and limit overrides (whether its audio is signed)
    come with the claim. Read later, at the job's end, they were a query outside
    the waits for the database that the job's stamps make (`through_outage`): a
    database gone for a moment then failed a job whose audio was made."""
    alice.tenant.limit_overrides = {"provenance": False}
    alice.tenant.save(update_fields=["limit_overrides"])

    claim = job_claim(job_id=make_job(alice).id, worker="worker-1")

    assert claim is not None
    with django_assert_num_queries(0):
        assert claim.job.tenant.bucket == alice.tenant.bucket
        assert claim.job.tenant.limit_overrides == {"provenance": False}


def test_a_stale_attempts_success_does_not_overwrite_the_newer_attempts_result(
    alice: Persona, engine: Engine
) -> None:
    job = make_job(alice)
    newer: dict[str, Any] = {}

    def redelivered_meanwhile() -> None:
        newer.update(job_execute(job_id=job.id, engine=engine, worker="worker-2"))

    stale = job_execute(
        job_id=job.id,
        engine=ScriptedEngine(engine, before_first_chunk=redelivered_meanwhile),
        worker="worker-1",
    )

    assert newer["status"] == "succeeded"
    assert stale == {"job_id": str(job.id), "status": "superseded"}
    job.refresh_from_db()
    assert (job.status, job.attempts, job.worker) == (JobStatus.SUCCEEDED, 2, "worker-2")


def test_a_stale_attempts_failure_does_not_overwrite_the_newer_attempts_success(
    alice: Persona, engine: Engine
) -> None:
    job = make_job(alice)

    def redelivered_then_crash() -> None:
        job_execute(job_id=job.id, engine=engine, worker="worker-2")
        raise EngineError("the old attempt ran out of luck")

    stale = job_execute(
        job_id=job.id,
        engine=ScriptedEngine(engine, before_first_chunk=redelivered_then_crash),
        worker="worker-1",
    )

    assert stale["status"] == "failed"
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert (job.error_code, job.error_message) == ("", "")
    assert (job.attempts, job.worker) == (2, "worker-2")


# --- failures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EngineError("The text could not be spoken."), "engine_error"),
        (EngineOutOfMemory("The device is out of memory."), "engine_out_of_memory"),
    ],
)
def test_an_engine_error_fails_the_job_with_its_code_and_message(
    alice: Persona, engine: Engine, error: EngineError, code: str
) -> None:
    job = make_job(alice)

    result = job_execute(
        job_id=job.id,
        engine=ScriptedEngine(engine, before_first_chunk=raising(error)),
        worker="worker-1",
    )

    assert result == {"job_id": str(job.id), "status": "failed", "code": code}
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert (job.error_code, job.error_message) == (code, error.message)
    assert job.finished_at is not None
    assert job.output_key == ""
    assert not (Path(settings.STORAGE["local_root"]) / alice.tenant.bucket / "speech").exists()


def test_an_unexpected_crash_fails_the_job_without_leaking_its_details(
    alice: Persona, engine: Engine
) -> None:
    job = make_job(alice)

    result = job_execute(
        job_id=job.id,
        engine=ScriptedEngine(
            engine, before_first_chunk=raising(RuntimeError("secret internal path /opt/x"))
        ),
        worker="worker-1",
    )

    assert result["code"] == "internal_error"
    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "internal_error")
    assert "/opt/x" not in job.error_message
    assert "Submit the job again" in job.error_message


def test_an_engine_that_produces_no_audio_fails_the_job(alice: Persona, engine: Engine) -> None:
    job = make_job(alice)

    job_execute(
        job_id=job.id,
        engine=ScriptedEngine(engine, chunks=[np.zeros(0, dtype=np.float32)]),
        worker="worker-1",
    )

    job.refresh_from_db()
    assert (job.status, job.error_code) == (JobStatus.FAILED, "engine_error")
    assert "no audio" in job.error_message
    assert job.first_audio_at is None
