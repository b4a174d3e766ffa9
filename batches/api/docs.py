"""The API reference for batches: descriptions, request examples that work
unedited, and every error each operation can answer."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiParameter

from batches.errors import BatchNotCancellable, BatchTooLarge
from chorus.api.openapi import (
    MALFORMED_REQUEST,
    TENANT_ERRORS,
    UNKNOWN_FIELD,
    UNSUPPORTED_MEDIA_TYPE,
    ErrorDoc,
    not_found,
)
from chorus.errors import InvalidInput
from synthesis.api.docs import PAGE_PARAMETERS, SUBMIT_ERRORS, VOICE_NOT_FOUND
from synthesis.services.jobs import IdempotencyKeyReused

__all__ = ["PAGE_PARAMETERS"]

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Any string up to 255 characters: the same key and batch within 24 h give "
    "the same batch, admitted and charged once, instead of a new one.",
)

BATCH_NOT_FOUND = not_found("batch", batch_id="3f1c2b8e-0000-4000-8000-000000000000")

BATCH_CREATE_ERRORS = (
    *TENANT_ERRORS,
    ErrorDoc.of(
        InvalidInput,
        "A field of the batch or of one item is missing or not valid; for an item, "
        "`details.index` and `details.field` say which. Nothing was submitted.",
        index=3,
        field="speed",
    ),
    UNKNOWN_FIELD,
    MALFORMED_REQUEST,
    UNSUPPORTED_MEDIA_TYPE,
    VOICE_NOT_FOUND,
    ErrorDoc.of(
        IdempotencyKeyReused,
        "This `Idempotency-Key` was used in the last 24 h with a different batch; use a new key.",
    ),
    ErrorDoc.of(
        BatchTooLarge,
        "More items, or more characters in all, than your plan takes in one batch.",
        limit=100,
        value=250,
        field="items",
    ),
    ErrorDoc(
        413,
        "batch_too_large",
        "The body is larger than your plan's largest batch could be (its items, each "
        "item's text and other fields at their largest); refused before it is read.",
        {"limit_bytes": 840_896, "size_bytes": 2_270_011},
    ),
    *SUBMIT_ERRORS,
)

BATCH_CANCEL_ERRORS = (
    *TENANT_ERRORS,
    BATCH_NOT_FOUND,
    ErrorDoc.of(
        BatchNotCancellable,
        "The batch has already ended (completed, completed_with_failures or cancelled, "
        "with no item left in flight).",
        status="completed",
    ),
)

ITEM_PAGE_PARAMETERS = [
    OpenApiParameter(
        "limit",
        int,
        OpenApiParameter.QUERY,
        required=False,
        description="Items per page of the manifest: default 100, at most 1000.",
    ),
    OpenApiParameter(
        "cursor",
        str,
        OpenApiParameter.QUERY,
        required=False,
        description="Where the page of items starts, from `items.next`; opaque.",
    ),
]

BATCHES_LIST = (
    "Your batches, newest first, with their status, item counts and archive link. "
    "Paged like `/v1/speech`: follow `next`. Needs the `read` scope."
)

BATCHES_CREATE = """\
Many speech jobs in one request. Each item is an ordinary speech job (`text`,
`voice_id`, `format`, `sample_rate`, `speed`, `instruction`, `reuse`), plus your own
`custom_id` (or `id`) and a `metadata` object (at most 2048 bytes as JSON) that the
manifest gives back.

The whole batch is checked first: one bad item answers with its `details.index` and
`details.field` and a stable code, and nothing is created or charged. Admission is
all or nothing: a batch whose characters do not fit what is left of this month's
quota is refused whole. Items run at `low` priority unless the batch asks for
another your plan allows, and do not count against your jobs at once.

When every item has ended, one zip of all succeeded items' audio, with
`manifest.json` and `manifest.csv`, is built in your storage: `archive.url` in the
manifest. A failed or cancelled item is refunded on its own. Needs the
`speech:write` scope."""

BATCHES_RETRIEVE = """\
The batch's manifest: its status (`running`, `completed`,
`completed_with_failures`, `cancelling`, `cancelled`), counts per item status, the archive's
status and signed link, and its items in submitted order, each with its job's
status, error and signed audio link. Items come in pages: follow `items.next`.
Needs the `read` scope."""

BATCHES_CANCEL = """\
Cancel every item not yet finished and refund it, at once (202 with the manifest):
pending, queued and running items alike are `cancelled` and refunded when this
answers, a running one stops at its next chunk, and none starts afterwards. The
batch is `cancelling` until a light worker ends it (seconds; the sweeper does it
if that worker's task was lost): then `cancelled`, `batch.completed` is sent and
the archive is built. Finished items keep their audio (and charge), which goes
into the archive. Cancelling a `cancelling` batch again goes on (202). Needs the
`speech:write` scope."""

BATCH_EXAMPLES = [
    OpenApiExample(
        "A batch",
        summary="Three items with your own ids and metadata (202), then read the manifest",
        value={
            "items": [
                {"text": "Chapter one.", "custom_id": "ch-1", "metadata": {"book": 7}},
                {"text": "Chapter two.", "custom_id": "ch-2", "format": "mp3"},
                {"text": "Chapter three.", "custom_id": "ch-3", "speed": 1.1},
            ]
        },
        request_only=True,
    ),
]
