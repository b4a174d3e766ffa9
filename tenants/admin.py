from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from synthesis.storage_runtime import get_storage
from tenants.keys import generate_key
from tenants.models import ApiKey, Plan, Tenant
from tenants.services import api_key_revoke


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["name", "max_text_chars", "max_upload_bytes", "link_ttl_seconds"]


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are created on the API key page, which shows the key once


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "plan", "active", "bucket", "created_at"]
    list_filter = ["active", "plan"]
    search_fields = ["slug", "name"]
    readonly_fields = ["bucket", "created_at"]
    inlines = [ApiKeyInline]

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        if not change:
            storage = get_storage()
            obj.bucket = storage.bucket_for(obj.slug)
            storage.ensure_bucket(obj.bucket)
        super().save_model(request, obj, form, change)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "tenant", "name", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["prefix", "name", "tenant__slug"]
    fields = ["tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is not None:  # a key's tenant never changes
            return [*self.readonly_fields, "tenant"]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        new = generate_key()
        obj.prefix, obj.key_hash = new.prefix, new.key_hash
        super().save_model(request, obj, form, change)
        messages.warning(
            request,
            f"New API key for {obj.tenant.slug}: {new.raw} — copy it now; it is not stored "
            "and cannot be shown again.",
        )

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(api_key=key)
            count += 1
        messages.success(request, f"Revoked {count} key(s).")
