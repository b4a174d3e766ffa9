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

from batches.models import Batch
from chorus.asgi import application
from quotas.body_limits import MULTIPART_OVERHEAD_BYTES
from quotas.middleware import BodyLimitMiddleware
from quotas.plans import tenant_batch_limits
from synthesis.models import Job, Voice
from tenants.models import Plan
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona, make_persona

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
    # The plan's figure, as the view reports it; the framing allowance is not a limit.
    assert error["details"] == {"limit_bytes": 100_000, "size_bytes": declared}
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
        scope(
            "/v1/webhooks/endpoints",
            content_length=10_001,
            key=alice.key,
            content_type="application/json",
        ),
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


# --- limits per route, from the caller's plan ---------------------------------------
# Bodies past Django's 1 MiB (DATA_UPLOAD_MAX_MEMORY_SIZE) used to answer a bare 400
# `bad_request`, however much the plan allowed; now each plan route takes what its
# plan allows and refuses more with 413 and the code of that plan limit.

CJK = "\u58f0"  # sent as a 6-byte \uXXXX escape by json.dumps' default ASCII output


@pytest.fixture
def erin(db: None) -> Persona:
    """A tenant on the enterprise plan: batches of 5,000 items and 5,000,000
    characters, texts of 5,000, long texts of 100,000."""
    plan, _ = Plan.objects.update_or_create(
        name="enterprise",
        defaults={
            "monthly_characters": 50_000_000,
            "max_text_chars": 5_000,
            "max_longform_chars": 100_000,
            "requests_per_minute": 3_000,
            "max_concurrent_jobs": 64,
            "batch_max_items": 5_000,
            "batch_max_characters": 5_000_000,
        },
    )
    return make_persona("erin", plan)


def post_json(persona: Persona, path: str, body: Any) -> Any:
    # json.dumps' defaults, as most clients send: ASCII output, ", " and ": ".
    return persona.client.post(path, json.dumps(body), content_type="application/json")


def nothing_admitted() -> None:
    assert not Job.objects.exists()
    assert not Batch.objects.exists()


@pytest.mark.embedded
def test_the_largest_batch_a_plan_allows_is_admitted_in_any_encoding(
    alice: Persona, broker: Any, settings: Any
) -> None:
    settings.ENGINE = "synthetic"  # follows instructions: every field at its largest
    limits = tenant_batch_limits(alice.tenant)
    chars = limits.max_characters // limits.max_items
    assert chars <= alice.tenant.plan.max_text_chars
    item = {
        "text": CJK * chars,
        "instruction": CJK * 500,
        "custom_id": CJK * 64,
        "id": CJK * 64,
        "metadata": {"note": CJK * 330},  # 2,000 bytes as JSON
        "format": "wav",
        "sample_rate": 24000,
        "speed": 1.0,
        "reuse": False,
        "voice_id": None,
    }
    items = [{**item, "custom_id": f"{n:03}" + item["custom_id"][3:]} for n in range(100)]
    items = [{**it, "id": it["custom_id"]} for it in items]
    body = json.dumps({"items": items, "priority": "low"}, indent=2)

    response = alice.client.post("/v1/batches", body, content_type="application/json")

    assert response.status_code == 202, response.content[:300]
    assert len(body) > 700_000  # most of it the fields other than text


@pytest.mark.embedded
def test_a_batch_body_past_the_plans_largest_is_refused_413_batch_too_large(
    alice: Persona, broker: Any
) -> None:
    items = [{"text": "a" * 200} for _ in range(10_000)]  # 2 MB; the plan takes 100 items

    response = post_json(alice, "/v1/batches", {"items": items})

    error = assert_error(response, 413, "batch_too_large")
    assert error["details"]["size_bytes"] == len(json.dumps({"items": items}))
    assert error["details"]["limit_bytes"] < error["details"]["size_bytes"]
    nothing_admitted()


@pytest.mark.embedded
def test_an_enterprise_batch_over_1_mib_is_admitted_where_a_smaller_plan_gets_413(
    alice: Persona, erin: Persona, broker: Any
) -> None:
    items = [{"text": f"Item {n}. " + "a" * 4_990} for n in range(220)]
    body = json.dumps({"items": items})
    assert len(body) > 1024 * 1024

    admitted = erin.client.post("/v1/batches", body, content_type="application/json")
    refused = alice.client.post("/v1/batches", body, content_type="application/json")

    assert admitted.status_code == 202, admitted.content[:300]
    assert Job.objects.filter(tenant=erin.tenant).count() == 220
    assert_error(refused, 413, "batch_too_large")
    assert not Job.objects.filter(tenant=alice.tenant).exists()


