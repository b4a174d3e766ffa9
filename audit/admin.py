from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Every tenant's events, for staff to read: nothing here adds, changes or deletes."""

    list_display = ["created_at", "type", "tenant", "actor", "target", "source_ip", "request_id"]
    list_filter = ["type"]
    search_fields = ["actor", "target", "request_id", "tenant__slug"]
    list_select_related = ["tenant"]
    date_hierarchy = "created_at"
    actions = None  # not even the bulk delete
    readonly_fields = [
        "created_at",
        "type",
        "tenant",
        "actor",
        "target",
        "request_id",
        "source_ip",
        "data",
    ]
    fields = ["created_at", "type", "tenant", "actor", "target", "request_id", "source_ip", "data"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
