from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from synthesis.calibration.curve import curve_svg
from synthesis.calibration.models import CalibratedProfile, WorkerLimits


@admin.register(CalibratedProfile)
class CalibratedProfileAdmin(admin.ModelAdmin):
    list_display = ["key_short", "engine", "card", "status", "limits", "curve", "calibrated_at"]
    list_filter = ["status", "engine"]
    readonly_fields = [*(f.name for f in CalibratedProfile._meta.fields), "curve"]

    @admin.display(description="key")
    def key_short(self, obj: CalibratedProfile) -> str:
        return obj.key[:12]

    @admin.display(description="first audio / total by streams")
    def curve(self, obj: CalibratedProfile) -> SafeString | str:
        return curve_svg(obj.document)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # measured by `manage.py calibrate_device` or a worker

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # delete one to have the next worker of that card measure again


class WorkerProfileColumn:
    """The Workers table's column: which profile chose a worker's limits, how,
    and its curve (two subqueries in the list's one query, not one per row)."""

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        queryset: QuerySet[Any] = super().get_queryset(request)  # type: ignore[misc]
        limits = WorkerLimits.objects.filter(worker=OuterRef("name"))
        return queryset.annotate(
            limits_source=Subquery(limits.values("source")[:1]),
            limits_profile=Subquery(limits.values("profile_name")[:1]),
            limits_curve=Subquery(
                CalibratedProfile.objects.filter(
                    key=Subquery(
                        WorkerLimits.objects.filter(worker=OuterRef(OuterRef("name"))).values(
                            "profile_id"
                        )[:1]
                    )
                ).values("document")[:1]
            ),
        )

    @admin.display(description="stream profile")
    def stream_profile(self, obj: Any) -> SafeString | str:
        source = getattr(obj, "limits_source", None)
        if not source:
            return "-"
        return format_html(
            "{} <span class='mini'>{}</span><br>{}",
            source,
            getattr(obj, "limits_profile", "") or "",
            curve_svg(_document(getattr(obj, "limits_curve", None))),
        )


def _document(value: Any) -> dict[str, Any] | None:
    # A JSON column read through a subquery arrives decoded on PostgreSQL and as
    # text on SQLite.
    if isinstance(value, str):
        import json

        return json.loads(value)  # type: ignore[no-any-return]
    return value if isinstance(value, dict) else None
