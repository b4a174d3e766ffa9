from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from chorus.admin_format import human_bytes, span_seconds
from chorus.admin_paging import EstimatedCountPaginator
from chorus.errors import ChorusError
from synthesis.calibration.admin import WorkerProfileColumn
from synthesis.engines import ENGINE_NAMES
from synthesis.heartbeat import worker_is_alive
from synthesis.models import Job, Voice, VoiceConsent, WorkerHeartbeat
from synthesis.services.jobs import job_download_url
from synthesis.services.voices import voice_delete
from tenants.admin_filters import TenantFilter, TenantFilterMedia

# The landing page for staff: the operator's overview above the app list
# (`synthesis.overview`, rendered by the `overview` template tag).
admin.site.index_template = "admin/chorus_index.html"


def _seconds(value: datetime | None) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


class EngineFilter(admin.SimpleListFilter):
    """The engines there are, not a DISTINCT over every job's engine column."""

    title = "engine"
    parameter_name = "engine"

    def lookups(self, request: HttpRequest, model_admin: object) -> list[tuple[str, str]]:
        return [(name, name) for name in ENGINE_NAMES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(engine=self.value()) if self.value() else queryset


class VoiceConsentInline(admin.StackedInline):
    model = VoiceConsent
    fk_name = "voice"
    fields = ["speaker_name", "method", "given_at", "evidence_key", "created_at"]
    readonly_fields = ["speaker_name", "method", "given_at", "evidence_key", "created_at"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(VoiceConsent)
class VoiceConsentAdmin(TenantFilterMedia, admin.ModelAdmin):
    """Consent records, those of deleted voices too (their tombstones): read only,
    kept as the proof a voice was cloned with the speaker's agreement."""

    list_display = [
        "voice_name",
        "tenant",
        "speaker_name",
        "method",
        "given_at",
        "voice_created_at",
        "voice_deleted_at",
    ]
    list_filter = [TenantFilter, "method", ("voice_deleted_at", admin.EmptyFieldListFilter)]
    search_fields = ["voice_name", "speaker_name", "voice_uuid"]
    readonly_fields = [f.name for f in VoiceConsent._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Voice)
class VoiceAdmin(TenantFilterMedia, admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "language",
        "duration_s",
        "sample_rate",
        "version",
        "created_at",
    ]
    list_filter = [TenantFilter, "language"]
    search_fields = ["name", "id"]
    readonly_fields = [f.name for f in Voice._meta.fields]
    inlines = [VoiceConsentInline]

    # A voice is a recording that `voice_create` decodes, checks against the plan
    # and stores; a form of its columns can do none of that (its save failed on
    # NOT NULL columns). Voices are uploaded with `POST /v1/voices`.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # Every column describes the stored recording; a new recording is a new upload.
    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    # Deleting goes through the service, so the stored recording goes too.
    def delete_model(self, request: HttpRequest, obj: Voice) -> None:
        voice_delete(tenant=obj.tenant, voice=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Voice]) -> None:
        for voice in queryset.select_related("tenant"):
            voice_delete(tenant=voice.tenant, voice=voice)


SEGMENTS_OF = "parent__exact"  # the list's parameter: a long text's segments


class _JobsPaginator(EstimatedCountPaginator):
    base_filter = {"parent__isnull": True}


class _JobChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        queryset = super().get_queryset(request, exclude_parameters)
        if SEGMENTS_OF in self.params or self.query:
            return queryset
        return queryset.filter(parent__isnull=True)


@admin.register(Job)
class JobAdmin(TenantFilterMedia, admin.ModelAdmin):
    # Jobs as tenants see them: a long text is one job; its segments are listed
    # from its page (`segments`), or found by their id.
    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _JobChangeList

    list_display = [
        "id",
        "tenant",
        "status",
        "priority",
        "characters",
        "duration_s",
        "engine",
        "error_code",
        "created",
        "finished",
    ]
    # Fixed choices only: no filter reads every tenant or every job to list its own.
    list_filter = ["status", "priority", TenantFilter, EngineFilter]
    # Jobs are the one table that grows for ever: no exact count of the whole table,
    # no date drill-down (a DISTINCT over every job's date), and search by exact id
    # (a substring search over every job's text is a full scan).
    paginator = _JobsPaginator
    show_full_result_count = False
    search_fields = ["id"]
    search_help_text = "A job's id, exactly."
    readonly_fields = [*(f.name for f in Job._meta.fields), "timings", "audio", "segments"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.none(), False

    # Seconds matter here: queue waits and first audio are seconds long.
    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Job) -> str:
        return _seconds(obj.created_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: Job) -> str:
        return _seconds(obj.finished_at)

    @admin.display(description="timings")
    def timings(self, obj: Job) -> SafeString:
        # As the API's `timings`: first audio counts from the start, not the submit.
        rows = [
            ("Queue wait", span_seconds(obj.created_at, obj.started_at)),
            ("First audio", span_seconds(obj.started_at, obj.first_audio_at)),
            ("Total", span_seconds(obj.created_at, obj.finished_at)),
            ("Submitted", _seconds(obj.created_at)),
            ("Started", _seconds(obj.started_at)),
            ("First audio at", _seconds(obj.first_audio_at)),
            ("Finished", _seconds(obj.finished_at)),
        ]
        return format_html(
            "<table>{}</table>",
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description="segments")
    def segments(self, obj: Job) -> SafeString | str:
        if not obj.is_longform:
            return "-"
        url = reverse("admin:synthesis_job_changelist")
        return format_html(
            '<a href="{}?{}={}">{} segments</a>', url, SEGMENTS_OF, obj.pk, obj.segments_total
        )

    @admin.display(description="audio")
    def audio(self, obj: Job) -> SafeString | str:
        try:
            link = job_download_url(job=obj)
        except ChorusError as exc:  # storage unreachable: the page still answers
            return f"no link: {exc.message}"
        if link is None:
            return "-"
        url, expires_at = link
        size = f"{human_bytes(obj.output_bytes)}, " if obj.output_bytes is not None else ""
        return format_html(
            '<a href="{}">Download</a> ({}signed link, expires {})',
            url,
            size,
            _seconds(expires_at),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are submitted through the API, which enforces the plan

    # Workers and the quota service own every column: a save from this page would
    # only write the whole row back over what they wrote meanwhile.
    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        # Jobs go by retention only (audio, then rows), never one by one from here.
        return False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(WorkerProfileColumn, admin.ModelAdmin):
    list_display = [
        "name",
        "node",
        "alive",
        "engine",
        "device",
        "queues",
        "memory_mib",
        "slots_busy",
        "slots",
        "streams_normal",
        "streams_low",
        "stream_profile",
        "jobs_done",
        "jobs_failed",
        "last_error",
        "seen_at",
    ]
    readonly_fields = [f.name for f in WorkerHeartbeat._meta.fields]

    @admin.display(boolean=True, description="alive")
    def alive(self, obj: WorkerHeartbeat) -> bool:
        return worker_is_alive(obj.seen_at, timezone.now())

    @admin.display(description="memory (MiB)")
    def memory_mib(self, obj: WorkerHeartbeat) -> str:
        # The engine's device memory; an engine on the CPU reports none: its process's.
        return f"{(obj.memory_bytes or obj.rss_bytes) / 2**20:.0f}"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # workers report themselves

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # a save would write stale values over the worker's next beat
