"""The docs page (/v1/docs/ over /v1/schema/) is usable without reading the code.

Every operation's documented request examples are sent, unedited, with a real
tenant key and answer a documented success; the refusals an operation answers
are the ones it documents; descriptions are written for users, not code
docstrings; the voice upload is a file.

Jobs run on an inline worker: publishing a job runs it at once with the
synthetic engine, so streamed examples get real audio. Transactions commit for
real (that is when a job is published), hence `transaction=True`.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.test import AsyncClient
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient
from rest_framework.views import APIView

from batches.services import ItemSpec, batch_create
from synthesis.engines.base import Engine
from synthesis.services.dispatch import sent_before_commit
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.speech_request import SpeechRequest
from tenants.services import api_key_create
from tests.audio_files import audio_file
from tests.conftest import Persona
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery
from webhooks.services.endpoints import endpoint_create

pytestmark = pytest.mark.django_db(transaction=True)

_METHODS = ("get", "post", "put", "patch", "delete")
_PATH_PARAM = re.compile(r"{(\w+)}")


# --- the schema ---------------------------------------------------------------------


@dataclass(frozen=True)
class Operation:
    path: str
    method: str
    spec: dict[str, Any]

    @property
    def id(self) -> str:
        return str(self.spec["operationId"])

    @property
    def takes_a_key(self) -> bool:
        return any("ApiKey" in requirement for requirement in self.spec.get("security", []))

    def success_statuses(self) -> set[int]:
        return {int(status) for status in self.spec["responses"] if status.startswith("2")}

    def codes(self, status: int) -> set[str]:
        """The error codes documented for a status, from its examples."""
        response = self.spec["responses"].get(str(status), {})
        examples = response.get("content", {}).get("application/json", {}).get("examples", {})
        return {example["value"]["error"]["code"] for example in examples.values()}

    def request_examples(self) -> tuple[str, list[dict[str, Any]]] | None:
        """The body's media type and its documented example values, if it takes a body."""
        content = self.spec.get("requestBody", {}).get("content", {})
        if not content:
            return None
        [(media_type, body)] = content.items()
        return media_type, [example["value"] for example in body.get("examples", {}).values()]


def operations(schema: dict[str, Any]) -> list[Operation]:
    return [
        Operation(path, method, spec)
        for path, item in schema["paths"].items()
        for method, spec in item.items()
        if method in _METHODS
    ]


def resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


@pytest.fixture
def schema(anonymous: APIClient) -> dict[str, Any]:
    response = anonymous.get("/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


# --- an inline worker and the objects examples act on --------------------------------


@dataclass
class InlineWorker:
    engine: Engine
    running: bool = True
    ran: list[str] = field(default_factory=list)

    def publish(
        self, _: Any, *, args: tuple[str, int], headers: Any = None, **options: Any
    ) -> None:
        if not self.running:
            return
        before_commit = sent_before_commit(headers or {})
        if before_commit is None:  # sent after its commit, or inside a transaction
            transaction.on_commit(lambda: self._run(*args))
            return
        # Sent before its row's commit, on the submit's sending thread: the claim
        # waits for the commit, as a worker's would (`job_claim`).
        try:
            self._run(*args, before_commit=before_commit)
        finally:
            connection.close()  # this thread's own

    def _run(self, job_id: str, epoch: int, before_commit: int | None = None) -> None:
        job_execute(
            job_id=job_id,
            engine=self.engine,
            worker="docs-worker",
            epoch=epoch,
            before_commit=before_commit,
        )
        self.ran.append(job_id)


@pytest.fixture
def worker(engine: Engine, broker: Any, monkeypatch: pytest.MonkeyPatch) -> InlineWorker:
    inline = InlineWorker(engine)
    monkeypatch.setattr("synthesis.tasks.publish_task", inline.publish)
    return inline


def upload_voice(persona: Persona) -> str:
    response = persona.client.post(
        "/v1/voices",
        {"name": "Narrator", "audio": SimpleUploadedFile("ref.wav", audio_file(4.0))},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def queued_job(persona: Persona, worker: InlineWorker) -> str:
    worker.running = False
    try:
        job = job_create(
            tenant=persona.tenant,
            api_key=persona.api_key,
            speech=SpeechRequest(text="Hello there."),
        )
    finally:
        worker.running = True
    return str(job.id)


def finished_job_link(persona: Persona, worker: InlineWorker) -> str:
    job = job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text="Hello there.")
    )
    link = persona.client.get(f"/v1/speech/{job.id}").json()["audio_url"]
    assert link, "the inline worker did not finish the job"
    return str(link)


