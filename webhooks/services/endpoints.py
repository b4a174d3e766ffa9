"""A tenant's webhook endpoints: create, change, rotate the secret, delete; and
the operator's re-sealing of every secret under a new CHORUS_SECRET_KEY."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from audit.models import EventType
from audit.services import audit_record, changes
from chorus.sealing import SealBroken, reseal
from tenants.locks import tenant_lock
from tenants.models import Tenant
from webhooks.addresses import url_check
from webhooks.errors import UnknownEventType, WebhookEndpointsFull
from webhooks.models import EVENT_TYPES, WebhookEndpoint
from webhooks.signing import secret_generate


def endpoint_create(
    *,
    tenant: Tenant,
    url: str,
    event_types: Sequence[str] | None = None,
    enabled: bool = True,
    description: str = "",
    url_checked: bool = False,
) -> WebhookEndpoint:
    # The address is checked now for a clear answer, and again at every delivery
    # (DNS changes; the check that protects is the one at connection time).
    # `url_checked`: the caller has just checked it, outside any transaction (the
    # admin; a DNS answer awaited inside one would hold SQLite's write lock).
    if not url_checked:
        url_check(url)
    types = _event_types(event_types)
    with transaction.atomic():
        tenant_lock(tenant.pk)  # two creates at once cannot both pass the cap
        count = WebhookEndpoint.objects.filter(tenant=tenant).count()
        if count >= settings.WEBHOOK_MAX_ENDPOINTS:
            raise WebhookEndpointsFull(
                f"You have {count} webhook endpoints, the most allowed; delete one first.",
                details={"limit": settings.WEBHOOK_MAX_ENDPOINTS, "value": count},
            )
        endpoint = WebhookEndpoint(
            tenant=tenant,
            url=url.strip(),
            event_types=types,
            enabled=enabled,
            description=description,
        )
        endpoint.secret = secret_generate()
        endpoint.save()
        audit_record(
            type=EventType.ENDPOINT_CREATED,
            tenant_id=tenant.pk,
            target=f"webhook_endpoint:{endpoint.pk}",
            data=_fields(endpoint),
        )
        return endpoint


def endpoint_update(
    *,
    tenant: Tenant,
    endpoint: WebhookEndpoint,
    url: str | None = None,
    event_types: Sequence[str] | None = None,
    enabled: bool | None = None,
    description: str | None = None,
    url_checked: bool = False,
) -> WebhookEndpoint:
    assert endpoint.tenant_id == tenant.pk
    # As stored: the admin's form has put its new values on `endpoint` already.
    before = _fields(WebhookEndpoint.objects.get(pk=endpoint.pk))
    if url is not None:
        if not url_checked:  # as in `endpoint_create`
            url_check(url)
        endpoint.url = url.strip()
    if event_types is not None:
        endpoint.event_types = _event_types(event_types)
    if enabled is not None:
        endpoint.enabled = enabled
    if description is not None:
        endpoint.description = description
    with transaction.atomic():
        endpoint.save()
        changed = changes(before, _fields(endpoint))
        if changed:
            audit_record(
                type=EventType.ENDPOINT_UPDATED,
                tenant_id=tenant.pk,
                target=f"webhook_endpoint:{endpoint.pk}",
                data=changed,
            )
    return endpoint


def _fields(endpoint: WebhookEndpoint) -> dict[str, object]:
    """What the audit trail says of an endpoint: never its secret."""
    return {
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "enabled": endpoint.enabled,
        "description": endpoint.description,
    }


def endpoint_rotate_secret(*, tenant: Tenant, endpoint: WebhookEndpoint) -> WebhookEndpoint:
    """A new secret at once; deliveries from now on are signed with it only."""
    assert endpoint.tenant_id == tenant.pk
    endpoint.secret = secret_generate()
    with transaction.atomic():
        endpoint.save(update_fields=["secret_sealed", "updated_at"])
        audit_record(
            type=EventType.ENDPOINT_SECRET_ROTATED,
            tenant_id=tenant.pk,
            target=f"webhook_endpoint:{endpoint.pk}",
        )
    return endpoint


def endpoint_delete(*, tenant: Tenant, endpoint: WebhookEndpoint) -> None:
    """Its deliveries and their log go with it; pending ones are never sent."""
    assert endpoint.tenant_id == tenant.pk
    with transaction.atomic():
        audit_record(
            type=EventType.ENDPOINT_DELETED,
            tenant_id=tenant.pk,
            target=f"webhook_endpoint:{endpoint.pk}",
            data={"url": endpoint.url},
        )
        endpoint.delete()


@dataclass
class Resealed:
    resealed: int = 0
    current: int = 0  # already sealed under the current key
    broken: list[uuid.UUID] = field(default_factory=list)  # no configured key opens them


# Endpoints read per query by `endpoint_secrets_reseal`.
RESEAL_PAGE = 500


def endpoint_secrets_reseal(*, dry_run: bool = False) -> Resealed:
    """Seal every endpoint's secret under the current CHORUS_SECRET_KEY (after a
    key change, with the former key in CHORUS_SECRET_KEY_FALLBACKS), so that the
    former key can then be dropped. `dry_run` counts without writing.

    Each row is written only if its sealed value is still the one read: a secret
    the tenant rotated meanwhile is already sealed under the current key, and is
    never put back."""
    report = Resealed()
    after: uuid.UUID | None = None
    while True:
        page = WebhookEndpoint.objects.order_by("pk")
        if after is not None:
            page = page.filter(pk__gt=after)
        rows = list(page.values_list("pk", "secret_sealed")[:RESEAL_PAGE])
        for pk, sealed in rows:
            try:
                fresh = reseal(sealed)
            except SealBroken:
                report.broken.append(pk)
                continue
            if fresh is None:
                report.current += 1
            elif dry_run or WebhookEndpoint.objects.filter(pk=pk, secret_sealed=sealed).update(
                secret_sealed=fresh
            ):
                report.resealed += 1
            else:  # rotated meanwhile, under the current key
                report.current += 1
        if len(rows) < RESEAL_PAGE:
            return report
        after = rows[-1][0]


def _event_types(requested: Sequence[str] | None) -> list[str]:
    if requested is None:
        return list(EVENT_TYPES)
    unknown = sorted(set(requested) - set(EVENT_TYPES))
    if unknown:
        raise UnknownEventType(
            f"Unknown event type: {', '.join(unknown)}.",
            details={"unknown": unknown, "known": list(EVENT_TYPES)},
        )
    if not requested:
        raise UnknownEventType(
            "Subscribe to at least one event type.", details={"known": list(EVENT_TYPES)}
        )
    return sorted(set(requested), key=EVENT_TYPES.index)
