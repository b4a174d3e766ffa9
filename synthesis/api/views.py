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

from chorus.api.openapi import TENANT_ERRORS, error_responses, response_headers
from chorus.api.pagination import paginate
from chorus.api.views import TenantAPIView, idempotency_key_header
from chorus.db import release_connections
from chorus.errors import InvalidInput
from chorus.snapshot import one_snapshot
from quotas.body_limits import upload_limit_bytes
from synthesis import selectors
from synthesis.api import docs
from synthesis.api.serializers import (
    JobOutput,
    JobPage,
    SpeechCreateInput,
    VoiceCreateInput,
    VoiceOutput,
    VoicePage,
)
from synthesis.api.streaming import EventFramer, streaming_response, wants_event_stream
from synthesis.consent import Consent, InvalidConsent, consent_parse
from synthesis.longform.progress import longform_segments
from synthesis.services.jobs import job_cancel, job_create
from synthesis.services.voices import voice_create, voice_delete
from synthesis.speech_request import SpeechRequest
from synthesis.uploads import upload_limit


def _voice_page(request: Request, tenant: Any) -> Response:
    # Voices are few (the plan bounds them): the page carries their count.
    page = paginate(request, selectors.voice_list(tenant=tenant), count=True)
    return Response(page.body(VoiceOutput(page.rows, many=True).data))


def _job_page(request: Request, tenant: Any) -> Response:
    fields = job_fields(request)
    # The page and its places in line from one state of the queue.
    with one_snapshot():
        page = paginate(request, selectors.job_list(tenant=tenant))
        context: dict[str, Any] = {"fields": fields, "queue_places": {}, "segments": {}}
        # What costs a read is read for the whole page at once, and only if shown.
        if fields is None or "queue" in fields:
            context["queue_places"] = selectors.job_queue_places(page=page.rows)
        if fields is None or {"progress", "timings"} & fields:
            context["segments"] = longform_segments(jobs=page.rows)
        body = page.body(JobOutput(page.rows, many=True, context=context).data)
    return Response(body)


def job_fields(request: Request) -> frozenset[str] | None:
    """`?fields=id,status,progress`: the job's top-level fields to answer with
    (a poll of a long text need not carry its text back each time); None: all."""
    raw = request.query_params.get("fields")
    if raw is None:
        return None
    names = frozenset(name.strip() for name in raw.split(",") if name.strip())
    unknown = sorted(names - set(JobOutput.Meta.fields))
    if not names or unknown:
        raise InvalidInput(
            "The query parameter 'fields' names fields of a job, separated by commas: "
            + ", ".join(JobOutput.Meta.fields)
            + ".",
            details={"field": "fields", "value": unknown[0] if unknown else raw},
        )
    return names


def _wants_queue_place(request: Request) -> bool:
    raw = request.query_params.get("queue", "false").lower()
    if raw not in ("true", "false"):
        raise InvalidInput(
            "The query parameter 'queue' is 'true' or 'false'.",
            details={"field": "queue", "value": raw},
        )
    return raw == "true"


