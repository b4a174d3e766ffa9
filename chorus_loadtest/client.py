"""One speech request, submitted and followed to its end, timed from the client.

Without streaming, a request is `POST /v1/speech` then `GET /v1/speech/{id}`
every `poll_interval_s` until the job ends:

* total = client submit → the poll that first sees `succeeded` (so it carries up
  to one poll interval of lag; the report states the interval);
* first audio = the server's `queued_at → first_audio_at` plus the client's
  submit round trip. Client and server clocks need not agree this way; the
  round trip slightly overstates the share before `queued_at` (it includes the
  response's way back).

With streaming (`"stream": true`), first audio is the time to the first byte of
the audio body and total the time to its last byte. A server that answers a
stream request with a plain 202 job (no streaming yet) is followed by polling
and the sample says so.
"""

from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from chorus_loadtest.options import LoadTestOptions

TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Sample:
    level: int
    index: int
    priority: str
    started: float  # time.monotonic() at submit
    ended: float
    ok: bool
    error_code: str = ""
    http_status: int | None = None
    submit_s: float | None = None
    first_audio_s: float | None = None
    total_s: float | None = None
    audio_s: float | None = None
    streamed: bool = False
    job_id: str = ""
    engine: str = ""


class SpeechClient:
    def __init__(self, http: httpx.Client, options: LoadTestOptions) -> None:
        self.http = http
        self.options = options

    def run(self, *, level: int, index: int) -> Sample:
        options = self.options
        body: dict[str, Any] = {
            "text": options.text,
            "priority": options.priority_for(index),
            "format": options.audio_format,
            # A load test measures the workers: every request is synthesized, none
            # answered from an earlier identical result.
            "reuse": False,
        }
        if options.voice_id:
            body["voice_id"] = options.voice_id
        sample = Sample(
            level=level,
            index=index,
            priority=body["priority"],
            started=time.monotonic(),
            ended=0.0,
            ok=False,
        )
        try:
            if options.stream:
                self._stream(sample, {**body, "stream": True})
            else:
                response = self.http.post("/v1/speech", json=body)
                self._submitted(sample, response)
        except httpx.TimeoutException:
            sample.error_code = "client_timeout"
        except httpx.HTTPError:
            sample.error_code = "connection_error"
        sample.ended = sample.ended or time.monotonic()
        return sample

    def _submitted(self, sample: Sample, response: httpx.Response) -> None:
        sample.submit_s = time.monotonic() - sample.started
        sample.http_status = response.status_code
        if response.status_code != 202:
            sample.error_code = error_code(response)
            return
        self._poll(sample, response.json())

    def _poll(self, sample: Sample, job: dict[str, Any]) -> None:
        sample.job_id = str(job.get("id", ""))
        deadline = sample.started + self.options.timeout_s
        while job.get("status") not in TERMINAL:
            if time.monotonic() > deadline:
                sample.error_code = "client_timeout"
                self._cancel(sample.job_id)
                return
            time.sleep(self.options.poll_interval_s)
            response = self.http.get(f"/v1/speech/{sample.job_id}")
            if response.status_code == 429:
                time.sleep(min(retry_after(response), 5.0))
                continue
            if response.status_code != 200:
                sample.http_status = response.status_code
                sample.error_code = error_code(response)
                return
            job = response.json()
        sample.ended = time.monotonic()
        sample.engine = str(job.get("engine") or "")
        if job["status"] != "succeeded":
            error = job.get("error") or {}
            sample.error_code = str(error.get("code") or f"job_{job['status']}")
            return
        sample.ok = True
        sample.total_s = sample.ended - sample.started
        sample.audio_s = job.get("duration_s")
        timings = job.get("timings") or {}
        span = _span(timings.get("queued_at"), timings.get("first_audio_at"))
        if span is not None and sample.submit_s is not None:
            sample.first_audio_s = span + sample.submit_s

    def _stream(self, sample: Sample, body: dict[str, Any]) -> None:
        deadline = sample.started + self.options.timeout_s
        with self.http.stream("POST", self.options.stream_path, json=body) as response:
            content_type = response.headers.get("content-type", "")
            if response.status_code >= 400 or "json" in content_type:
                response.read()
                self._submitted(sample, response)
                return
            sample.submit_s = time.monotonic() - sample.started
            sample.http_status = response.status_code
            sample.streamed = True
            sample.job_id = response.headers.get("x-job-id", "")
            head, size = b"", 0
            for chunk in response.iter_bytes():
                if not chunk:
                    continue
                if sample.first_audio_s is None:
                    sample.first_audio_s = time.monotonic() - sample.started
                if len(head) < 256:
                    head += chunk[: 256 - len(head)]
                size += len(chunk)
                if time.monotonic() > deadline:
                    sample.error_code = "client_timeout"
                    return
        sample.ended = time.monotonic()
        if size == 0:
            sample.error_code = "empty_stream"
            return
        sample.ok = True
        sample.total_s = sample.ended - sample.started
        sample.audio_s = wav_seconds(head, size)
        if sample.job_id:  # after the clock stopped: which engine, how much audio
            with contextlib.suppress(httpx.HTTPError, ValueError):
                job = self.http.get(f"/v1/speech/{sample.job_id}").json()
                sample.engine = str(job.get("engine") or "")
                sample.audio_s = job.get("duration_s") or sample.audio_s

    def _cancel(self, job_id: str) -> None:
        # Best effort: a job the client gave up on should not hold the queue.
        with contextlib.suppress(httpx.HTTPError):
            self.http.post(f"/v1/speech/{job_id}/cancel")


def error_code(response: httpx.Response) -> str:
    """The envelope's stable code, or `http_<status>` for anything else."""
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return f"http_{response.status_code}"
    return str(code)


def retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


def wav_seconds(head: bytes, size: int) -> float | None:
    """Seconds of PCM audio in a streamed WAV of `size` bytes (None if not WAV)."""
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    fmt = head.find(b"fmt ")
    data = head.find(b"data")
    if fmt < 0 or data < 0 or fmt + 24 > len(head):
        return None
    channels, rate, _, _, bits = struct.unpack_from("<HIIHH", head, fmt + 10)
    frame = channels * bits // 8
    if rate <= 0 or frame <= 0:
        return None
    return max(0, size - (data + 8)) / (rate * frame)


def _span(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
