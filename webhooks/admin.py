from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from chorus.admin_network import ChecksBeforeTransaction, NetworkCheckedForm
from chorus.admin_paging import EstimatedCountPaginator
from chorus.admin_services import ServiceSaves, take_saved
from chorus.errors import ChorusError
from chorus.sealing import SealBroken
from webhooks.addresses import url_check
from webhooks.errors import WebhookEndpointDisabled
from webhooks.models import EVENT_TYPES, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhooks.services.deliveries import delivery_redeliver
from webhooks.services.endpoints import endpoint_create, endpoint_update


class EndpointForm(NetworkCheckedForm):
    url = forms.URLField(max_length=2000, assume_scheme="https")
    event_types = forms.MultipleChoiceField(
        choices=[(name, name) for name in EVENT_TYPES], widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["tenant", "url", "event_types", "enabled", "description"]

    def clean_url(self) -> str:
        url: str = self.cleaned_data["url"]
        try:
            # The same check as the API's (it resolves the host); deliveries
            # check again. In the admin, before its transaction opens.
            self.checked_once(("url", url), lambda: url_check(url))
        except ChorusError as exc:
            raise ValidationError(exc.message) from None
        return url


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ServiceSaves, ChecksBeforeTransaction):
    form = EndpointForm
    list_display = ["url", "tenant", "enabled", "event_types", "created_at"]
    list_filter = ["enabled", "tenant"]
    search_fields = ["url"]
    readonly_fields = ["signing_secret", "created_at", "updated_at"]

    @admin.display(description="secret")
    def signing_secret(self, obj: WebhookEndpoint) -> str:
        """Shown to operators (who hand a secret made here to the tenant); sealed
        in the database."""
        if not obj.secret_sealed:
            return "(made when the endpoint is saved)"
        try:
            return obj.secret
        except SealBroken as exc:
            return f"cannot be read: {exc}"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # Moved to another tenant, an endpoint would pass that tenant's cap by.
        if obj is not None:
            return ["tenant", *self.readonly_fields]
        return self.readonly_fields

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        data = form.cleaned_data
        fields = {
            "url": data["url"],
            "event_types": data["event_types"],
            "enabled": data["enabled"],
            "description": data["description"],
            "url_checked": True,  # by the form, before the admin's transaction
        }
        if change:
            endpoint_update(tenant=obj.tenant, endpoint=obj, **fields)
        else:
            take_saved(obj, endpoint_create(tenant=data["tenant"], **fields))


class AttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "number",
        "started_at",
        "latency_ms",
        "response_status",
        "error",
        "response_body",
        "succeeded",
    )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    # Status first, the endpoint by its host and times short (the whole value a
    # hover away): with the URL and Django's long dates the table ran past the
    # edge of a 1280 px screen, status included.
    list_display = ["created", "status", "tries", "event_type", "endpoint_host", "next_attempt"]
    list_filter = ["status"]
    list_select_related = ["event", "endpoint"]
    inlines = [AttemptInline]
    actions = ["redeliver"]
    # One row per event and endpoint, for ever: see `chorus.admin_paging`.
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    readonly_fields = [
        "event",
        "endpoint",
        "status",
        "attempts",
        "next_attempt_at",
        "republished_at",
        "created_at",
        "finished_at",
        "payload",
    ]
    exclude = ["id"]

    @admin.display(description="event")
    def event_type(self, delivery: WebhookDelivery) -> SafeString:
        return format_html(
            '<span title="{}">{}</span>', delivery.event.webhook_id, delivery.event.type
        )

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, delivery: WebhookDelivery) -> SafeString:
        return _short_time(delivery.created_at, "%m-%d %H:%M:%S")

    @admin.display(description="tries", ordering="attempts")
    def tries(self, delivery: WebhookDelivery) -> int:
        return delivery.attempts

    @admin.display(description="next (UTC)", ordering="next_attempt_at")
    def next_attempt(self, delivery: WebhookDelivery) -> SafeString | str:
        if delivery.next_attempt_at is None:
            return "-"
        return _short_time(delivery.next_attempt_at, "%H:%M:%S")

    @admin.display(description="endpoint")
    def endpoint_host(self, delivery: WebhookDelivery) -> SafeString:
        url = delivery.endpoint.url
        host = urlsplit(url).netloc
        return format_html(
            '<span title="{}">{}</span>', url, host if len(host) <= 24 else host[:23] + "…"
        )

    @admin.display(description="event data")
    def payload(self, delivery: WebhookDelivery) -> Any:
        return delivery.event.data

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # deliveries come from events

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Deliver the selected events again (same webhook-id)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        sent = 0
        for delivery in queryset.select_related("endpoint__tenant"):
            endpoint = delivery.endpoint
            try:
                delivery_redeliver(tenant=endpoint.tenant, endpoint=endpoint, delivery=delivery)
                sent += 1
            except WebhookEndpointDisabled:
                self.message_user(
                    request, f"{endpoint.url} is disabled: not redelivered.", messages.WARNING
                )
        self.message_user(request, f"{sent} deliveries queued again.")


def _short_time(at: datetime, form: str) -> SafeString:
    utc = at.astimezone(UTC)
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', utc.isoformat(), utc, utc.strftime(form)
    )