def running_batch(persona: Persona, worker: InlineWorker) -> str:
    worker.running = False
    try:
        batch = batch_create(
            tenant=persona.tenant,
            api_key=persona.api_key,
            items=[ItemSpec(speech=SpeechRequest(text="Hello there."))],
        )
    finally:
        worker.running = True
    return str(batch.id)


@dataclass(frozen=True)
class Call:
    path: str
    query: dict[str, str] = field(default_factory=dict)
    json_body: dict[str, Any] | None = None
    form: dict[str, Any] | None = None


def fill_path(operation: Operation, values: dict[str, str]) -> str:
    return _PATH_PARAM.sub(lambda m: values[m.group(1)], operation.path)


def own_objects(operation: Operation, persona: Persona, worker: InlineWorker) -> Call:
    """The operation's path filled with fresh objects of the persona's own."""
    names = set(_PATH_PARAM.findall(operation.path))
    if {"bucket", "key"} <= names:  # a signed link is the only way to this route
        link = urlsplit(finished_job_link(persona, worker))
        return Call(path=link.path, query=dict(parse_qsl(link.query)))
    values = {}
    if "endpoint_id" in names:
        endpoint = endpoint_create(tenant=persona.tenant, url="https://hooks.example.invalid/x")
        values["endpoint_id"] = str(endpoint.id)
        if "delivery_id" in names:
            event_publish(tenant_id=persona.tenant.pk, event_type="batch.completed", data={})
            values["delivery_id"] = str(WebhookDelivery.objects.get(endpoint=endpoint).id)
    for name in names - set(values):
        if name == "voice_id":
            values[name] = upload_voice(persona)
        elif name == "job_id":
            values[name] = queued_job(persona, worker)
        elif name == "batch_id":
            values[name] = running_batch(persona, worker)
        else:
            raise AssertionError(f"{operation.id}: no way to fill {{{name}}} here; add one")
    return Call(path=fill_path(operation, values))


def with_body(
    call: Call,
    media_type: str,
    example: dict[str, Any],
    schema: dict[str, Any],
    operation: Operation,
) -> Call:
    if media_type == "application/json":
        return Call(call.path, call.query, json_body=example)
    assert media_type == "multipart/form-data", (operation.id, media_type)
    form: dict[str, Any] = dict(example)
    body_schema = resolve(schema, operation.spec["requestBody"]["content"][media_type]["schema"])
    required = set(body_schema.get("required", ()))
    for name, prop in body_schema["properties"].items():
        # The file the user must pick on the docs page (an optional one, such as
        # a consent's evidence or a sidecar, goes with fields the example sets).
        if prop.get("format") == "binary" and name in required:
            form[name] = SimpleUploadedFile("reference.wav", audio_file(4.0), "audio/wav")
    return Call(call.path, call.query, form=form)


def calls(
    operation: Operation, schema: dict[str, Any], persona: Persona, worker: InlineWorker
) -> Iterator[tuple[str, Call]]:
    """(what, call) for each documented example, or one call for a route without a body."""
    body = operation.request_examples()
    if body is None:
        yield "no body", own_objects(operation, persona, worker)
        return
    media_type, examples = body
    assert examples, f"{operation.id} takes a body but documents no example of it"
    for n, example in enumerate(examples):
        call = own_objects(operation, persona, worker)
        yield f"example {n}", with_body(call, media_type, example, schema, operation)


def send(key: str | None, method: str, call: Call) -> tuple[Any, bytes]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def run() -> tuple[Any, bytes]:
        client = AsyncClient()
        if call.json_body is not None:
            body = json.dumps(call.json_body)
            response = await client.generic(
                method.upper(), call.path, body, "application/json", headers=headers
            )
        elif call.form is not None:
            response = await client.post(call.path, call.form, headers=headers)
        else:
            response = await getattr(client, method)(call.path, call.query, headers=headers)
        if not response.streaming:
            return response, response.content
        if response.is_async:
            return response, b"".join([piece async for piece in response.streaming_content])
        return response, b"".join(response.streaming_content)

    return async_to_sync(run)()


