from __future__ import annotations

import json
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from batches.models import ArchiveStatus, Batch, BatchItem, BatchStatus
from chorus.api.serializers import ModelOutput, StrictInput
from synthesis.api.serializers import JobError
from synthesis.audio_out import OUTPUT_SAMPLE_RATES
from synthesis.engines.base import MAX_SPEED, MIN_SPEED
from synthesis.models import AudioFormat, JobStatus, Priority
from synthesis.services.jobs import job_download_url

# A client's own data on an item, given back in the manifest: a small JSON object.
MAX_METADATA_BYTES = 2048


@extend_schema_serializer(component_name="BatchItemCreate")
class BatchItemInput(StrictInput):
    text = serializers.CharField(trim_whitespace=True, help_text="The text to speak.")
    voice_id = serializers.UUIDField(required=False, allow_null=True, default=None)
    format = serializers.ChoiceField(choices=AudioFormat.choices, default=AudioFormat.WAV)
    sample_rate = serializers.ChoiceField(
        choices=OUTPUT_SAMPLE_RATES, required=False, allow_null=True, default=None
    )
    speed = serializers.FloatField(default=1.0, min_value=MIN_SPEED, max_value=MAX_SPEED)
    instruction = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500
    )
    reuse = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="As for POST /v1/speech: true takes an earlier identical result from any "
        "engine, false never, empty where the engine is deterministic.",
    )
    custom_id = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64, help_text="Your own id."
    )
    id = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=64, help_text="As custom_id."
    )
    metadata = serializers.DictField(
        required=False,
        default=dict,
        help_text=f"Your data, given back in the manifest: a JSON object of at most "
        f"{MAX_METADATA_BYTES} bytes.",
    )

    def validate_metadata(self, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_METADATA_BYTES:
            raise serializers.ValidationError(
                f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES} are kept."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["id"] and attrs["custom_id"] and attrs["id"] != attrs["custom_id"]:
            raise serializers.ValidationError({"custom_id": "Give id or custom_id, not both."})
        attrs["custom_id"] = attrs.pop("id") or attrs["custom_id"]
        return attrs


@extend_schema_serializer(component_name="BatchCreate")
class BatchCreateInput(StrictInput):
    items = serializers.ListField(
        child=serializers.JSONField(),
        allow_empty=False,
        help_text="The speech jobs, each as a BatchItemCreate object.",
    )
    priority = serializers.ChoiceField(
        choices=Priority.choices,
        default=Priority.LOW,
        help_text="Of every item: low by default (bulk work); your plan says which you may use.",
    )


class BatchArchive(serializers.Serializer):
    status = serializers.ChoiceField(choices=ArchiveStatus.choices)  # type: ignore[assignment]
    url = serializers.URLField(allow_null=True, help_text="Signed, expiring link to the zip.")
    expires_at = serializers.DateTimeField(allow_null=True)
    bytes = serializers.IntegerField(allow_null=True)


class BatchItemOutput(ModelOutput):
    job_id = serializers.UUIDField(read_only=True)
    status = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    audio_url = serializers.SerializerMethodField()
    audio_url_expires_at = serializers.SerializerMethodField()

    class Meta:
        model = BatchItem
        fields = [
            "index",
            "custom_id",
            "metadata",
            "job_id",
            "status",
            "error",
            "audio_url",
            "audio_url_expires_at",
        ]
        read_only_fields = fields

    def _link(self, item: BatchItem) -> Any:
        cache = self.context.setdefault("_links", {})
        if item.pk not in cache:
            cache[item.pk] = job_download_url(job=item.job)
        return cache[item.pk]

    @extend_schema_field(serializers.ChoiceField(choices=JobStatus.choices))
    def get_status(self, item: BatchItem) -> str:
        return item.job.status

    @extend_schema_field(JobError(allow_null=True))
    def get_error(self, item: BatchItem) -> dict[str, str] | None:
        job = item.job
        return {"code": job.error_code, "message": job.error_message} if job.error_code else None

    @extend_schema_field(OpenApiTypes.URI)
    def get_audio_url(self, item: BatchItem) -> str | None:
        link = self._link(item)
        return link[0] if link else None

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_audio_url_expires_at(self, item: BatchItem) -> str | None:
        link = self._link(item)
        return link[1].isoformat() if link else None


class BatchCounts(serializers.Serializer):
    pending = serializers.IntegerField()
    queued = serializers.IntegerField()
    running = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()


class BatchOutput(ModelOutput):
    status = serializers.ChoiceField(choices=BatchStatus.choices, read_only=True)
    counts = serializers.SerializerMethodField()
    archive = serializers.SerializerMethodField()

    class Meta:
        model = Batch
        fields = [
            "id",
            "status",
            "priority",
            "item_count",
            "characters",
            "counts",
            "archive",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    @extend_schema_field(BatchCounts)
    def get_counts(self, batch: Batch) -> dict[str, int]:
        counts: dict[str, int] = self.context["counts"][batch.pk]
        return counts

    @extend_schema_field(BatchArchive)
    def get_archive(self, batch: Batch) -> dict[str, Any]:
        link = self.context["archive_link"](batch)
        return {
            "status": batch.archive_status,
            "url": link[0] if link else None,
            "expires_at": link[1].isoformat() if link else None,
            "bytes": batch.archive_bytes,
        }


class BatchItemPage(serializers.Serializer):
    next = serializers.URLField(allow_null=True, help_text="The next items; null at the end.")
    results = BatchItemOutput(many=True)


class BatchManifest(BatchOutput):
    items = serializers.SerializerMethodField()

    class Meta(BatchOutput.Meta):
        fields = [*BatchOutput.Meta.fields, "items"]
        read_only_fields = fields

    @extend_schema_field(BatchItemPage)
    def get_items(self, batch: Batch) -> dict[str, Any]:
        page = self.context["items_page"]
        return {
            "next": page["next"],
            "results": BatchItemOutput(page["rows"], many=True, context=self.context).data,
        }


class BatchPage(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = BatchOutput(many=True)
