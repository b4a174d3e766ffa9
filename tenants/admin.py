from __future__ import annotations

from datetime import timedelta
from typing import Any
from weakref import WeakKeyDictionary

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from chorus.admin_format import human_bytes
from chorus.admin_network import ChecksBeforeTransaction, NetworkCheckedForm
from chorus.admin_services import ServiceSaves, take_saved
from chorus.errors import StorageError
from quotas.selectors import daily_characters, usage_summary
from tenants.admin_filters import TenantFilter, TenantFilterMedia
from tenants.models import SCOPES, ApiKey, Plan, Tenant
from tenants.services import (
    api_key_create,
    api_key_revoke,
    api_key_update,
    plan_record_change,
    tenant_bucket_provision,
    tenant_create,
    tenant_update,
)


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "monthly_characters",
        "max_text_chars",
        "max_longform_chars",
        "requests_per_minute",
        "max_concurrent_jobs",
        "voice_slots",
        "allowed_priorities",
        "batch_max_items",
        "batch_max_characters",
        "require_voice_consent",
    ]

    def save_model(self, request: HttpRequest, obj: Plan, form: Any, change: bool) -> None:
        before = Plan.objects.get(pk=obj.pk) if change else None  # the row as stored
        super().save_model(request, obj, form, change)  # in the admin's transaction
        plan_record_change(plan=obj, before=before)


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ["name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["name", "prefix", "scopes", "created_at", "last_used_at", "revoked_at"]
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are created on the API key page, which shows the key once


class TenantForm(NetworkCheckedForm):
    class Meta:
        model = Tenant
        fields = ["slug", "name", "active", "plan", "limit_overrides", "billing_anchor"]

    def full_clean(self) -> None:
        super().full_clean()
        # A new tenant's bucket is made once the whole form is valid (the slug's
        # own check is the model's, run last) and before its row is saved, as
        # `tenant_create` does; unavailable storage is then a form error, not a
        # failed save. An orphan empty bucket is harmless and reused. In the
        # admin, before its transaction opens (`chorus.admin_network`).
        if self.is_bound and self.instance.pk is None and not self.errors:
            slug = self.cleaned_data["slug"]
            try:
                self.instance.bucket = self.checked_once(
                    ("bucket", slug), lambda: tenant_bucket_provision(slug=slug)
                )
            except StorageError as exc:
                self.add_error(None, exc.message)


# The bars of the 30-day chart that carry a date under them (0 is 29 days ago).
DATE_LABELS = (0, 7, 14, 21, 29)


@admin.register(Tenant)
class TenantAdmin(ServiceSaves, ChecksBeforeTransaction):
    form = TenantForm
    list_display = ["slug", "name", "plan", "active", "bucket", "created_at"]
    list_filter = ["active", "plan"]
    search_fields = ["slug", "name"]
    readonly_fields = ["bucket", "created_at", "usage", "daily_characters_chart"]
    inlines = [ApiKeyInline]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting a tenant would orphan its bucket and its billing record;
        # operators deactivate tenants instead.
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Tenant | None = None) -> Any:
        # The slug named the bucket when the tenant was made; renamed, it would
        # free its old name for a new tenant whose bucket then collides.
        if obj is not None:
            return ["slug", *self.readonly_fields]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        data = form.cleaned_data
        fields = {
            "name": data["name"],
            "active": data["active"],
            "plan": data["plan"],
            "limit_overrides": data["limit_overrides"],
            "billing_anchor": data["billing_anchor"],
        }
        if change:
            tenant_update(tenant=obj, **fields)
        else:  # the form made the bucket, before the admin's transaction
            take_saved(obj, tenant_create(slug=data["slug"], bucket=obj.bucket, **fields))

    @admin.display(description="Usage this period")
    def usage(self, obj: Tenant) -> SafeString | str:
        if obj.pk is None:
            return "-"
        # The stored tenant's: a refused form redrawn carries its values on `obj`,
        # the overrides that failed validation too.
        u = usage_summary(tenant=Tenant.objects.select_related("plan").get(pk=obj.pk))
        rows = [
            ("Period", f"{u['period']['starts_at']:%Y-%m-%d} to {u['period']['ends_at']:%Y-%m-%d}"),
            (
                "Characters",
                f"{u['characters']['used']} used, {u['characters']['reserved']} reserved "
                f"of {u['characters']['limit']}",
            ),
            ("Jobs", ", ".join(f"{k} {v}" for k, v in u["jobs"].items())),
            ("Audio generated", f"{u['audio_seconds']} s"),
            ("Voices", f"{u['voices']['used']} of {u['voices']['limit']}"),
            (
                "Storage",
                f"{human_bytes(u['storage_bytes']['used'])} of "
                f"{human_bytes(u['storage_bytes']['limit'])}",
            ),
        ]
        return format_html(
            "<table>{}</table>",
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description="Characters per day (last 30 days)")
    def daily_characters_chart(self, obj: Tenant) -> SafeString | str:
        if obj.pk is None:
            return "-"
        since = timezone.now().date() - timedelta(days=29)
        days = dict(daily_characters(tenant=obj, since=since))
        series = [
            (since + timedelta(days=i), days.get(since + timedelta(days=i), 0)) for i in range(30)
        ]
        peak = max((n for _, n in series), default=0) or 1
        bars = format_html_join(
            "",
            '<rect x="{}" y="{}" width="10" height="{}" fill="#417690">'
            "<title>{}: {} characters</title></rect>",
            (
                (i * 12, 100 - round(90 * n / peak), round(90 * n / peak), day, n)
                for i, (day, n) in enumerate(series)
            ),
        )
        # Dates under the first bar, every seventh and the last (today), in UTC;
        # not the 28th bar's, whose label (30 px at 10 px) would run into today's.
        dates = format_html_join(
            "",
            '<text x="{}" y="116" font-size="10" text-anchor="{}">{}</text>',
            (
                (i * 12 + (10 if i == 29 else 0), "end" if i == 29 else "start", f"{day:%m-%d}")
                for i, (day, _) in enumerate(series)
                if i in DATE_LABELS
            ),
        )
        return format_html(
            '<svg width="364" height="120" role="img" aria-label="characters per day">'
            '{}<line x1="0" x2="360" y1="100.5" y2="100.5" stroke="#888"/>{}'
            '<text x="0" y="10" font-size="10">peak {} characters/day (UTC days)</text></svg>',
            bars,
            dates,
            peak,
        )


class ApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in SCOPES],
        widget=forms.CheckboxSelectMultiple,
        initial=list(SCOPES),
    )

    class Meta:
        model = ApiKey
        fields = ["tenant", "name", "scopes", "requests_per_minute"]


# A new key's raw value, held only while the request that made it is answered:
# `save_model` makes the key, `response_add` shows it. Nothing else keeps it.
_raw_keys: WeakKeyDictionary[HttpRequest, str] = WeakKeyDictionary()


@admin.register(ApiKey)
class ApiKeyAdmin(ServiceSaves, TenantFilterMedia, admin.ModelAdmin):
    form = ApiKeyForm
    list_display = [
        "__str__",
        "tenant",
        "name",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = [TenantFilter, ("revoked_at", admin.EmptyFieldListFilter)]
    # A search box for the key's tenant, not a drop-down of every tenant.
    autocomplete_fields = ["tenant"]
    search_fields = ["prefix", "name", "tenant__slug"]
    fields = [
        "tenant",
        "name",
        "scopes",
        "requests_per_minute",
        "prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> Any:
        if obj is not None:  # a key's tenant never changes
            return [*self.readonly_fields, "tenant"]
        return self.readonly_fields

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        data = form.cleaned_data
        fields = {
            "name": data["name"],
            "scopes": data["scopes"],
            "requests_per_minute": data["requests_per_minute"],
        }
        if change:
            api_key_update(api_key=obj, **fields)
            return
        key, raw = api_key_create(tenant=data["tenant"], **fields)
        take_saved(obj, key)  # the admin logs and answers with `obj`
        _raw_keys[request] = raw

    def response_add(
        self, request: HttpRequest, obj: ApiKey, post_url_continue: str | None = None
    ) -> HttpResponse:
        """Show the new key in the answer to the POST that made it, whichever save
        button was pressed; the usual redirect would need the key kept somewhere
        (the session, a message) until the next page loads."""
        raw = _raw_keys.pop(request)
        opts = self.opts
        response = TemplateResponse(
            request,
            "admin/tenants/apikey/key_created.html",
            {
                **self.admin_site.each_context(request),
                "title": "API key added",
                "subtitle": None,
                "opts": opts,
                "app_label": opts.app_label,
                "original": obj,
                "raw_key": raw,
                "is_popup": IS_POPUP_VAR in request.POST,
            },
        )
        # Rendered here, inside the add view's transaction: a page that fails to
        # render undoes the key instead of leaving one nobody has seen.
        response.render()
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(api_key=key)
            count += 1
        messages.success(request, f"Revoked {count} key(s).")