def media_type_of(response: Any) -> str:
    return str(response.get("Content-Type", "")).split(";")[0].strip()


# --- examples that work unedited -----------------------------------------------------


def test_every_documented_example_answers_a_documented_success(
    schema: dict[str, Any], alice: Persona, worker: InlineWorker
) -> None:
    ops = operations(schema)
    assert {op.id for op in ops} >= {
        "voices_list",
        "voices_create",
        "voices_retrieve",
        "voices_destroy",
        "speech_list",
        "speech_create",
        "speech_retrieve",
        "speech_cancel",
        "usage_retrieve",
        "openai_audio_speech",
        "files_download",
    }
    for op in ops:
        seen: set[int] = set()
        for what, call in calls(op, schema, alice, worker):
            response, body = send(alice.key, op.method, call)
            where = f"{op.method.upper()} {op.path} ({op.id}, {what})"
            assert response.status_code in op.success_statuses(), (where, body[:500])
            seen.add(response.status_code)
            documented = op.spec["responses"][str(response.status_code)].get("content", {})
            if documented:
                media_type = media_type_of(response)
                assert media_type in documented, (where, response["Content-Type"])
                if media_type != "application/json":
                    assert len(body) > 1_000, where  # audio, not just a header
            else:
                assert not body, where
        # Each success the docs promise is one an example shows (202 and the stream's 200).
        assert seen == op.success_statuses(), (op.id, seen)
    assert worker.ran, "no example ran a job"


def test_the_speech_examples_need_no_voice_of_ones_own(schema: dict[str, Any]) -> None:
    """A placeholder voice_id would answer 404 until edited."""
    [speech] = [op for op in operations(schema) if op.id == "speech_create"]
    body = speech.request_examples()
    assert body is not None
    assert body[1]
    for example in body[1]:
        assert example.get("voice_id") is None


# --- refusals answered are refusals documented ---------------------------------------


def test_every_key_refusal_an_operation_answers_is_documented(
    schema: dict[str, Any], alice: Persona, worker: InlineWorker
) -> None:
    no_scopes, no_scopes_raw = api_key_create(tenant=alice.tenant, name="no scopes")
    no_scopes.scopes = []
    no_scopes.save()
    refusals = [
        (None, 401, "unauthenticated"),
        ("ck_not_a_real_key", 401, "invalid_api_key"),
        (no_scopes_raw, 403, "insufficient_scope"),
    ]
    tenant_ops = [op for op in operations(schema) if op.takes_a_key]
    assert len(tenant_ops) >= 10
    for op in tenant_ops:
        _, call = next(calls(op, schema, alice, worker))
        for key, status, code in refusals:
            response, body = send(key, op.method, call)
            assert response.status_code == status, (op.id, key, body[:300])
            assert response.json()["error"]["code"] == code, (op.id, body[:300])
            assert code in op.codes(status), f"{op.id} answers {status} {code}, undocumented"


def test_another_tenants_objects_answer_the_documented_404(
    schema: dict[str, Any], alice: Persona, bob: Persona, worker: InlineWorker
) -> None:
    with_ids = [op for op in operations(schema) if op.takes_a_key and "{" in op.path]
    assert len(with_ids) >= 4
    for op in with_ids:
        bobs = own_objects(op, bob, worker)
        for path in (
            bobs.path,
            fill_path(
                op,
                {
                    name: str(uuid.uuid4())
                    for name in ("voice_id", "job_id", "endpoint_id", "delivery_id", "batch_id")
                },
            ),
        ):
            response, body = send(alice.key, op.method, Call(path))
            assert response.status_code == 404, (op.id, body[:300])
            assert response.json()["error"]["code"] == "not_found"
            assert "not_found" in op.codes(404), op.id


def test_a_field_a_route_does_not_take_answers_as_documented(
    schema: dict[str, Any], alice: Persona, worker: InlineWorker
) -> None:
    """Native routes refuse it (400 unknown_field, documented); the OpenAI-compatible
    route documents no such refusal and ignores the field."""
    with_bodies = [op for op in operations(schema) if op.request_examples()]
    refusing = {op.id for op in with_bodies if "unknown_field" in op.codes(400)}
    assert refusing == {
        "speech_create",
        "voices_create",
        "provenance_verify",
        "batches_create",
        "webhook_endpoints_create",
        "webhook_endpoints_update",
        "realtime_token_create",
    }
    for op in with_bodies:
        _, call = next(calls(op, schema, alice, worker))
        if call.json_body is not None:
            call = Call(call.path, json_body={**call.json_body, "fromat": "mp3"})
        else:
            call = Call(call.path, form={**(call.form or {}), "fromat": "mp3"})
        response, body = send(alice.key, op.method, call)
        if op.id in refusing:
            assert response.status_code == 400, (op.id, body[:300])
            assert response.json()["error"]["details"] == {"fields": ["fromat"]}
        else:
            assert response.status_code in op.success_statuses(), (op.id, body[:300])


