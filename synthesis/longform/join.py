"""Joining a long-form job's segments into one file (a CPU task, `light` queue).

Two passes over the segments, one segment in memory at a time: the first
measures loudness (ITU-R BS.1770, pyloudnorm) and peak, the second writes every
segment with one gain for the whole into a temporary file in the requested
format, with a short pause between segments. Each segment already starts and
ends on a 5 ms fade (`synthesis.audio_out`), so a join is fade, silence, fade:
no click. The gain brings the whole to `TARGET_LUFS` unless that would push
the peak past -1 dBFS.
"""

from __future__ import annotations

import logging
import math
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import soundfile as sf
from django.db import transaction
from django.utils import timezone

from chorus.errors import NotFound
from quotas.services import quota_commit
from synthesis.audio_out import (
    _SOUNDFILE_FORMATS,
    CONTENT_TYPES,
    OPUS_TAIL_S,
    TARGET_PEAK,
    check_output,
    resample_for_engine,
)
from synthesis.job_events import job_finished
from synthesis.job_lifecycle import Event, job_transition
from synthesis.longform.lifecycle import longform_delete_segment_audio, longform_fail
from synthesis.longform.split import PAUSE_S
from synthesis.models import Job, JobStatus
from synthesis.provenance import SIDECAR_CONTENT_TYPE, sidecar_key, sign_job_output
from synthesis.services.jobs import job_output_key
from synthesis.storage_runtime import get_storage
from synthesis.streaming import stream_announce_done

log = logging.getLogger(__name__)

# Speech is commonly mastered around -16 to -20 LUFS; -18 leaves room below the peak.
TARGET_LUFS = -18.0
_BLOCK = 65536


def longform_join(*, parent_id: uuid.UUID | str) -> dict[str, Any]:
    parent = Job.objects.select_related("tenant").filter(pk=parent_id).first()
    if parent is None or parent.status != JobStatus.RUNNING:
        return {"job_id": str(parent_id), "status": "skipped"}
    segments = list(Job.objects.filter(parent_id=parent.pk).order_by("segment_index"))
    if len(segments) != parent.segments_total or any(
        s.status != JobStatus.SUCCEEDED for s in segments
    ):
        return {"job_id": str(parent_id), "status": "skipped"}
    source_rate = segments[0].sample_rate or 24000
    target_rate = check_output(parent.format, parent.requested_sample_rate) or source_rate
    try:
        gain = _gain(
            _read_all(parent, segments, source_rate=source_rate, target_rate=target_rate),
            rate=target_rate,
        )
        data, frames = _write(
            _read_all(parent, segments, source_rate=source_rate, target_rate=target_rate),
            gain=gain,
            format=parent.format,
            rate=target_rate,
        )
    except NotFound:  # a segment's audio is gone (deleted by hand, a bucket lost)
        longform_fail(
            parent_id=parent.pk,
            code="internal_error",
            message="a segment's audio was lost before the join; nothing was charged. "
            "Submit the text again.",
        )
        return {"job_id": str(parent.pk), "status": "failed", "code": "internal_error"}
    key = job_output_key(job_id=parent.pk, audio_format=parent.format)
    storage = get_storage()
    signed = sign_job_output(
        data=data,
        audio_format=parent.format,
        job_id=str(parent.pk),
        tenant_id=parent.tenant_id,
        limit_overrides=parent.tenant.limit_overrides,
        engine=segments[0].engine,
    )
    if signed.sidecar is not None:  # first: signed audio never goes without its manifest
        storage.put(
            bucket=parent.tenant.bucket,
            key=sidecar_key(key),
            data=signed.sidecar,
            content_type=SIDECAR_CONTENT_TYPE,
        )
    storage.put(
        bucket=parent.tenant.bucket,
        key=key,
        data=signed.data,
        content_type=CONTENT_TYPES[parent.format],
    )
    with transaction.atomic():
        finished = job_transition(
            event=Event.JOINED,
            job_id=parent.pk,
            engine=segments[0].engine,
            output_key=key,
            output_bytes=len(signed.data),
            provenance=signed.mode,
            sample_rate=target_rate,
            duration_s=round(frames / target_rate, 3),
            finished_at=timezone.now(),
        )
        if finished:
            quota_commit(job_id=parent.pk)
    if not finished:  # cancelled while joining; a second join's object is the same key
        if Job.objects.filter(pk=parent.pk, status=JobStatus.CANCELLED).exists():
            storage.delete(bucket=parent.tenant.bucket, key=key)
        return {"job_id": str(parent.pk), "status": "superseded"}
    parent.refresh_from_db()
    if parent.stream:
        stream_announce_done(job_id=parent.pk)
    longform_delete_segment_audio(parent=parent, segments=segments)
    job_finished(job=parent, status=JobStatus.SUCCEEDED)
    log.info("long-form job %s: %d segments joined", parent.pk, len(segments))
    return {"job_id": str(parent.pk), "status": "succeeded"}


