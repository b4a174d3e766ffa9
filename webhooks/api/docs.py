"""The API reference for webhook endpoints: what each operation does, request
examples that work unedited, and the errors each can answer."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample

from chorus.api.openapi import (
    INVALID_REQUEST,
    MALFORMED_REQUEST,
    TENANT_ERRORS,
    UNKNOWN_FIELD,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc,
    not_found,
)
from webhooks.errors import (
    InvalidWebhookUrl,
    UnknownEventType,
    WebhookAddressNotAllowed,
    WebhookEndpointDisabled,
    WebhookEndpointsFull,
)

ENDPOINT_NOT_FOUND = not_found(
    "webhook endpoint", endpoint_id="3f1c2b8e-0000-4000-8000-000000000000"
)
DELIVERY_NOT_FOUND = not_found("delivery", delivery_id="3f1c2b8e-0000-4000-8000-000000000000")

_URL_ERRORS = (
    ErrorDoc.of(
        InvalidWebhookUrl,
        "The URL is not an http(s) URL with a host (or carries a user and password).",
        url="ftp://example.com/hook",
    ),
    ErrorDoc.of(
        WebhookAddressNotAllowed,
        "The host is, or resolves to, an address Chorus does not call: loopback, private, "
        "link-local, multicast, reserved or a cloud metadata service.",
        host="internal.example",
        address="10.0.0.7",
        reason="private",
    ),
    ErrorDoc.of(
        UnknownEventType,
        "An event type that does not exist, or an empty list.",
        unknown=["speech.started"],
        known=["speech.succeeded", "speech.failed", "batch.completed"],
    ),
)
_BODY_ERRORS = (INVALID_REQUEST, UNKNOWN_FIELD, MALFORMED_REQUEST, UNSUPPORTED_MEDIA_TYPE)

CREATE_ERRORS = (
    *TENANT_ERRORS,
    *_BODY_ERRORS,
    *_URL_ERRORS,
    ErrorDoc.of(
        WebhookEndpointsFull,
        "You have the most endpoints allowed (20 by default); delete one first.",
        limit=20,
        value=20,
    ),
)
UPDATE_ERRORS = (*TENANT_ERRORS, *_BODY_ERRORS, *_URL_ERRORS, ENDPOINT_NOT_FOUND)
REDELIVER_ERRORS = (
    *TENANT_ERRORS,
    DELIVERY_NOT_FOUND,
    ErrorDoc.of(
        WebhookEndpointDisabled,
        "The endpoint is disabled; enable it first.",
        endpoint_id="3f1c2b8e-0000-4000-8000-000000000000",
    ),
)

ENDPOINT_EXAMPLES = [
    OpenApiExample(
        "Every event",
        summary="Receive every event type (201, with the signing secret)",
        value={"url": "https://example.com/chorus-webhooks", "description": "production"},
        request_only=True,
    ),
    OpenApiExample(
        "Failures only",
        summary="Only failed jobs",
        value={"url": "https://example.com/chorus-failures", "event_types": ["speech.failed"]},
        request_only=True,
    ),
]
UPDATE_EXAMPLES = [
    OpenApiExample(
        "Pause",
        summary="Stop deliveries for now (pending retries are dropped)",
        value={"enabled": False},
        request_only=True,
    ),
    OpenApiExample(
        "Events",
        summary="Change the events received",
        value={"event_types": ["speech.succeeded", "speech.failed"]},
        request_only=True,
    ),
]

ENDPOINT_CREATE = """\
Register a URL that Chorus POSTs events to: `speech.succeeded` and `speech.failed` when
a job ends, `batch.completed` when a batch does. The answer carries the endpoint's
`secret` (`whsec_...`), shown only here and by *rotate*: verify each delivery with it.

Each delivery is signed the [Standard Webhooks](https://www.standardwebhooks.com/) way:
headers `webhook-id` (the event's id, the same on every retry: dedupe on it),
`webhook-timestamp` and `webhook-signature`. With the `standardwebhooks` library:
`Webhook(secret).verify(body, headers)`. The body is
`{"type", "timestamp", "data"}`; a job's `data` has `id`, `status`, `error`,
`characters`, `audio_seconds`, `format`, `created_at`, `finished_at` and, for
`speech.succeeded`, a freshly signed `audio_url` with `audio_url_expires_at`.

Answer with any 2xx within 10 s. Anything else (a redirect too: they are not followed)
is retried after about 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h (each +/-20 %),
then the delivery has failed. The URL must be `https://` or `http://` and its host
must resolve to a public address (checked now and at every delivery), unless the
operator of this service allows private ones. Changing endpoints needs the
`speech:write` scope."""

ENDPOINT_LIST = "Your webhook endpoints, newest first (without their secrets)."
ENDPOINT_RETRIEVE = "One of your webhook endpoints: its URL, events and state (not its secret)."
ENDPOINT_UPDATE = """\
Change an endpoint's URL, events, description, or disable it: a disabled endpoint
receives nothing, and its pending retries are dropped when they come due."""
ENDPOINT_DESTROY = "Delete an endpoint, its deliveries and their log; nothing more is sent to it."
ENDPOINT_ROTATE = """\
Replace the endpoint's secret and answer the new one. Deliveries from now on, retries
included, are signed with the new secret only."""
DELIVERY_LIST = """\
The endpoint's deliveries, newest first, each with its event (`webhook_id`, `event_type`),
status (`pending`, `succeeded`, `failed` after the last retry, `cancelled` when the
endpoint was disabled), when the next attempt goes out, and the log of every attempt:
start, latency, the receiver's status code and the first KiB of its answer, or the
error (timeout, connection refused, redirect not followed, address not allowed)."""
DELIVERY_REDELIVER = """\
Send a delivery's event again now, as a new delivery with a fresh retry schedule and
the same `webhook-id` (202, the new delivery)."""
