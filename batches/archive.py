"""The batch's archive: every succeeded item's audio plus manifest.json and
manifest.csv, in one zip in the tenant's bucket, built on a light (CPU) worker.

Streamed end to end: each object is read from storage in chunks and written into
the zip entry as it comes, and the zip goes to storage as it is written (a
multipart upload on S3, a temp file renamed into place locally). Memory holds a
chunk or an upload part, never an item's or the archive's whole bytes.

A tenant has at most CHORUS_BATCH_ARCHIVE_TENANT_CONCURRENCY builds running, over
all light workers: a tenant that ends 50 big batches at once must not hold every
light thread (the ones that split and join long texts too). A build over that is
deferred, not failed: its batch stays `waiting`, the message is done with, and the
next of that tenant's builds to end publishes the oldest such batch
(`_hand_over`); the sweeper's look for lost archive tasks is the backstop.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import uuid
import zipfile
from typing import Any

from django.conf import settings
from django.db import transaction

from batches.models import ArchiveStatus, Batch, BatchItem, BatchStatus
from chorus.celery import app as celery_app
from chorus.errors import NotFound
from quotas.counters import storage_add
from synthesis.audio_out import FILE_EXTENSIONS
from synthesis.models import JobStatus
from synthesis.provenance import sidecar_key
from synthesis.storage_runtime import get_storage

log = logging.getLogger(__name__)

# Read size: a few of these are in memory at once, however large the batch.
READ_CHUNK_BYTES = 1024 * 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MANIFEST_FIELDS = (
    "index",
    "custom_id",
    "job_id",
    "status",
    "error_code",
    "file",
    "provenance_file",  # the file's sidecar manifest (opus, pcm); wav/mp3/flac embed it
    "characters",
    "duration_s",
    "metadata",
)


def batch_archive_key(*, batch_id: uuid.UUID | str) -> str:
    # Deterministic: a task delivered twice rewrites its own object.
    return f"batches/{batch_id}.zip"


def batch_archive_build(*, batch_id: uuid.UUID | str) -> str:
    """Build the archive of an ended batch; safe to run again. "deferred" when
    its tenant has its most builds running (it is built when one of them ends)."""
    tenant_id = Batch.objects.filter(pk=batch_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        return "skipped"
    # Counted, then claimed, not under a lock: two claims at once may both take the
    # last place, a bound kept within one. The batch's own build counts (a
    # redelivered task builds it again, as before, within the bound).
    running = Batch.objects.filter(tenant_id=tenant_id, archive_status=ArchiveStatus.BUILDING)
    if running.count() >= settings.BATCH_ARCHIVE_TENANT_CONCURRENCY:
        return "deferred"
    with transaction.atomic():
        claimed = (
            Batch.objects.filter(pk=batch_id)
            .exclude(status=BatchStatus.RUNNING)
            .exclude(archive_status=ArchiveStatus.READY)
            .update(archive_status=ArchiveStatus.BUILDING, archive_error="")
        )
    if not claimed:
        return "skipped"
    try:
        return _build(batch_id=batch_id)
    finally:
        _hand_over(tenant_id=tenant_id)


def _hand_over(*, tenant_id: int) -> None:
    """A build of the tenant ended (its place is free): publish its oldest
    deferred archive. Two builds that end together may publish the same one: the
    second message finds it building or ready."""
    oldest = (
        Batch.objects.filter(
            tenant_id=tenant_id, archive_status=ArchiveStatus.WAITING, finished_at__isnull=False
        )
        .order_by("finished_at")
        .values_list("pk", flat=True)
        .first()
    )
    if oldest is None:
        return
    try:
        _publish(str(oldest))
    except Exception:  # broker down: the sweeper publishes it once Redis is back
        log.warning("could not publish the archive of batch %s", oldest, exc_info=True)


def _publish(batch_id: str) -> None:
    # By the task's name (routed to the light queue): this module must not import
    # the task module, which imports it.
    celery_app.send_task("batches.build_archive", args=(batch_id,))


def _build(*, batch_id: uuid.UUID | str) -> str:
    batch = Batch.objects.select_related("tenant").get(pk=batch_id)
    key = batch_archive_key(batch_id=batch.pk)
    try:
        size = _write(batch=batch, key=key)
    except Exception as exc:
        log.exception("archive of batch %s failed", batch.pk)
        Batch.objects.filter(pk=batch.pk).update(
            archive_status=ArchiveStatus.FAILED,
            archive_error=f"The archive could not be built ({type(exc).__name__}).",
        )
        return "failed"
    with transaction.atomic():
        # Counted in the tenant's storage once, by the builder that makes it ready
        # (a task delivered twice rewrites the same object).
        made_ready = (
            Batch.objects.filter(pk=batch.pk)
            .exclude(archive_status=ArchiveStatus.READY)
            .update(archive_status=ArchiveStatus.READY, archive_key=key, archive_bytes=size)
        )
        if made_ready:
            storage_add(tenant_id=batch.tenant_id, delta=size)
    return "ready"


class _Counted:
    """The storage writer as the zip sees it: write-only, so zipfile streams
    (data descriptors after each entry, no seeking back), and counted."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self.written = 0

    def write(self, data: bytes) -> int:
        self._out.write(data)
        self.written += len(data)
        return len(data)

    def flush(self) -> None:
        self._out.flush()


