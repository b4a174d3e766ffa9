from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from chorus.api.serializers import ModelOutput, StrictInput
from synthesis.audio_out import OUTPUT_SAMPLE_RATES
from synthesis.engines.base import MAX_SPEED, MIN_SPEED
from synthesis.longform.progress import Segments, longform_progress, longform_segments
from synthesis.models import AudioFormat, Job, Priority, Voice
from synthesis.selectors import job_queue_place
from synthesis.services.jobs import job_download_url, job_provenance


# Named VoiceCreateRequest in the schema.
@extend_schema_serializer(component_name="VoiceCreate")
class VoiceCreateInput(StrictInput):
    name = serializers.CharField(max_length=100)
    audio = serializers.FileField(
        # Empty files reach the audio validation, which answers `empty_file`.
        allow_empty_file=True,
        help_text="Reference recording: WAV, FLAC, OGG or MP3; "
        "3-30 s, at least 16 kHz, mono or stereo.",
    )
    transcript = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=2000,
        help_text="What is said in the recording; cloning engines (cosyvoice2) use it.",
    )
    language = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=16, help_text="E.g. en."
    )
    # Parsed by `synthesis.consent.consent_parse` (`invalid_consent`), not here.
    consent = serializers.CharField(
        required=False,
        default=None,
        trim_whitespace=False,
        max_length=2000,
        help_text='The speaker\'s consent, a JSON object: {"speaker_name": "...", "method": '
        '"recorded_statement" | "signed_form" | "terms_of_service" | "self", "given_at": '
        '"2026-03-01T10:00:00Z"}. Required on plans that require consent.',
    )
    consent_evidence = serializers.FileField(
        required=False,
        default=None,
        allow_empty_file=True,
        help_text="A recording of the speaker's consent (audio, 1-120 s); kept privately, "
        "also after the voice is deleted. Only with `consent`.",
    )


class VoiceOutput(ModelOutput):
    class Meta:
        model = Voice
        fields = [
            "id",
            "name",
            "transcript",
            "language",
            "version",
            "audio_format",
            "sample_rate",
            "channels",
            "duration_s",
            "size_bytes",
            "created_at",
        ]
        read_only_fields = fields


# Named SpeechCreateRequest in the schema.
@extend_schema_serializer(component_name="SpeechCreate")
class SpeechCreateInput(StrictInput):
    text = serializers.CharField(trim_whitespace=True, help_text="The text to speak.")
    voice_id = serializers.UUIDField(
        required=False,
        allow_null=True,
        default=None,
        help_text="One of your voices (POST /v1/voices); without it the engine's default "
        "voice speaks.",
    )
    priority = serializers.ChoiceField(
        choices=Priority.choices,
        default=Priority.NORMAL,
        help_text="Which queue: high starts first. Your plan says which you may use.",
    )
    format = serializers.ChoiceField(
        choices=AudioFormat.choices, default=AudioFormat.WAV, help_text="Of the audio."
    )
    sample_rate = serializers.ChoiceField(
        choices=OUTPUT_SAMPLE_RATES,
        required=False,
        allow_null=True,
        default=None,
        help_text="Output rate in Hz; empty means the engine's own (opus: 48000). "
        "opus supports 16000, 24000 and 48000 only.",
    )
    speed = serializers.FloatField(
        default=1.0, min_value=MIN_SPEED, max_value=MAX_SPEED, help_text="1 is natural speed."
    )
    instruction = serializers.CharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=500,
        help_text="A style, emotion or dialect instruction, for engines with an instruct "
        "mode (cosyvoice2); other engines answer 422 instruction_not_supported.",
    )
    stream = serializers.BooleanField(
        default=False,
        help_text="Answer with the audio as it is generated (chunked wav/pcm/opus; mp3 and "
        "flac when done) instead of 202 + job; with 'Accept: text/event-stream', as "
        "server-sent events. The file is still stored and charged.",
    )
    reuse = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Answer from an identical earlier result of yours (no GPU work; characters "
        "charged as usual). Empty: yes for deterministic engines (espeak), no for sampling "
        "ones (cosyvoice2); true: yes for any engine; false: always a fresh run.",
    )
    keep_on_disconnect = serializers.BooleanField(
        default=False,
        help_text="Streams only: if the client disconnects, finish and charge the job "
        "anyway (default: cancel and refund it).",
    )
    language = serializers.ChoiceField(
        choices=[("en", "English"), ("zh", "Chinese"), ("ja", "Japanese")],
        required=False,
        allow_blank=True,
        default="",
        help_text="The text's language, for splitting a long text at sentence ends; "
        "empty means detected from the text.",
    )


class JobTimings(serializers.Serializer):
    queued_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(
        allow_null=True, help_text="A long text's: when its first segment started."
    )
    first_audio_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    queue_wait_s = serializers.FloatField(allow_null=True)
    first_audio_s = serializers.FloatField(
        allow_null=True, help_text="From start of work to first audio."
    )
    total_s = serializers.FloatField(allow_null=True, help_text="From submission to finish.")


class JobVoicePrompt(serializers.Serializer):
    source = serializers.ChoiceField(  # type: ignore[assignment]
        choices=["memory", "storage", "computed"],
        help_text="Where the worker got the prepared voice prompt.",
    )
    seconds = serializers.FloatField(help_text="Time spent getting it.")


class JobQueue(serializers.Serializer):
    position = serializers.IntegerField(help_text="Jobs that start before this one.")
    estimated_start_at = serializers.DateTimeField(
        allow_null=True, help_text="From recent service times and live workers; an estimate."
    )


