from __future__ import annotations

from django.contrib import admin

from chorus.admin_paging import EstimatedCountPaginator
from quotas.models import LedgerEntry, UsagePeriod
from tenants.admin_filters import TenantFilter, TenantFilterMedia


@admin.register(UsagePeriod)
class UsagePeriodAdmin(TenantFilterMedia, admin.ModelAdmin):
    # The period's totals outlive its jobs (row retention prunes those), so this
    # list is where past months' usage is read.
    list_display = [
        "tenant",
        "starts_at",
        "ends_at",
        "characters_used",
        "characters_reserved",
        "jobs_succeeded",
        "jobs_failed",
        "jobs_cancelled",
        "audio_ms",
    ]
    list_filter = [TenantFilter]
    readonly_fields = [f.name for f in UsagePeriod._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False  # periods are opened by the quota service

    # The quota service moves the counters with in-place updates; a save from this
    # page would write back the values it read, losing any move made meanwhile.
    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False  # the month's billing record; it outlives its jobs and ledger


@admin.register(LedgerEntry)
class LedgerEntryAdmin(TenantFilterMedia, admin.ModelAdmin):
    list_display = ["created_at", "tenant", "kind", "characters", "job"]
    list_filter = ["kind", TenantFilter]
    # Two rows per job, for ever: see `chorus.admin_paging`.
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    readonly_fields = [f.name for f in LedgerEntry._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False  # the ledger is written by the quota service only

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: object, obj: object = None) -> bool:
        return False  # the detail behind a period's totals, pruned with its job only
