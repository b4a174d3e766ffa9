from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from batches.models import Batch, BatchItem


class BatchItemInline(admin.TabularInline):
    model = BatchItem
    fields = ("index", "custom_id", "job", "job_status", "metadata")
    readonly_fields = fields
    raw_id_fields = ["job"]
    can_delete = False
    extra = 0
    show_change_link = False

    @admin.display(description="status")
    def job_status(self, item: BatchItem) -> str:
        return item.job.status

    # Items are made by `batch_create`, with their jobs and charges; a form can do neither.
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "status",
        "priority",
        "item_count",
        "characters",
        "archive_status",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "archive_status", "priority"]
    search_fields = ["=id"]
    list_select_related = ["tenant"]
    readonly_fields = [f.name for f in Batch._meta.fields]
    inlines = [BatchItemInline]

    def get_queryset(self, request: HttpRequest):  # type: ignore[no-untyped-def]
        return super().get_queryset(request).prefetch_related("items__job")

    # A batch is submitted through the API (checked, charged, run), ended by its
    # items or a cancel, never edited by hand.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    # Its items' grouping, manifest and archive would go; the jobs stay either way.
    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
