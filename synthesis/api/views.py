from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpResponseBase
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.pagination import Pagination
from chorus.api.views import TenantAPIView
from chorus.db import release_connections
from chorus.errors import FileTooLarge, InvalidInput
from quotas.plans import tenant_limits
from synthesis import selectors
from synthesis.api.serializers import (
    JobOutput,
    SpeechCreateInput,
    VoiceCreateInput,
    VoiceOutput,
)
from synthesis.api.streaming import EventFramer, streaming_response, wants_event_stream
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.voices import voice_create, voice_delete
from synthesis.uploads import MULTIPART_OVERHEAD_BYTES, upload_limit


def _paginate(view: TenantAPIView, queryset: Any, serializer: Any) -> Response:
    paginator = Pagination()
    page = paginator.paginate_queryset(queryset, view.request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)


class VoiceListCreateView(TenantAPIView):
    write_scope = "voices:write"
    parser_classes = [MultiPartParser]

    @extend_schema(responses=VoiceOutput(many=True), operation_id="voices_list")
    def get(self, request: Request) -> Response:
        return _paginate(self, selectors.voice_list(tenant=self.tenant), VoiceOutput)

    @extend_schema(
        request={"multipart/form-data": VoiceCreateInput},
        responses={
            201: VoiceOutput,
            413: OpenApiResponse(description="file_too_large"),
            415: OpenApiResponse(description="unsupported_audio"),
            422: OpenApiResponse(
                description="audio_too_short, audio_too_long, "
                "sample_rate_too_low, too_many_channels"
            ),
        },
        operation_id="voices_create",
    )
    def post(self, request: Request) -> Response:
        # Refuse on the declared length before touching (and so reading) the body.
        limit = tenant_limits(self.tenant).max_upload_bytes
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit + MULTIPART_OVERHEAD_BYTES:
            raise FileTooLarge(
                f"The upload is larger than your plan's limit of {limit} bytes.",
                details={"limit_bytes": limit, "size_bytes": declared},
            )
        with upload_limit(limit):
            serializer = VoiceCreateInput(data=request.data)
            serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        voice = voice_create(
            tenant=self.tenant,
            name=data["name"],
            audio=data["audio"].read(),
            transcript=data["transcript"],
            language=data["language"],
        )
        return Response(VoiceOutput(voice).data, status=status.HTTP_201_CREATED)


class VoiceDetailView(TenantAPIView):
    write_scope = "voices:write"

    @extend_schema(responses=VoiceOutput, operation_id="voices_retrieve")
    def get(self, request: Request, voice_id: uuid.UUID) -> Response:
        return Response(
            VoiceOutput(selectors.voice_get(tenant=self.tenant, voice_id=voice_id)).data
        )

    @extend_schema(responses={204: None}, operation_id="voices_destroy")
    def delete(self, request: Request, voice_id: uuid.UUID) -> Response:
        voice = selectors.voice_get(tenant=self.tenant, voice_id=voice_id)
        voice_delete(tenant=self.tenant, voice=voice)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SpeechListCreateView(TenantAPIView):
    write_scope = "speech:write"

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # A streaming client's 'Accept: text/event-stream' gets JSON for errors.
        force = force or wants_event_stream(request.headers.get("Accept", ""))
        return super().perform_content_negotiation(request, force=force)

    @extend_schema(responses=JobOutput(many=True), operation_id="speech_list")
    def get(self, request: Request) -> Response:
        return _paginate(self, selectors.job_list(tenant=self.tenant), JobOutput)

    @extend_schema(
        request=SpeechCreateInput,
        responses={
            202: JobOutput,
            403: OpenApiResponse(description="priority_not_allowed"),
            404: OpenApiResponse(description="voice not found"),
            422: OpenApiResponse(description="text_too_long, unsupported_output"),
            503: OpenApiResponse(description="queue_unavailable"),
        },
        operation_id="speech_create",
    )
    def post(self, request: Request) -> HttpResponseBase:
        serializer = SpeechCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        job = job_create(
            tenant=self.tenant,
            api_key=self.api_key,
            text=data["text"],
            voice_id=data["voice_id"],
            priority=data["priority"],
            audio_format=data["format"],
            sample_rate=data["sample_rate"],
            speed=data["speed"],
            instruction=data["instruction"],
            stream=data["stream"],
            idempotency_key=_idempotency_key(request),
        )
        if data["stream"]:  # the relay runs on the event loop, not in this thread
            release_connections()  # nor does it need this one for the minutes it may last
            return streaming_response(
                job=job,
                sse=EventFramer("chorus")
                if wants_event_stream(request.headers.get("Accept", ""))
                else None,
                keep_on_disconnect=data["keep_on_disconnect"],
            )
        location = reverse("speech-detail", kwargs={"job_id": job.id})
        return Response(
            JobOutput(job).data, status=status.HTTP_202_ACCEPTED, headers={"Location": location}
        )


class SpeechDetailView(TenantAPIView):
    @extend_schema(responses=JobOutput, operation_id="speech_retrieve")
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        return Response(JobOutput(selectors.job_get(tenant=self.tenant, job_id=job_id)).data)


class SpeechCancelView(TenantAPIView):
    write_scope = "speech:write"

    @extend_schema(
        request=None,
        responses={200: JobOutput, 409: OpenApiResponse(description="job_not_cancellable")},
        operation_id="speech_cancel",
        summary="Cancel a queued or running job; its characters are refunded.",
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        job = selectors.job_get(tenant=self.tenant, job_id=job_id)
        return Response(JobOutput(job_cancel(tenant=self.tenant, job=job)).data)


def _idempotency_key(request: Request) -> str:
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 255:
        raise InvalidInput(
            "Idempotency-Key is longer than 255 characters.", details={"length": len(key)}
        )
    return key