# What each operation can answer besides the refusals above, read from the code
# (chorus/errors.py, quotas/errors.py, chorus/api/errors.py, the services).
_EVERY_KEYED_ROUTE = {
    401: {"unauthenticated", "invalid_api_key", "invalid_authorization"},
    403: {"insufficient_scope", "tenant_inactive"},
    429: {"rate_limited"},
    503: {"service_busy"},
}
_SUBMIT = {
    400: {"invalid_request", "malformed_request", "voice_required", "unsupported_text"},
    403: {"priority_not_allowed"},
    404: {"not_found"},
    409: {"storage_quota_exceeded"},
    413: {"longform_text_too_long"},
    422: {"text_too_long", "unsupported_output", "instruction_not_supported"},
    429: {"quota_exceeded", "too_many_concurrent_jobs"},
    503: {"queue_unavailable"},
}
_EXPECTED: dict[str, dict[int, set[str]]] = {
    "voices_list": {},
    "voices_create": {
        400: {
            "invalid_request",
            "unknown_field",
            "empty_file",
            "malformed_request",
            "voice_consent_required",
            "invalid_consent",
        },
        409: {"voice_slots_full", "storage_quota_exceeded"},
        413: {"file_too_large"},
        415: {"unsupported_audio", "unsupported_media_type"},
        422: {
            "audio_too_short",
            "audio_too_long",
            "audio_inconsistent",
            "sample_rate_too_low",
            "too_many_channels",
        },
        503: {"storage_unavailable"},
    },
    "voices_retrieve": {404: {"not_found"}},
    "voices_destroy": {404: {"not_found"}},
    "speech_list": {},
    "speech_create": {
        **_SUBMIT,
        400: _SUBMIT[400] | {"unknown_field"},
        409: _SUBMIT[409] | {"idempotency_key_reused"},
        413: _SUBMIT[413] | {"text_too_long"},  # a body too large for any text of the plan
        415: {"unsupported_media_type"},
    },
    "speech_retrieve": {404: {"not_found"}},
    "speech_cancel": {404: {"not_found"}, 409: {"job_not_cancellable"}},
    "realtime_token_create": {
        400: {"invalid_request", "unknown_field", "malformed_request"},
        415: {"unsupported_media_type"},
        503: {"queue_unavailable"},
    },
    "usage_retrieve": {},
    "provenance_verify": {
        400: {"invalid_request", "unknown_field", "empty_file", "malformed_request"},
        413: {"file_too_large"},
    },
    "audit_events_list": {400: {"invalid_request"}},
    "batches_list": {},
    "batches_create": {
        **_SUBMIT,
        400: _SUBMIT[400] | {"unknown_field"},
        413: _SUBMIT[413] | {"batch_too_large"},  # a body too large for the plan's batches
        415: {"unsupported_media_type"},
        422: _SUBMIT[422] | {"batch_too_large"},
    },
    "batches_retrieve": {404: {"not_found"}},
    "batches_cancel": {404: {"not_found"}, 409: {"batch_not_cancellable"}},
    "openai_audio_speech": {
        **_SUBMIT,
        409: _SUBMIT[409] | {"cancelled"},
        413: _SUBMIT[413] | {"text_too_long"},
        500: {"engine_error"},
        503: _SUBMIT[503] | {"worker_lost"},
    },
    "webhook_endpoints_list": {},
    "webhook_endpoints_create": {
        400: {
            "invalid_request",
            "unknown_field",
            "malformed_request",
            "invalid_webhook_url",
            "webhook_address_not_allowed",
            "unknown_event_type",
        },
        409: {"webhook_endpoints_full"},
        415: {"unsupported_media_type"},
    },
    "webhook_endpoints_retrieve": {404: {"not_found"}},
    "webhook_endpoints_update": {
        400: {
            "invalid_request",
            "unknown_field",
            "malformed_request",
            "invalid_webhook_url",
            "webhook_address_not_allowed",
            "unknown_event_type",
        },
        404: {"not_found"},
        415: {"unsupported_media_type"},
    },
    "webhook_endpoints_destroy": {404: {"not_found"}},
    "webhook_endpoints_rotate_secret": {404: {"not_found"}},
    "webhook_deliveries_list": {404: {"not_found"}},
    "webhook_deliveries_redeliver": {404: {"not_found"}, 409: {"webhook_endpoint_disabled"}},
}


