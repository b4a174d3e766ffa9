from __future__ import annotations

from django.contrib import admin

from synthesis.models import Job, Voice


@admin.register(Voice)
class VoiceAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "language",
        "duration_s",
        "sample_rate",
        "version",
        "created_at",
    ]
    list_filter = ["tenant", "language"]
    search_fields = ["name", "id"]
    readonly_fields = [f.name for f in Voice._meta.fields]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "tenant",
        "status",
        "priority",
        "characters",
        "duration_s",
        "engine",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "priority", "tenant", "engine"]
    search_fields = ["id", "text"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Job._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False  # jobs are submitted through the API, which enforces the plan
