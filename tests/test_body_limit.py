"""The ASGI layer refuses an oversized body before anything reads it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from chorus.asgi import application
from chorus.body_limit import BodyLimitMiddleware
from synthesis.models import Voice
from synthesis.uploads import MULTIPART_OVERHEAD_BYTES
from tenants.models import Plan
from tests.audio_files import audio_file
from tests.conftest import Persona

Message = dict[str, Any]

pytestmark = pytest.mark.django_db(transaction=True)


def scope(
    path: str,
    *,
    method: str = "POST",
    content_length: int | None = None,
    key: str | None = None,
    content_type: str = MULTIPART_CONTENT,
) -> dict[str, Any]:
    headers = [(b"host", b"testserver"), (b"content-type", content_type.encode())]
    if content_length is not None:
        headers.append((b"content-length", str(content_length).encode()))
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def must_not_read() -> Message:
    pytest.fail("the body was read")


def body_then_wait(body: bytes, chunk: int = 64 * 1024) -> Callable[[], Awaitable[Message]]:
    """Deliver `body` in chunks, then wait forever (the client stays connected)."""
    chunks = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    reads = iter(range(len(chunks)))

    async def receive() -> Message:
        index = next(reads, None)
        if index is None:
            await asyncio.Event().wait()
        assert index is not None
        return {
            "type": "http.request",
            "body": chunks[index],
            "more_body": index < len(chunks) - 1,
        }

    return receive


def call(app: Any, scope: dict[str, Any], receive: Any) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async_to_sync(app)(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def multipart_voice(audio: bytes, name: str = "Narrator") -> bytes:
    return encode_multipart(
        BOUNDARY, {"name": name, "audio": SimpleUploadedFile("ref.wav", audio, "audio/wav")}
    )


def test_it_refuses_an_upload_over_the_plan_limit_without_reading_it(alice: Persona) -> None:
    alice.tenant.plan.max_upload_bytes = 100_000
    alice.tenant.plan.save()
    declared = 100_000 + MULTIPART_OVERHEAD_BYTES + 1

    status, headers, body = call(
        application,
        scope("/v1/voices", content_length=declared, key=alice.key),
        must_not_read,
    )

    assert status == 413
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert error["code"] == "file_too_large"
    assert error["details"] == {
        "limit_bytes": 100_000 + MULTIPART_OVERHEAD_BYTES,
        "size_bytes": declared,
    }
    assert not Voice.objects.exists()


def test_the_limit_is_the_callers_own_plans(alice: Persona, bob: Persona) -> None:
    body = multipart_voice(audio_file(4.0))
    alice.tenant.plan = Plan.objects.create(name="tiny", max_upload_bytes=1000)
    alice.tenant.save()

    alice_status, _, _ = call(
        application, scope("/v1/voices", content_length=len(body), key=alice.key), must_not_read
    )
    bob_status, _, response = call(
        application,
        scope("/v1/voices", content_length=len(body), key=bob.key),
        body_then_wait(body),
    )

    assert alice_status == 413
    assert bob_status == 201, response
    assert list(Voice.objects.values_list("tenant__slug", flat=True)) == ["bob"]


def test_an_upload_under_the_limit_passes_through_to_the_api(alice: Persona) -> None:
    audio = audio_file(4.0)
    body = multipart_voice(audio)
    alice.tenant.plan.max_upload_bytes = len(audio) + 1
    alice.tenant.plan.save()

    status, _, response = call(
        application,
        scope("/v1/voices", content_length=len(body), key=alice.key),
        body_then_wait(body),
    )

    assert status == 201, response
    created = json.loads(response)
    assert created["size_bytes"] == len(audio)
    assert Voice.objects.get(pk=created["id"]).tenant == alice.tenant


def test_a_trailing_slash_does_not_escape_the_plan_limit(alice: Persona) -> None:
    alice.tenant.plan.max_upload_bytes = 1000
    alice.tenant.plan.save()

    status, _, _ = call(
        application,
        scope("/v1/voices/", content_length=2_000_000, key=alice.key),
        must_not_read,
    )

    assert status == 413


def test_without_a_valid_key_the_service_ceiling_applies(settings: Any, alice: Persona) -> None:
    settings.MAX_REQUEST_BYTES = 1_000_000

    over, _, _ = call(
        application, scope("/v1/voices", content_length=1_000_001, key=None), must_not_read
    )
    unknown_key, _, body = call(
        application,
        scope("/v1/voices", content_length=10, key="ck_" + "x" * 43),
        body_then_wait(b"x" * 10),
    )

    assert over == 413
    assert unknown_key == 401, body
    assert json.loads(body)["error"]["code"] == "invalid_api_key"


def test_any_other_route_is_held_to_the_service_ceiling(settings: Any, alice: Persona) -> None:
    settings.MAX_REQUEST_BYTES = 10_000

    status, _, body = call(
        application,
        scope("/v1/speech", content_length=10_001, key=alice.key, content_type="application/json"),
        must_not_read,
    )

    assert status == 413
    assert json.loads(body)["error"]["details"]["limit_bytes"] == 10_000


def test_a_body_without_a_length_is_cut_off_past_the_ceiling(settings: Any) -> None:
    settings.MAX_REQUEST_BYTES = 1024
    reads: list[Message] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            reads.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    call(BodyLimitMiddleware(app), scope("/v1/speech"), body_then_wait(b"x" * 4096, chunk=512))

    assert [m["type"] for m in reads] == ["http.request", "http.request", "http.disconnect"]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "DELETE"])
def test_a_body_on_any_method_is_held_to_the_ceiling(method: str, settings: Any) -> None:
    # Django spools any body it is sent, whatever the method, so all are counted.
    settings.MAX_REQUEST_BYTES = 1024
    status, _, body = call(
        application, scope("/v1/voices", method=method, content_length=10**9), must_not_read
    )

    assert status == 413
    assert json.loads(body)["error"]["code"] == "file_too_large"


def test_a_body_without_a_length_past_the_ceiling_gets_a_413_envelope(settings: Any) -> None:
    settings.MAX_REQUEST_BYTES = 1024

    status, _, body = call(application, scope("/v1/speech"), body_then_wait(b"x" * 4096, chunk=512))

    assert status == 413
    assert json.loads(body)["error"]["details"]["limit_bytes"] == 1024


# --- bodies sent without a Content-Length (chunked) -------------------------------------


def test_a_chunked_json_body_is_read_like_one_with_a_length(alice: Persona, broker: Any) -> None:
    body = json.dumps({"text": "Hello there.", "priority": "low"}).encode()

    status, _, answer = call(
        application,
        scope("/v1/speech", key=alice.key, content_type="application/json"),
        body_then_wait(body, chunk=7),  # several pieces, no length declared
    )

    assert status == 202, answer
    assert json.loads(answer)["priority"] == "low"


def test_a_chunked_voice_upload_is_read_like_one_with_a_length(alice: Persona) -> None:
    status, _, answer = call(
        application,
        scope("/v1/voices", key=alice.key),
        body_then_wait(multipart_voice(audio_file(4.0))),
    )

    assert status == 201, answer
    assert Voice.objects.filter(tenant=alice.tenant).count() == 1