class VoiceListCreateView(TenantAPIView):
    write_scope = "voices:write"
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="voices_list",
        summary="List your voices",
        description=docs.VOICES_LIST,
        parameters=[*docs.PAGE_PARAMETERS, *response_headers(200)],
        responses={200: VoicePage, **error_responses(*TENANT_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        return _voice_page(request, self.tenant)

    @extend_schema(
        operation_id="voices_create",
        summary="Upload a reference recording as a new voice",
        description=docs.VOICES_CREATE,
        request={"multipart/form-data": VoiceCreateInput},
        examples=docs.VOICE_EXAMPLES,
        parameters=response_headers(201),
        responses={
            201: OpenApiResponse(VoiceOutput, description="The voice, stored."),
            **error_responses(*docs.VOICE_UPLOAD_ERRORS),
        },
    )
    def post(self, request: Request) -> Response:
        # A declared length over the plan's limit was refused unread (`quotas.body_limits`);
        # the file's own bytes are counted as they are parsed.
        with upload_limit(upload_limit_bytes(self.tenant)):
            serializer = VoiceCreateInput(data=request.data)
            serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        voice = voice_create(
            tenant=self.tenant,
            name=data["name"],
            audio=data["audio"].read(),
            transcript=data["transcript"],
            language=data["language"],
            consent=_consent(data),
        )
        return Response(VoiceOutput(voice).data, status=status.HTTP_201_CREATED)


def _consent(data: dict[str, Any]) -> Consent | None:
    evidence = data["consent_evidence"]
    if data["consent"] is None:
        if evidence is not None:
            raise InvalidConsent(
                "consent_evidence comes with a `consent` record.", details={"field": "consent"}
            )
        return None
    return consent_parse(data["consent"], evidence=evidence.read() if evidence else None)


class VoiceDetailView(TenantAPIView):
    write_scope = "voices:write"

    @extend_schema(
        operation_id="voices_retrieve",
        summary="Read a voice",
        description=docs.VOICES_RETRIEVE,
        parameters=response_headers(200),
        responses={200: VoiceOutput, **error_responses(*TENANT_ERRORS, docs.VOICE_NOT_FOUND)},
    )
    def get(self, request: Request, voice_id: uuid.UUID) -> Response:
        return Response(
            VoiceOutput(selectors.voice_get(tenant=self.tenant, voice_id=voice_id)).data
        )

    @extend_schema(
        operation_id="voices_destroy",
        summary="Delete a voice and its recording",
        description=docs.VOICES_DESTROY,
        parameters=response_headers(204),
        responses={
            204: OpenApiResponse(description="Deleted."),
            **error_responses(*TENANT_ERRORS, docs.VOICE_NOT_FOUND),
        },
    )
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

    @extend_schema(
        operation_id="speech_list",
        summary="List your speech jobs",
        description=docs.SPEECH_LIST,
        parameters=[*docs.PAGE_PARAMETERS, docs.JOB_FIELDS, *response_headers(200)],
        responses={200: JobPage, **error_responses(*TENANT_ERRORS, docs.INVALID_FIELDS)},
    )
    def get(self, request: Request) -> Response:
        return _job_page(request, self.tenant)

    @extend_schema(
        operation_id="speech_create",
        summary="Speak text: submit a job, or stream its audio",
        description=docs.SPEECH_CREATE,
        request=SpeechCreateInput,
        examples=docs.SPEECH_EXAMPLES,
        parameters=[
            docs.IDEMPOTENCY_KEY,
            docs.QUEUE_PLACE,
            docs.JOB_LOCATION,
            docs.JOB_ID,
            *response_headers(200, 202),
        ],
        responses={
            202: OpenApiResponse(JobOutput, description="Queued: the job; `Location` is its URL."),
            **docs.streamed_audio(events=docs.CHORUS_EVENTS),
            **error_responses(*docs.SPEECH_CREATE_ERRORS),
        },
    )
    def post(self, request: Request) -> HttpResponseBase:
        serializer = SpeechCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        # The place in line costs more than the submit itself: only on request.
        queue_place = _wants_queue_place(request)
        job = job_create(
            tenant=self.tenant,
            api_key=self.api_key,
            speech=SpeechRequest.from_data(data),
            priority=data["priority"],
            idempotency_key=idempotency_key_header(request),
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
        context: dict[str, Any] = {} if queue_place else {"queue_places": {}}
        return Response(
            JobOutput(job, context=context).data,
            status=status.HTTP_202_ACCEPTED,
            headers={"Location": location},
        )


class SpeechDetailView(TenantAPIView):
    @extend_schema(
        operation_id="speech_retrieve",
        summary="Read a job: its status and, once done, its audio link",
        description=docs.SPEECH_RETRIEVE,
        parameters=[docs.JOB_FIELDS, *response_headers(200)],
        responses={
            200: JobOutput,
            **error_responses(*TENANT_ERRORS, docs.INVALID_FIELDS, docs.JOB_NOT_FOUND),
        },
    )
    def get(self, request: Request, job_id: uuid.UUID) -> Response:
        context = {"fields": job_fields(request)}
        with one_snapshot():  # the job and its place in line from one state of the queue
            job = selectors.job_get(tenant=self.tenant, job_id=job_id)
            body = JobOutput(job, context=context).data
        return Response(body)


class SpeechCancelView(TenantAPIView):
    write_scope = "speech:write"

    @extend_schema(
        operation_id="speech_cancel",
        summary="Cancel a job; its characters are refunded",
        description=docs.SPEECH_CANCEL,
        request=None,
        parameters=response_headers(200),
        responses={200: JobOutput, **error_responses(*docs.CANCEL_ERRORS)},
    )
    def post(self, request: Request, job_id: uuid.UUID) -> Response:
        job = selectors.job_get(tenant=self.tenant, job_id=job_id)
        return Response(JobOutput(job_cancel(tenant=self.tenant, job=job)).data)
