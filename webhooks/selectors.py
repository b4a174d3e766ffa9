"""Reading a tenant's webhook endpoints and deliveries (scoped by tenant)."""

from __future__ import annotations

import uuid

from django.db.models import QuerySet

from chorus.errors import NotFound
from tenants.models import Tenant
from webhooks.models import WebhookDelivery, WebhookEndpoint


def endpoint_list(*, tenant: Tenant) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(tenant=tenant)


def endpoint_get(*, tenant: Tenant, endpoint_id: uuid.UUID) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(tenant=tenant, pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound(
            "No webhook endpoint with this id.", details={"endpoint_id": str(endpoint_id)}
        )
    return endpoint


def delivery_list(*, endpoint: WebhookEndpoint) -> QuerySet[WebhookDelivery]:
    """Newest first (paged by `chorus.api.pagination`), each with its event and log."""
    return (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .select_related("event")
        .prefetch_related("log")
    )


def delivery_get(*, endpoint: WebhookEndpoint, delivery_id: uuid.UUID) -> WebhookDelivery:
    delivery = delivery_list(endpoint=endpoint).filter(pk=delivery_id).first()
    if delivery is None:
        raise NotFound("No delivery with this id.", details={"delivery_id": str(delivery_id)})
    return delivery