def _write(*, batch: Batch, key: str) -> int:
    storage = get_storage()
    bucket = batch.tenant.bucket
    rows: list[dict[str, Any]] = []
    items = BatchItem.objects.filter(batch=batch).select_related("job").order_by("index")
    with storage.writer(bucket=bucket, key=key, content_type="application/zip") as out:
        counted = _Counted(out)
        with zipfile.ZipFile(counted, "w") as archive:  # type: ignore[call-overload]
            for item in items.iterator(chunk_size=500):
                row = _row(item)
                job = item.job
                if job.status == JobStatus.SUCCEEDED and job.output_deleted_at is None:
                    name = _file_name(item)
                    if _add(archive, storage, bucket, job.output_key, name, job.format, job):
                        row["file"] = name
                        # Opus and pcm keep their Content Credentials beside them.
                        if job.provenance == "sidecar" and _add(
                            archive,
                            storage,
                            bucket,
                            sidecar_key(job.output_key),
                            sidecar_key(name),
                            job.format,
                            job,
                            size=0,
                        ):
                            row["provenance_file"] = sidecar_key(name)
                    else:
                        row["error_code"] = "output_expired"
                rows.append(row)
            archive.writestr("manifest.json", json.dumps(_manifest(batch, rows), indent=2))
            archive.writestr("manifest.csv", _csv(rows))
    return counted.written


def _add(
    archive: zipfile.ZipFile,
    storage: Any,
    bucket: str,
    key: str,
    name: str,
    fmt: str,
    job: Any,
    size: int | None = None,
) -> bool:
    chunks = storage.read_chunks(bucket=bucket, key=key, chunk_bytes=READ_CHUNK_BYTES)
    try:
        first = next(chunks, b"")  # a missing object is found before its entry is begun
    except NotFound:
        return False
    info = zipfile.ZipInfo(name, date_time=job.finished_at.timetuple()[:6])
    # Stored, not deflated: audio barely shrinks (PCM's noise floor, and the other
    # formats are compressed already) and deflating costs ~7x the CPU of the build.
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = job.output_bytes or 0 if size is None else size  # zip64 where needed
    with archive.open(info, "w") as entry:
        entry.write(first)
        for chunk in chunks:
            entry.write(chunk)
    return True


def _file_name(item: BatchItem) -> str:
    label = _UNSAFE.sub("_", item.custom_id).strip("._") if item.custom_id else ""
    ext = FILE_EXTENSIONS[item.job.format]
    return f"{item.index:05d}-{label or item.job_id}.{ext}"


def _row(item: BatchItem) -> dict[str, Any]:
    job = item.job
    return {
        "index": item.index,
        "custom_id": item.custom_id,
        "job_id": str(job.id),
        "status": job.status,
        "error_code": job.error_code,
        "file": None,
        "provenance_file": None,
        "characters": job.characters,
        "duration_s": job.duration_s,
        "metadata": item.metadata,
    }


def _manifest(batch: Batch, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "batch_id": str(batch.id),
        "status": batch.status,
        "created_at": batch.created_at.isoformat(),
        "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
        "items": rows,
    }


def _csv(rows: list[dict[str, Any]]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=MANIFEST_FIELDS)
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "file": row["file"] or "", "metadata": json.dumps(row["metadata"])})
    return text.getvalue()
