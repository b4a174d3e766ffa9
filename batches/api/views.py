from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param

from batches import selectors
from batches.api import docs
from batches.api.serializers import (
    BatchCreateInput,
    BatchItemInput,
    BatchManifest,
    BatchOutput,
    BatchPage,
)
from batches.cancelling import batch_cancel
from batches.errors import BatchTooLarge
from batches.models import ArchiveStatus, Batch
from batches.services import ItemSpec, batch_create, item_errors
from chorus.api.openapi import TENANT_ERRORS, error_responses, response_headers
from chorus.api.pagination import int_param, paginate
from chorus.api.views import TenantAPIView, idempotency_key_header
from chorus.errors import InvalidInput
from quotas.plans import tenant_batch_limits, tenant_limits
from synthesis.speech_request import SpeechRequest
from synthesis.storage_runtime import get_storage

ITEMS_PER_PAGE = 100
MAX_ITEMS_PER_PAGE = 1000


def archive_link(batch: Batch) -> tuple[str, datetime] | None:
    if batch.archive_status != ArchiveStatus.READY or not batch.archive_key:
        return None
    ttl = tenant_limits(batch.tenant).link_ttl_seconds
    url = get_storage().signed_url(
        bucket=batch.tenant.bucket,
        key=batch.archive_key,
        expires_in=ttl,
        filename=f"batch-{batch.id}.zip",
    )
    return url, timezone.now() + timedelta(seconds=ttl)


def _items(data: list[Any]) -> list[ItemSpec]:
    """Each item checked on its own, so an error names its index and field."""
    specs = []
    for index, raw in enumerate(data):
        with item_errors(index):
            if not isinstance(raw, dict):
                raise InvalidInput("An item must be a JSON object.", details={"field": "items"})
            item = BatchItemInput(data=raw)
            if not item.is_valid():
                field, errors = next(iter(item.errors.items()))
                raise InvalidInput(
                    f"{field}: {' '.join(str(e) for e in errors)}",
                    details={"field": field if field != "non_field_errors" else ""},
                )
            valid = item.validated_data
        specs.append(
            ItemSpec(
                speech=SpeechRequest.from_data(valid),
                custom_id=valid["custom_id"],
                metadata=valid["metadata"],
            )
        )
    return specs


class BatchListCreateView(TenantAPIView):
    write_scope = "speech:write"

    @extend_schema(
        operation_id="batches_list",
        summary="List your batches",
        description=docs.BATCHES_LIST,
        parameters=[*docs.PAGE_PARAMETERS, *response_headers(200)],
        responses={200: BatchPage, **error_responses(*TENANT_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        page = paginate(request, selectors.batch_list(tenant=self.tenant))
        context = {
            "counts": selectors.batch_counts(batches=page.rows),
            "archive_link": archive_link,
        }
        return Response(page.body(BatchOutput(page.rows, many=True, context=context).data))

    @extend_schema(
        operation_id="batches_create",
        summary="Submit many speech jobs as one batch",
        description=docs.BATCHES_CREATE,
        request=BatchCreateInput,
        examples=docs.BATCH_EXAMPLES,
        parameters=[docs.IDEMPOTENCY_KEY, *response_headers(202)],
        responses={
            202: OpenApiResponse(BatchManifest, description="Admitted: the batch's manifest."),
            **error_responses(*docs.BATCH_CREATE_ERRORS),
        },
    )
    def post(self, request: Request) -> Response:
        serializer = BatchCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        limit = tenant_batch_limits(self.tenant).max_items
        if len(data["items"]) > limit:  # refused before reading every item
            raise BatchTooLarge(
                f"The batch has {len(data['items'])} items; your plan takes {limit} in one "
                "batch. Split it.",
                details={"limit": limit, "value": len(data["items"]), "field": "items"},
            )
        batch = batch_create(
            tenant=self.tenant,
            api_key=self.api_key,
            items=_items(data["items"]),
            priority=data["priority"],
            idempotency_key=idempotency_key_header(request),
        )
        location = reverse("batch-detail", kwargs={"batch_id": batch.id})
        return Response(
            _manifest(request, batch),
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": location},
        )


class BatchDetailView(TenantAPIView):
    @extend_schema(
        operation_id="batches_retrieve",
        summary="Read a batch's manifest: status, counts, items, archive link",
        description=docs.BATCHES_RETRIEVE,
        parameters=[*docs.ITEM_PAGE_PARAMETERS, *response_headers(200)],
        responses={200: BatchManifest, **error_responses(*TENANT_ERRORS, docs.BATCH_NOT_FOUND)},
    )
    def get(self, request: Request, batch_id: uuid.UUID) -> Response:
        batch = selectors.batch_get(tenant=self.tenant, batch_id=batch_id)
        return Response(_manifest(request, batch))


class BatchCancelView(TenantAPIView):
    write_scope = "speech:write"

    @extend_schema(
        operation_id="batches_cancel",
        summary="Cancel a batch's unfinished items; they are refunded",
        description=docs.BATCHES_CANCEL,
        request=None,
        parameters=response_headers(202),
        responses={
            202: OpenApiResponse(
                BatchManifest,
                description="Cancelled: the manifest, the batch `cancelling` until a light "
                "worker ends it.",
            ),
            **error_responses(*docs.BATCH_CANCEL_ERRORS),
        },
    )
    def post(self, request: Request, batch_id: uuid.UUID) -> Response:
        batch = selectors.batch_get(tenant=self.tenant, batch_id=batch_id)
        batch = batch_cancel(tenant=self.tenant, batch=batch)
        return Response(_manifest(request, batch), status=status.HTTP_202_ACCEPTED)


def _manifest(request: Request, batch: Batch) -> dict[str, Any]:
    limit = int_param(request, "limit", ITEMS_PER_PAGE, minimum=1, maximum=MAX_ITEMS_PER_PAGE)
    after = _cursor(request)
    rows = selectors.batch_items(batch=batch, after=after, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    next_url = None
    if more:
        token = base64.urlsafe_b64encode(str(rows[-1].index).encode()).decode().rstrip("=")
        next_url = replace_query_param(request.build_absolute_uri(), "cursor", token)
    context = {
        "counts": selectors.batch_counts(batches=[batch]),
        "archive_link": archive_link,
        "items_page": {"rows": rows, "next": next_url},
    }
    return dict(BatchManifest(batch, context=context).data)


def _cursor(request: Request) -> int:
    token = request.query_params.get("cursor")
    if not token:
        return -1
    try:
        return int(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidInput(
            "The cursor is not one this API gave out; follow the `next` link as it is.",
            details={"field": "cursor"},
        ) from None