def _read_all(
    parent: Job, segments: list[Job], *, source_rate: int, target_rate: int
) -> Iterator[np.ndarray]:
    storage = get_storage()
    for segment in segments:
        raw = storage.get(bucket=parent.tenant.bucket, key=segment.output_key)
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767.0
        yield resample_for_engine(samples, source_rate, target_rate)


def _gain(segments: Iterator[np.ndarray], *, rate: int) -> float:
    """One gain for the whole: to TARGET_LUFS, capped so the peak stays at -1 dBFS.

    Integrated loudness is the energy mean of the segments' loudness weighted by
    length (BS.1770's gating is applied per segment); segments shorter than the
    meter's 400 ms block only count towards the peak."""
    # Imported here: pyloudnorm brings scipy.signal and scipy.stats, a second of
    # start-up for every worker and web process that never joins a long text.
    import pyloudnorm

    peak = 0.0
    energy = 0.0
    length = 0
    meter = pyloudnorm.Meter(rate)
    for samples in segments:
        peak = max(peak, float(np.max(np.abs(samples))) if len(samples) else 0.0)
        if len(samples) < rate * meter.block_size:
            continue
        loudness = meter.integrated_loudness(samples.astype(np.float64))
        if math.isfinite(loudness):
            energy += len(samples) * 10 ** (loudness / 10)
            length += len(samples)
    if peak <= 0:
        return 1.0
    gain = TARGET_PEAK / peak
    if length and energy > 0:
        loudness = 10 * math.log10(energy / length)
        gain = min(gain, 10 ** ((TARGET_LUFS - loudness) / 20))
    return gain


def _write(
    segments: Iterator[np.ndarray], *, gain: float, format: str, rate: int
) -> tuple[bytes, int]:
    """The encoded file and its length in frames, written block by block."""
    pause = np.zeros(round(PAUSE_S * rate), dtype=np.float32)
    frames = 0
    with tempfile.TemporaryFile() as handle:
        if format == "pcm":
            writer: Any = None
        else:
            container, subtype = _SOUNDFILE_FORMATS[format]
            writer = sf.SoundFile(
                handle, "w", samplerate=rate, channels=1, format=container, subtype=subtype
            )
        try:
            for index, samples in enumerate(segments):
                parts = [pause, samples] if index else [samples]
                for part in parts:
                    scaled = np.clip(part * np.float32(gain), -1.0, 1.0)
                    frames += len(scaled)
                    for start in range(0, len(scaled), _BLOCK):
                        block = scaled[start : start + _BLOCK]
                        if writer is None:
                            handle.write(np.round(block * 32767).astype("<i2").tobytes())
                        else:
                            writer.write(block)
            if format == "opus":  # see OPUS_TAIL_S
                tail = np.zeros(round(OPUS_TAIL_S * rate), dtype=np.float32)
                writer.write(tail)
                frames += len(tail)
        finally:
            if writer is not None:
                writer.close()
        handle.seek(0)
        return handle.read(), frames
