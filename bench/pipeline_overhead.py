"""What the pipeline itself adds to a job, measured on the real stack.

Starts one real worker process with the synthetic engine (a fixed first-chunk
delay and real-time factor, so the engine's own time is known exactly), submits
jobs one at a time through the service layer, and splits each job's wall time:

  dispatch   created → started       (commit, publish, broker, worker claim)
  first      started → first audio - the engine's compute for the first chunk
             (load the voice, prepare it, start the stream)
  finish     first audio → finished - the engine's compute for the other chunks
             (concatenate, encode WAV, write to storage, final UPDATE)

Usage (PostgreSQL and Redis as in `make test`):
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_bench \\
  REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/pipeline_overhead.py --jobs 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")

ENGINE = {"first_chunk_delay_s": 0.2, "rtf": 0.1, "chunk_s": 0.5, "seconds_per_char": 0.06}
TEXT = "Chorus measures what its own pipeline adds to every job, in milliseconds."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=30)
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from synthesis.engines.synthetic import SyntheticEngine
    from synthesis.models import Job, JobStatus
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest
    from synthesis.storage_runtime import get_storage
    from synthesis.worker import worker_argv
    from tenants.models import Tenant
    from tenants.services import tenant_create

    storage_root = tempfile.mkdtemp(prefix="chorus-bench-")
    os.environ.update(CHORUS_STORAGE="local", CHORUS_STORAGE_ROOT=storage_root)
    from django.conf import settings

    settings.STORAGE = {**settings.STORAGE, "local_root": storage_root}
    tenant = Tenant.objects.filter(slug="bench").first() or tenant_create(slug="bench")
    get_storage().ensure_bucket(tenant.bucket)  # a fresh storage folder on every run

    env = {
        **os.environ,
        "CHORUS_ENGINE": "synthetic",
        "CHORUS_ENGINE_OPTIONS": json.dumps({**ENGINE, "state_dir": storage_root}),
    }
    worker = subprocess.Popen(
        worker_argv(loglevel="WARNING"),
        cwd=ROOT,
        env=env,
    )
    try:
        time.sleep(6)  # worker start-up is not part of any job
        audio_s = SyntheticEngine(**ENGINE).audio_seconds(TEXT, 1.0)
        # The engine spends delay + rtf x chunk before the first chunk, and
        # rtf x the rest after it.
        first_compute: float = ENGINE["first_chunk_delay_s"] + ENGINE["rtf"] * min(
            ENGINE["chunk_s"], audio_s
        )
        remaining_compute = ENGINE["rtf"] * max(0.0, audio_s - ENGINE["chunk_s"])
        rows = []
        for _ in range(args.jobs):
            job = job_create(
                tenant=tenant, api_key=None, speech=SpeechRequest(text=TEXT), priority="high"
            )
            while True:
                job.refresh_from_db()
                if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
                    break
                time.sleep(0.005)
            assert job.status == JobStatus.SUCCEEDED, job.error_message
            rows.append(job)
        Job.objects.filter(tenant=tenant).delete()
    finally:
        worker.terminate()
        worker.wait()

    def ms(values: list[float]) -> str:
        values = sorted(values)
        p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
        return f"{statistics.median(values) * 1000:8.1f} {p95 * 1000:8.1f}"

    dispatch = [(j.started_at - j.created_at).total_seconds() for j in rows]
    first = [(j.first_audio_at - j.started_at).total_seconds() - first_compute for j in rows]
    finish = [(j.finished_at - j.first_audio_at).total_seconds() - remaining_compute for j in rows]
    print(f"\n{args.jobs} jobs, one worker, synthetic engine {ENGINE}, {audio_s:.2f} s audio each")
    print(f"{'stage':<10} {'p50 ms':>8} {'p95 ms':>8}")
    for name, values in (("dispatch", dispatch), ("first", first), ("finish", finish)):
        print(f"{name:<10} {ms(values)}")


if __name__ == "__main__":
    main()
