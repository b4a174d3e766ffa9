"""The batch archive: time and memory to build it, streamed, against a zip built
in memory the obvious way, for archives of a few to a few hundred MiB.

Each size is a finished batch of real rows (submitted through `batch_create`,
its jobs then marked succeeded with stored outputs of random, incompressible
bytes, as long texts would give). CPU time (`time.process_time`, not disturbed by
other work on the machine as wall time is) and the peak of Python's own
allocations (tracemalloc) are the medians of `--runs` builds.

    python bench/batch_archive.py [--runs 5] [--sizes 10x1,20x4,10x16] [--s3-endpoint URL]

DATABASE_URL and REDIS_URL as for the other benchmarks (a database of their own).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness

MB = 1024 * 1024


def finished_batch(tenant: Any, *, items: int, each_mb: int) -> Any:
    from django.utils import timezone

    from batches.models import Batch
    from batches.services import ItemSpec, batch_create, batch_settle
    from synthesis.models import Job, JobStatus
    from synthesis.services.jobs import job_output_key
    from synthesis.speech_request import SpeechRequest
    from synthesis.storage_runtime import get_storage

    batch = batch_create(
        tenant=tenant,
        api_key=None,
        items=[
            ItemSpec(speech=SpeechRequest(text=f"Item {n} of the benchmark.", reuse=False))
            for n in range(items)
        ],
    )
    storage = get_storage()
    for job in Job.objects.filter(batch_item__batch=batch):
        key = job_output_key(job_id=job.pk, audio_format="wav")
        with storage.writer(bucket=tenant.bucket, key=key, content_type="audio/wav") as out:
            for _ in range(each_mb):
                out.write(os.urandom(MB))
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.SUCCEEDED,
            output_key=key,
            output_bytes=each_mb * MB,
            duration_s=1.0,
            finished_at=timezone.now(),
        )
    batch_settle(batch_id=batch.pk)
    return Batch.objects.select_related("tenant").get(pk=batch.pk)


def streamed(batch: Any) -> int:
    from batches.archive import batch_archive_build
    from batches.models import ArchiveStatus, Batch

    Batch.objects.filter(pk=batch.pk).update(archive_status=ArchiveStatus.WAITING)
    assert batch_archive_build(batch_id=batch.pk) == "ready"
    return int(Batch.objects.get(pk=batch.pk).archive_bytes or 0)


def in_memory(batch: Any) -> int:
    """The obvious way: each object read whole, the zip built in a BytesIO, one put."""
    from batches.models import BatchItem
    from synthesis.storage_runtime import get_storage

    storage = get_storage()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for item in BatchItem.objects.filter(batch=batch).select_related("job"):
            data = storage.get(bucket=batch.tenant.bucket, key=item.job.output_key)
            archive.writestr(f"{item.index:05d}.wav", data)
    data = buffer.getvalue()
    storage.put(bucket=batch.tenant.bucket, key=f"bench/{batch.pk}.zip", data=data, content_type="")
    return len(data)


def measure(build: Callable[[Any], int], batch: Any, runs: int) -> tuple[int, float, float]:
    cpu, peaks, size = [], [], 0
    for _ in range(runs):
        tracemalloc.start()
        started = time.process_time()
        size = build(batch)
        cpu.append(time.process_time() - started)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    return size, statistics.median(cpu), statistics.median(peaks)


def admission(tenant: Any, items: int, runs: int) -> tuple[float, float]:
    """Median CPU and wall seconds of `batch_create` for `items` items: the time the
    tenant's lock is held (its other submissions wait that long)."""
    from batches.services import ItemSpec, batch_create
    from synthesis.speech_request import SpeechRequest

    cpu, wall = [], []
    for _ in range(runs):
        specs = [
            ItemSpec(speech=SpeechRequest(text=f"Admission item {n}.", reuse=False))
            for n in range(items)
        ]
        started, started_wall = time.process_time(), time.perf_counter()
        batch_create(tenant=tenant, api_key=None, items=specs)
        cpu.append(time.process_time() - started)
        wall.append(time.perf_counter() - started_wall)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="10x1,20x4,10x16", help="ITEMSxMiB, comma-separated")
    parser.add_argument("--s3-endpoint", default="", help="an S3 server (e.g. moto's) instead")
    parser.add_argument(
        "--admission",
        default="",
        help="also time batch_create for these item counts, e.g. 100,1000",
    )
    args = parser.parse_args()
    if args.s3_endpoint:
        os.environ.update(
            {
                "CHORUS_STORAGE": "s3",
                "S3_ENDPOINT_URL": args.s3_endpoint,
                "S3_ACCESS_KEY_ID": "bench",
                "S3_SECRET_ACCESS_KEY": "bench",
            }
        )
    harness.setup(broker_slots=2)
    if args.s3_endpoint:  # setup() chose local storage; the S3 run overrides it
        from django.conf import settings

        from synthesis.storage_runtime import get_storage

        settings.STORAGE = {**settings.STORAGE, "backend": "s3", "endpoint_url": args.s3_endpoint}
        settings.STORAGE.update(access_key="bench", secret_key="bench", region="us-east-1")
        get_storage.cache_clear()
    from django.conf import settings as django_settings

    from chorus.redis_client import get_redis

    backend = django_settings.STORAGE["backend"]
    rows = []
    for n, spec in enumerate(args.sizes.split(",")):
        items, each = (int(part) for part in spec.split("x"))
        batch = finished_batch(harness.tenant(f"archive-{n}"), items=items, each_mb=each)
        size, cpu_s, peak = measure(streamed, batch, args.runs)
        _, cpu_mem, peak_mem = measure(in_memory, batch, args.runs)
        rows.append((f"{items} x {each} MiB", size / MB, peak / MB, peak_mem / MB, cpu_s, cpu_mem))
    admitted = []
    for count in [int(n) for n in args.admission.split(",") if n]:
        admitted.append((count, *admission(harness.tenant(f"admit-{count}"), count, args.runs)))
    client = get_redis()
    assert client is not None
    client.delete(*django_settings.SYNTH_QUEUES, "light")

    print(f"\nbatch archive on {backend} storage, median of {args.runs} builds")
    print(
        f"{'items':>14} {'zip MiB':>8} {'streamed peak MiB':>18} {'in-memory peak MiB':>19} "
        f"{'ratio':>6} {'streamed CPU s':>15} {'in-memory CPU s':>16}"
    )
    for label, size_mb, peak_mb, mem_mb, cpu_s, cpu_mem in rows:
        print(
            f"{label:>14} {size_mb:8.0f} {peak_mb:18.1f} {mem_mb:19.1f} "
            f"{mem_mb / peak_mb:5.0f}x {cpu_s:15.2f} {cpu_mem:16.2f}"
        )

    if admitted:
        print(f"\nbatch admission (batch_create, one transaction), median of {args.runs}")
        print(f"{'items':>8} {'CPU s':>8} {'wall s':>8} {'CPU ms/item':>12}")
        for count, cpu_s, wall_s in admitted:
            print(f"{count:>8} {cpu_s:8.2f} {wall_s:8.2f} {1000 * cpu_s / count:12.2f}")


if __name__ == "__main__":
    main()