@pytest.mark.embedded
@pytest.mark.parametrize("path", ["/v1/speech", "/v1/audio/speech"])
def test_a_10_mb_text_is_refused_413_longform_text_too_long(
    erin: Persona, broker: Any, path: str
) -> None:
    text = "Words to say. " * 750_000
    body = {"text": text} if path == "/v1/speech" else {"model": "tts-1", "input": text}
    if path == "/v1/audio/speech":
        body["voice"] = "alloy"

    response = post_json(erin, path, body)

    error = assert_error(response, 413, "longform_text_too_long")
    assert error["details"]["size_bytes"] > 10_000_000
    nothing_admitted()


@pytest.mark.embedded
def test_the_longest_text_a_plan_allows_is_admitted_in_any_encoding(
    erin: Persona, broker: Any, settings: Any
) -> None:
    settings.ENGINE = "synthetic"
    body = {"text": CJK * 100_000, "instruction": CJK * 500, "format": "wav", "language": "zh"}

    response = post_json(erin, "/v1/speech", body)

    assert response.status_code == 202, response.content[:300]
    assert len(json.dumps(body)) > 600_000


@pytest.mark.embedded
def test_on_a_plan_without_long_texts_a_large_text_is_refused_413_text_too_long(
    alice: Persona, broker: Any
) -> None:
    response = post_json(alice, "/v1/speech", {"text": "a" * 2_000_000})

    error = assert_error(response, 413, "text_too_long")
    assert error["details"]["limit_bytes"] < 10_000  # 300 characters, escaped, and the rest
    nothing_admitted()


@pytest.mark.embedded
def test_other_routes_keep_a_1_mib_limit_answered_413(alice: Persona) -> None:
    response = post_json(
        alice, "/v1/webhooks/endpoints", {"url": "https://example.com/" + "a" * 1_100_000}
    )

    error = assert_error(response, 413, "file_too_large")
    assert error["details"]["limit_bytes"] == 1024 * 1024


@pytest.mark.embedded
def test_without_a_key_a_large_body_is_answered_401(anonymous: Any) -> None:
    body = json.dumps({"items": [{"text": "a" * 200} for _ in range(10_000)]})

    response = anonymous.post("/v1/batches", body, content_type="application/json")

    assert_error(response, 401, "unauthenticated")


# --- the same limits in the ASGI layer, before anything reads the body ----------------


def test_the_asgi_layer_refuses_a_batch_past_the_plan_unread(alice: Persona) -> None:
    status, _, body = call(
        application,
        scope(
            "/v1/batches",
            content_length=5_000_000,
            key=alice.key,
            content_type="application/json",
        ),
        must_not_read,
    )

    assert status == 413
    assert json.loads(body)["error"]["code"] == "batch_too_large"
    nothing_admitted()


def test_the_asgi_layer_refuses_a_10_mb_text_unread(erin: Persona) -> None:
    status, _, body = call(
        application,
        scope(
            "/v1/audio/speech",
            content_length=10_000_000,
            key=erin.key,
            content_type="application/json",
        ),
        must_not_read,
    )

    assert status == 413
    error = json.loads(body)["error"]
    assert error["code"] == "longform_text_too_long"
    assert error["details"]["limit_bytes"] < 1_000_000


def test_the_asgi_layer_cuts_a_chunked_body_off_at_the_plans_limit(alice: Persona) -> None:
    status, _, body = call(
        application,
        scope("/v1/speech", key=alice.key, content_type="application/json"),
        body_then_wait(b'{"text": "' + b"a" * 100_000, chunk=4096),
    )

    assert status == 413
    error = json.loads(body)["error"]
    assert error["code"] == "text_too_long"
    assert error["details"]["size_bytes"] < 20_000  # stopped reading soon after the limit


def test_the_asgi_layer_admits_an_enterprise_batch_over_1_mib(erin: Persona, broker: Any) -> None:
    items = [{"text": f"Item {n}. " + "a" * 4_990} for n in range(220)]
    payload = json.dumps({"items": items}).encode()

    status, _, answer = call(
        application,
        scope(
            "/v1/batches",
            content_length=len(payload),
            key=erin.key,
            content_type="application/json",
        ),
        body_then_wait(payload),
    )

    assert status == 202, answer[:300]
