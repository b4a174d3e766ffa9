"""`POST /v1/audio/speech`: OpenAI's speech API, so existing clients work unchanged.

Point the official `openai` package at Chorus (`base_url=<server>/v1`,
`api_key=<ck_ key>`); `client.audio.speech.create(...)` and
`client.audio.speech.with_streaming_response.create(...)` both work. Mapping:

* `input` is the text; `instructions` the job's instruction (instruct mode);
  `speed` 0.5-2.0 (OpenAI allows 0.25-4.0; outside Chorus's range is a 400);
* `voice`: a voice id or name of the caller's voices; OpenAI's built-in names
  (alloy, echo, ...) mean "no voice", the engine's default speaker, unless the
  tenant has a voice of that name; anything else is a 404;
* `response_format`: mp3 (default), opus, flac, wav, pcm; aac answers 400;
* `stream_format`: `audio` (default) or `sse`;
* `model` is required and recorded nowhere: Chorus has one engine per worker pool;
* Chorus extras (via `extra_body`): `priority`, `keep_on_disconnect`.

Every call is a streamed job: the response starts with the first audio (or is a
JSON error if the job fails before any), and the file is stored and charged as
for any job. The response carries `X-Job-Id` and `Location` for the job resource.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from chorus.api.errors import envelope, exception_handler
from chorus.api.openapi import error_responses, response_headers
from chorus.api.parsers import JSONParser
from chorus.api.serializers import ChoicesNamed
from chorus.db import released
from chorus.errors import NotFound
from quotas.admission import tenant_request_admit
from synthesis.api import docs
from synthesis.api.streaming import (
    Event,
    EventFramer,
    Failed,
    cancel_quietly,
    relay,
    stream_client,
    stream_events,
    streaming_response,
)
from synthesis.engines.base import MAX_SPEED, MIN_SPEED
from synthesis.models import Job, Priority, Voice
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.authentication import TenantPrincipal, principal_from_request
from tenants.models import Tenant

# OpenAI's built-in voices (2025): accepted, and spoken by the engine's default voice.
OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "cedar",
        "coral",
        "echo",
        "fable",
        "marin",
        "nova",
        "onyx",
        "sage",
        "shimmer",
        "verse",
    }
)
# OpenAI's aac is not among them: it is refused as any value outside the choices.
OPENAI_FORMATS = ("mp3", "opus", "flac", "wav", "pcm")

# HTTP status for a job that ended before its first audio.
_ENDING_STATUS = {"cancelled": 409, "superseded": 409, "worker_lost": 503}


@extend_schema_serializer(component_name="OpenAISpeech")  # OpenAISpeechRequest
class OpenAISpeechInput(ChoicesNamed):
    model = serializers.CharField(max_length=200)
    input = serializers.CharField(trim_whitespace=True)
    voice = serializers.JSONField(help_text='A voice id or name, an OpenAI voice, or {"id": ...}.')
    response_format = serializers.ChoiceField(choices=OPENAI_FORMATS, default="mp3")
    speed = serializers.FloatField(default=1.0, min_value=MIN_SPEED, max_value=MAX_SPEED)
    instructions = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=500
    )
    stream_format = serializers.ChoiceField(choices=["audio", "sse"], default="audio")
    # Chorus extensions.
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.NORMAL)
    keep_on_disconnect = serializers.BooleanField(default=False)


@dataclass(frozen=True)
class Submitted:
    job: Job
    sse: bool
    keep_on_disconnect: bool
    headers: dict[str, str]  # the rate's, for the response


def authenticate(request: HttpRequest, *, scope: str) -> tuple[TenantPrincipal, dict[str, str]]:
    """What `TenantAPIView` enforces, for views that are not DRF views: the key
    and an active tenant (`tenants.authentication`), then the scope, the body's
    limit and the rate (`quotas.admission`). Returns the caller and the headers
    its response carries; raises what the envelope handler maps."""
    principal = principal_from_request(request)
    headers = tenant_request_admit(
        request, tenant=principal.tenant, api_key=principal.api_key, scope=scope
    )
    return principal, headers


def error_response(exc: Exception) -> JsonResponse:
    """The one envelope, for an async view (re-raises what the handler does not map)."""
    rendered = exception_handler(exc, {})
    if rendered is None:
        raise exc
    response = JsonResponse(rendered.data, status=rendered.status_code)
    for name, value in rendered.items():
        if name.lower() != "content-type":  # an unrendered Response's placeholder
            response[name] = value
    return response


def _submit(request: HttpRequest) -> Submitted:
    principal, headers = authenticate(request, scope="speech:write")
    data = JSONParser().parse(request, parser_context={"request": request})
    serializer = OpenAISpeechInput(data=data)
    serializer.is_valid(raise_exception=True)
    params = serializer.validated_data
    # OpenAI's names for the request's fields; every call streams.
    speech = SpeechRequest(
        text=params["input"],
        voice_id=_voice_id(tenant=principal.tenant, voice=params["voice"]),
        format=params["response_format"],
        speed=params["speed"],
        instruction=params["instructions"],
        stream=True,
    )
    job = job_create(
        tenant=principal.tenant,
        api_key=principal.api_key,
        speech=speech,
        priority=params["priority"],
    )
    return Submitted(
        job=job,
        sse=params["stream_format"] == "sse",
        keep_on_disconnect=params["keep_on_disconnect"],
        headers=headers,
    )


def _voice_id(*, tenant: Tenant, voice: Any) -> uuid.UUID | None:
    if isinstance(voice, dict):
        voice = voice.get("id")
    if not isinstance(voice, str) or not voice.strip():
        raise exceptions.ValidationError({"voice": ["A voice id or name is required."]})
    if "\x00" in voice or len(voice) > 200:
        raise exceptions.ValidationError({"voice": ["Not a voice id or name."]})
    name = voice.strip()
    try:
        return uuid.UUID(name)  # job_create answers 404 for another tenant's id
    except ValueError:
        pass
    mine = Voice.objects.filter(tenant=tenant)
    found = (
        mine.filter(name=name).order_by("-created_at").first()
        or mine.filter(name__iexact=name).order_by("-created_at").first()
    )
    if found is not None:
        return found.id
    if name.lower() in OPENAI_VOICES:
        return None  # the engine's default voice
    raise NotFound("No voice with this id or name.", details={"voice": name})


async def audio_speech(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return JsonResponse(
            envelope("method_not_allowed", f'Method "{request.method}" not allowed.'),
            status=405,
            headers={"Allow": "POST"},
        )
    try:
        # The stream may last minutes: its connection goes back to the pool now.
        submitted = await sync_to_async(released(_submit))(request)
    except Exception as exc:
        return error_response(exc)
    job = submitted.job
    try:
        events = stream_events(job=job, client=await stream_client())
        # Wait for the first audio before answering, so a job that fails before
        # any (a deleted voice, an engine error) is a JSON error with a status.
        first = await anext(events)
    except BaseException:  # the client went away while the job waited or ran
        if not submitted.keep_on_disconnect:
            await asyncio.shield(cancel_quietly(job))
        raise
    if isinstance(first, Failed):
        return JsonResponse(
            envelope(first.code, first.message, {"job_id": str(job.id)}),
            status=_ENDING_STATUS.get(first.code, 500),
        )
    response = streaming_response(
        job=job,
        sse=EventFramer("openai") if submitted.sse else None,
        keep_on_disconnect=submitted.keep_on_disconnect,
        body=relay(
            job=job,
            sse=EventFramer("openai") if submitted.sse else None,
            keep_on_disconnect=submitted.keep_on_disconnect,
            events=_prepend(first, events),
        ),
    )
    for name, value in submitted.headers.items():
        response[name] = value
    return response


async def _prepend(first: Event, rest: AsyncIterator[Event]) -> AsyncIterator[Event]:
    yield first
    async for event in rest:
        yield event


class AudioSpeechSchema(APIView):
    """Documents the route in the OpenAPI schema. Requests never reach it: they
    are served by the async `audio_speech` (DRF views are sync)."""

    @extend_schema(
        operation_id="openai_audio_speech",
        summary="OpenAI-compatible speech: the audio, streamed as it is made",
        description=docs.OPENAI_SPEECH,
        request=OpenAISpeechInput,
        examples=docs.OPENAI_EXAMPLES,
        parameters=[docs.JOB_LOCATION, docs.JOB_ID, *response_headers(200)],
        responses={
            **docs.streamed_audio(events=docs.OPENAI_EVENTS),
            **error_responses(*docs.OPENAI_SPEECH_ERRORS),
        },
    )
    def post(self, request: Request) -> Response:
        raise NotImplementedError


def audio_speech_view() -> Any:
    """The URL callback: the async view, carrying the class that documents it."""
    view: Any = csrf_exempt(audio_speech)
    view.cls = AudioSpeechSchema
    view.initkwargs = {}
    return view