def test_every_operation_documents_401_and_each_error_code_it_can_answer(
    schema: dict[str, Any],
) -> None:
    by_id = {op.id: op for op in operations(schema)}
    assert set(_EXPECTED) == {op.id for op in by_id.values() if op.takes_a_key}
    for op_id, own in _EXPECTED.items():
        op = by_id[op_id]
        for status in set(_EVERY_KEYED_ROUTE) | set(own):
            expected = _EVERY_KEYED_ROUTE.get(status, set()) | own.get(status, set())
            missing = expected - op.codes(status)
            assert not missing, f"{op_id} does not document {status} {sorted(missing)}"
    download = by_id["files_download"]
    assert download.codes(404) == {"not_found"}
    assert download.codes(410) == {"link_expired"}


def test_every_error_is_documented_in_the_error_envelope(schema: dict[str, Any]) -> None:
    envelope = schema["components"]["schemas"]["ErrorEnvelope"]
    assert set(resolve(schema, envelope["properties"]["error"])["properties"]) == {
        "code",
        "message",
        "details",
    }
    for op in operations(schema):
        errors = {s: r for s, r in op.spec["responses"].items() if s[0] in "45"}
        assert errors, op.id
        for status, response in errors.items():
            assert list(response["content"]) == ["application/json"], (op.id, status)
            media = response["content"]["application/json"]
            assert media["schema"] == {"$ref": "#/components/schemas/ErrorEnvelope"}
            codes = op.codes(int(status))
            assert codes, (op.id, status)
            for code in codes:  # each code is explained in the status's description
                assert f"`{code}`" in response["description"], (op.id, status, code)


# --- written for users --------------------------------------------------------------


def _view_classes() -> Iterator[type]:
    def walk(patterns: list[Any]) -> Iterator[Any]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns)
            elif isinstance(pattern, URLPattern):
                yield pattern.callback

    for callback in walk(get_resolver().url_patterns):
        cls = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if isinstance(cls, type) and issubclass(cls, APIView):
            yield cls


def code_docstrings() -> set[str]:
    """Docstrings of every API view class, its bases below DRF's, and its handlers:
    what drf-spectacular shows when an operation has no description of its own."""
    found = set()
    for cls in _view_classes():
        for klass in cls.__mro__[: cls.__mro__.index(APIView)]:
            found.add(klass.__doc__)
        for method in _METHODS:
            found.add(getattr(getattr(cls, method, None), "__doc__", None))
    return {" ".join(inspect.cleandoc(doc).split()) for doc in found if doc}


def test_no_operation_is_described_by_a_code_docstring(schema: dict[str, Any]) -> None:
    docstrings = code_docstrings()
    assert any("tenant-facing view" in doc for doc in docstrings)  # the base view's
    for op in operations(schema):
        assert op.spec.get("summary"), op.id
        description = " ".join(op.spec.get("description", "").split())
        assert len(description) > 40, op.id
        for doc in docstrings:
            assert doc[:60] not in description, (op.id, doc)


def test_the_voice_upload_is_a_file_picker(schema: dict[str, Any]) -> None:
    [upload] = [op for op in operations(schema) if op.id == "voices_create"]
    content = upload.spec["requestBody"]["content"]
    assert list(content) == ["multipart/form-data"]
    audio = resolve(schema, content["multipart/form-data"]["schema"])["properties"]["audio"]
    assert (audio["type"], audio["format"]) == ("string", "binary")
    for op in operations(schema):  # no request field anywhere asks for a URL instead
        for media in op.spec.get("requestBody", {}).get("content", {}).values():
            for prop in resolve(schema, media["schema"]).get("properties", {}).values():
                assert prop.get("format") != "uri", op.id
