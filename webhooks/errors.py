"""Errors a tenant can meet managing webhook endpoints."""

from __future__ import annotations

from chorus.errors import ChorusError, InvalidInput


class InvalidWebhookUrl(InvalidInput):
    """Not an http(s) URL with a host, or longer than we store."""

    code = "invalid_webhook_url"


class WebhookAddressNotAllowed(InvalidInput):
    """The URL's host is, or resolves to, an address Chorus will not call
    (loopback, private, link-local, cloud metadata, ...)."""

    code = "webhook_address_not_allowed"


class UnknownEventType(InvalidInput):
    code = "unknown_event_type"


class WebhookEndpointsFull(ChorusError):
    status = 409
    code = "webhook_endpoints_full"


class WebhookEndpointDisabled(ChorusError):
    status = 409
    code = "webhook_endpoint_disabled"