class JobProgress(serializers.Serializer):
    segments_done = serializers.IntegerField(help_text="Segments synthesized so far.")
    segments_total = serializers.IntegerField(help_text="Segments the text was split into.")
    audio_seconds = serializers.FloatField(help_text="Seconds of audio made so far.")
    estimated_finish_at = serializers.DateTimeField(
        allow_null=True, help_text="From the pace so far; an estimate."
    )


class JobError(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class JobProvenance(serializers.Serializer):
    embedded = serializers.BooleanField(help_text="The C2PA manifest is inside the audio file.")
    sidecar_url = serializers.URLField(
        required=False,
        help_text="Where it is not (opus, pcm): a signed link to its sidecar manifest "
        "(`.c2pa`), valid as long as `audio_url`.",
    )


class JobOutput(ModelOutput):
    voice_id = serializers.UUIDField(allow_null=True, read_only=True)
    requested_sample_rate = serializers.IntegerField(allow_null=True, read_only=True)
    voice_prompt = serializers.SerializerMethodField()
    queue = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    timings = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    audio_url = serializers.SerializerMethodField()
    audio_url_expires_at = serializers.SerializerMethodField()
    provenance = serializers.SerializerMethodField()
    reused_from = serializers.UUIDField(
        source="reused_from_id",
        allow_null=True,
        read_only=True,
        help_text="The earlier job of yours whose audio answered this one "
        "(result reuse: no GPU work); null for a job that ran.",
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "status",
            "text",
            "characters",
            "voice_id",
            "priority",
            "format",
            "speed",
            "instruction",
            "requested_sample_rate",
            "created_at",
            "duration_s",
            "output_bytes",
            "sample_rate",
            "engine",
            "voice_prompt",
            "queue",
            "progress",
            "timings",
            "error",
            "audio_url",
            "audio_url_expires_at",
            "provenance",
            "reused_from",
        ]
        read_only_fields = fields

    def get_fields(self) -> dict[str, Any]:
        # `?fields=` (`job_fields`): the top-level fields asked for, in their order.
        fields = super().get_fields()
        wanted = self.context.get("fields")
        return fields if wanted is None else {k: v for k, v in fields.items() if k in wanted}

    def _segments(self, job: Job) -> Segments | None:
        """A long text's segments, read once for its progress and timings; a list
        passes the whole page's, read together (`longform_segments`)."""
        if not job.is_longform:
            return None
        found = self.context.setdefault("segments", {})
        if job.pk not in found:
            found.update(longform_segments(jobs=[job]))
        return found[job.pk]

    def _link(self, job: Job) -> tuple[str, Any] | None:
        cache = self.context.setdefault("_links", {})
        if job.pk not in cache:
            cache[job.pk] = job_download_url(job=job)
        return cache[job.pk]

    @extend_schema_field(OpenApiTypes.URI)
    def get_audio_url(self, job: Job) -> str | None:
        link = self._link(job)
        return link[0] if link else None

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_audio_url_expires_at(self, job: Job) -> str | None:
        link = self._link(job)
        return link[1].isoformat() if link else None

    @extend_schema_field(JobProvenance(allow_null=True))
    def get_provenance(self, job: Job) -> dict[str, Any] | None:
        return job_provenance(job=job)

    @extend_schema_field(JobQueue(allow_null=True))
    def get_queue(self, job: Job) -> dict[str, Any] | None:
        # A list passes the page's places, read together (see `job_queue_places`).
        places = self.context.get("queue_places")
        place = places.get(job.pk) if places is not None else job_queue_place(job=job)
        if place is None:
            return None
        return {"position": place.position, "estimated_start_at": place.estimated_start_at}

    @extend_schema_field(JobProgress(allow_null=True))
    def get_progress(self, job: Job) -> dict[str, Any] | None:
        """Long-form jobs only (a text split into segments)."""
        segments = self._segments(job)
        return None if segments is None else vars(longform_progress(job=job, segments=segments))

    @extend_schema_field(JobVoicePrompt(allow_null=True))
    def get_voice_prompt(self, job: Job) -> dict[str, Any] | None:
        if not job.prompt_source:
            return None
        return {"source": job.prompt_source, "seconds": job.prompt_seconds}

    @extend_schema_field(JobError(allow_null=True))
    def get_error(self, job: Job) -> dict[str, str] | None:
        if not job.error_code:
            return None
        return {"code": job.error_code, "message": job.error_message}

    @extend_schema_field(JobTimings)
    def get_timings(self, job: Job) -> dict[str, Any]:
        def span(a: Any, b: Any) -> float | None:
            # Never below zero. A reused job is stamped started and finished a
            # moment before its row takes `created_at`; and the submit's stamp is
            # a web host's clock, the others the database's (`chorus.db_clock`).
            return max(0.0, round((b - a).total_seconds(), 3)) if a and b else None

        started_at, first_audio_at = job.started_at, job.first_audio_at
        segments = self._segments(job)
        if segments is not None:  # a long text starts with its first segment
            started_at = segments.started_at
            first_audio_at = first_audio_at or segments.first_audio_at
        return {
            "queued_at": job.created_at,
            "started_at": started_at,
            "first_audio_at": first_audio_at,
            "finished_at": job.finished_at,
            "queue_wait_s": span(job.created_at, started_at),
            "first_audio_s": span(started_at, first_audio_at),
            "total_s": span(job.created_at, job.finished_at),
        }


class _Page(serializers.Serializer):
    next = serializers.URLField(
        allow_null=True, help_text="The next (older) page; null at the end."
    )
    previous = serializers.URLField(
        allow_null=True, help_text="The previous (newer) page; null on the first."
    )


class JobPage(_Page):
    results = JobOutput(many=True)


class VoicePage(_Page):
    count = serializers.IntegerField(help_text="All your voices (your plan bounds them).")
    results = VoiceOutput(many=True)
