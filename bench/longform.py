# ruff: noqa: RUF001 (the Chinese text's full-width punctuation is what it is split at)
"""Long-form jobs on 1, 2, 4 and 8 emulated GPUs: parallel efficiency, first
audio of a long stream, and seams at the joins.

A real stack on this machine: PostgreSQL, Redis, N GPU worker processes with the
synthetic engine (each its own emulated T4, one stream at a time so "N GPUs" is
N segments at once), one CPU worker on the `light` queue (split and join), and
uvicorn for the streamed runs. Submissions of the throughput runs go through the
service layer; streams through HTTP. Timing is the synthetic engine's, scaled
down from the T4 profile so a run fits in minutes: first chunk 0.3 s, real-time
factor 0.05, 0.06 s of audio per character (Chinese characters too).

Tables:
1. a 20,000-character English text and a 10,000-character Chinese text on 1, 2,
   4, 8 GPUs: wall time from submit to the last segment (and to the joined file),
   the sum of the segments' own times (claim to finish, worker-side), parallel
   efficiency = sum / (wall x GPUs), the join's time, and the workers' CPU seconds;
2. first audio (first body byte at the client) of a streamed 50,000-character
   text against a one-sentence stream, on 4 GPUs, median of 7 each;
3. the largest sample-to-sample jump at the joins (10 ms either side of each
   pause) against inside the segments, in the 20,000-character file.

Usage (about 10 minutes on 2 cores):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_longform_bench \\
  REDIS_URL=redis://127.0.0.1:6379/6 .venv/bin/python bench/longform.py
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import soundfile as sf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_longform_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")

import harness  # noqa: E402
from first_chunk_latency import start_process  # noqa: E402

ENGINE = {
    "profile": "t4-cosyvoice2",
    "first_chunk_delay_s": 0.3,
    "rtf": 0.05,
    "chunk_s": 0.5,
    "seconds_per_char": 0.06,
}
GPU_COUNTS = (1, 2, 4, 8)
ENGLISH = [
    "Dr. Smith opened the door at 9.30 in the morning, as he had every day that year.",
    "The hallway was quiet, e.g. no footsteps and no voices, only the clock.",
    "He walked to the window and looked out over the river and the old mill.",
    "Boats moved slowly under the grey sky; a gull followed the last of them.",
    "Somewhere a bell rang twice, then stopped, and the town went back to sleep.",
]
CHINESE = [
    "早上九点半，史密斯医生打开了门，就像那一年里的每一天一样。",
    "走廊里很安静，没有脚步声，也没有说话声，只有钟表在走。",
    "他走到窗前，望着河水和那座旧磨坊。",
    "船在灰色的天空下慢慢地移动，一只海鸥跟着最后一条船。",
    "远处的钟响了两下，然后停了，小镇又睡着了。",
]
ONE_SENTENCE = "The lighthouse keeper climbed the stairs at dusk."


def text_of(sentences: list[str], length: int, glue: str) -> str:
    """`sentences` repeated to about `length` characters, ending on a sentence end."""
    out = ""
    while len(out) < length:
        for sentence in sentences:
            out += sentence + glue
    trimmed = out[:length]
    return trimmed[: max(trimmed.rfind(". "), trimmed.rfind("。")) + 1]


def run_text(label: str, text: str, language: str, gpus: int, tenant: Any) -> dict[str, Any]:
    from synthesis.models import Job, JobStatus
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest

    cpu_before = _workers_cpu()
    started = time.monotonic()
    job = job_create(
        tenant=tenant,
        api_key=None,
        speech=SpeechRequest(text=text, language=language, format="wav"),
    )
    while Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING).exists():
        if time.monotonic() - started > 900:
            raise SystemExit(f"{label}: not finished after 900 s")
        time.sleep(0.1)
    job.refresh_from_db()
    if job.status != JobStatus.SUCCEEDED:
        raise SystemExit(f"{label}: {job.status} {job.error_code} {job.error_message}")
    segments = list(Job.objects.filter(parent=job).order_by("segment_index"))
    spans = [(s.finished_at - s.started_at).total_seconds() for s in segments]
    last = max(s.finished_at for s in segments)
    wall = (last - job.created_at).total_seconds()
    return {
        "label": label,
        "gpus": gpus,
        "segments": len(segments),
        "audio_s": job.duration_s,
        "wall_s": wall,
        "file_s": (job.finished_at - job.created_at).total_seconds(),
        "join_s": (job.finished_at - last).total_seconds(),
        "sum_s": sum(spans),
        "efficiency": sum(spans) / (wall * gpus),
        "cpu_s": _workers_cpu() - cpu_before,
        "job": job,
        "segment_rows": segments,
    }


_worker_pids: list[int] = []


def _workers_cpu() -> float:
    total = 0.0
    for pid in _worker_pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def seams(result: dict[str, Any]) -> tuple[float, float]:
    """(largest jump within 10 ms of a join, largest jump inside segments)."""
    from django.conf import settings

    from synthesis.longform.split import PAUSE_S

    job = result["job"]
    path = Path(settings.STORAGE["local_root"]) / job.tenant.bucket / job.output_key
    audio, rate = sf.read(io.BytesIO(path.read_bytes()), dtype="float32")
    jumps = np.abs(np.diff(audio))
    near = np.zeros(len(jumps), dtype=bool)
    window = round(0.010 * rate)
    pause = round(PAUSE_S * rate)
    at = 0
    for segment in result["segment_rows"][:-1]:
        at += round(segment.duration_s * rate)
        near[max(0, at - window) : at + pause + window] = True
        at += pause
    return float(jumps[near].max()), float(jumps[~near].max())


def first_audio(http: httpx.Client, text: str) -> tuple[float, str]:
    started = time.perf_counter()
    with http.stream("POST", "/v1/speech", json={"text": text, "stream": True}) as response:
        if response.status_code != 200:
            raise SystemExit(f"stream refused: {response.status_code} {response.read()!r}")
        for data in response.iter_raw():
            if len(data) > 44:  # past the WAV header: audio
                break
        seconds = time.perf_counter() - started
        job_id = response.headers["X-Job-Id"]
    return seconds, job_id  # closing the stream cancels the job


def wait_ended(job_id: str) -> None:
    from synthesis.models import FINISHED, Job

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        segments_left = Job.objects.filter(parent_id=job_id).exclude(status__in=FINISHED)
        if (
            not segments_left.exists()
            and Job.objects.filter(pk=job_id, status__in=FINISHED).exists()
        ):
            return
        time.sleep(0.1)


def measure_first_audio(firsts: dict[str, list[float]], *, key: str, streams: int) -> None:
    """Alternate one-sentence and 50,000-character streams, each ended (closing
    the stream cancels the job) before the next starts."""
    from django.conf import settings

    from chorus.web_server import web_server_argv

    env = {
        **os.environ,
        "CHORUS_STORAGE_ROOT": settings.STORAGE["local_root"],
        "CHORUS_PUBLIC_URL": "http://127.0.0.1:8431",
    }
    web = start_process(
        [*web_server_argv(host="127.0.0.1", port=8431), "--log-level", "info"],
        env,
        "Uvicorn running",
    )
    long_text = text_of(ENGLISH, 50_000, " ")
    try:
        with httpx.Client(
            base_url="http://127.0.0.1:8431",
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
        ) as http:
            first_audio(http, ONE_SENTENCE)  # warm-up: the web process's first request
            for _ in range(streams):
                for name, text in (
                    ("one sentence", ONE_SENTENCE),
                    ("50,000 characters", long_text),
                ):
                    seconds, job_id = first_audio(http, text)
                    firsts[name].append(seconds)
                    wait_ended(job_id)
    finally:
        web.terminate()
        web.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default=",".join(map(str, GPU_COUNTS)))
    parser.add_argument("--streams", type=int, default=7)
    args = parser.parse_args()
    os.environ["CHORUS_WORKER_STREAMS"] = "1"  # one segment per emulated GPU at a time
    os.environ["CHORUS_ENGINE"] = "synthetic"  # the web tier sizes segments for it
    harness.setup(broker_slots=2)  # production's fair admission
    from chorus.redis_client import get_redis
    from tenants.models import Plan

    # First: it moves local storage to a folder of its own, for every worker started after.
    _, key = harness.http_tenant("bench-lf-stream")
    Plan.objects.filter(name="bench-streaming").update(max_longform_chars=100_000)

    english = text_of(ENGLISH, 20_000, " ")
    chinese = text_of(CHINESE, 10_000, "")
    results = []
    from synthesis.models import WorkerHeartbeat

    firsts: dict[str, list[float]] = {"one sentence": [], "50,000 characters": []}
    for gpus in map(int, args.gpus.split(",")):
        WorkerHeartbeat.objects.all().delete()  # wait for this round's workers
        get_redis().delete("light")  # type: ignore[union-attr]
        with harness.workers(gpus, ENGINE) as procs:
            light = harness.start_worker(99, {}, tempfile.mkdtemp(), "light")
            try:
                _worker_pids[:] = [p.pid for p in procs] + [light.pid]
                time.sleep(3)
                tenant = harness.tenant(f"lf{gpus}")
                for label, text, language in (
                    ("en 20k", english, "en"),
                    ("zh 10k", chinese, "zh"),
                ):
                    result = run_text(label, text, language, gpus, tenant)
                    results.append(result)
                    print(
                        f"{label} on {gpus}: {result['segments']} segments, wall "
                        f"{result['wall_s']:.1f} s, efficiency {result['efficiency']:.2f}",
                        file=sys.stderr,
                    )
                if gpus == 4:
                    measure_first_audio(firsts, key=key, streams=args.streams)
            finally:
                light.terminate()
                light.wait(timeout=30)

    print("\nLong-form jobs, synthetic engine on emulated T4s (timing scaled down, see docstring)")
    print(
        "| text | GPUs | segments | audio s | wall s (to last segment) | sum of segments s "
        "| efficiency | join s | to the file s | worker CPU s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['label']} | {r['gpus']} | {r['segments']} | {r['audio_s']:.0f} "
            f"| {r['wall_s']:.1f} | {r['sum_s']:.1f} | {r['efficiency']:.2f} "
            f"| {r['join_s']:.2f} | {r['file_s']:.1f} | {r['cpu_s']:.1f} |"
        )
    if firsts["one sentence"]:
        print("\nFirst audio of a stream, 4 GPUs idle (first body byte at the client)")
        print("| text | median s | min s | max s |")
        print("| --- | --- | --- | --- |")
        for name, values in firsts.items():
            print(
                f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} "
                f"| {max(values):.3f} |"
            )
        ratio = statistics.median(firsts["50,000 characters"]) / statistics.median(
            firsts["one sentence"]
        )
        print(f"ratio of medians: {ratio:.2f}")
    english_runs = [r for r in results if r["label"] == "en 20k"]
    if english_runs:
        at_joins, inside = seams(english_runs[-1])
        print("\nSeams in the 20,000-character file (largest sample-to-sample jump)")
        print("| at joins (10 ms either side) | inside segments | ratio |")
        print("| --- | --- | --- |")
        print(f"| {at_joins:.4f} | {inside:.4f} | {at_joins / inside:.2f} |")


if __name__ == "__main__":
    main()
