"""Strings that are not text: a lone UTF-16 surrogate in any string input.

JSON's `"\\ud800"` escape decodes to a lone surrogate, which PostgreSQL's driver
cannot encode: wherever such a string reached the database the answer was a 500.
Every string input of every route answers a 4xx instead, in the envelope.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from synthesis.models import Job
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona

LONE = "ab\ud800"

SPEECH = {"text": "Hello.", "format": "wav", "priority": "normal", "instruction": ""}
OPENAI = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "wav"}


def raw_json(value: Any) -> str:
    # ensure_ascii writes the surrogate as the escape a client would send.
    return json.dumps(value, ensure_ascii=True)


def bodies(base: dict[str, Any]) -> list[tuple[str, Any]]:
    """The body with each string field, and each key, replaced by a lone surrogate."""
    cases: list[tuple[str, Any]] = [(field, {**base, field: LONE}) for field in base]
    cases.append(("a key", {**base, LONE: "x"}))
    cases.append(("a nested value", {**base, "voice": {"id": "\udfff"}}))
    return cases


@pytest.mark.parametrize(("route", "base"), [("/v1/speech", SPEECH), ("/v1/audio/speech", OPENAI)])
def test_every_json_string_field_refuses_a_lone_surrogate(
    alice: Persona, broker: Any, route: str, base: dict[str, Any]
) -> None:
    for where, body in bodies(base):
        response = alice.client.post(route, raw_json(body), content_type="application/json")
        error = assert_error(response, 400, "malformed_request")
        assert "surrogate" in error["message"], where
    assert not Job.objects.exists()


def test_an_idempotency_key_or_query_that_is_not_utf8_never_answers_500(
    alice: Persona, broker: Any
) -> None:
    submitted = alice.client.post(
        "/v1/speech",
        {"text": "Hello."},
        format="json",
        HTTP_IDEMPOTENCY_KEY="\xed\xa0\x80",  # a surrogate's UTF-8 bytes, as latin-1
    )
    listed = alice.client.get("/v1/speech?limit=%ED%A0%80&offset=%ED%A0%80")
    voices = alice.client.get("/v1/voices?limit=1%ED%A0%80")

    assert submitted.status_code == 202
    assert listed.status_code in {200, 400}
    assert voices.status_code in {200, 400}


def test_a_voice_upload_whose_fields_are_not_utf8_never_answers_500(alice: Persona) -> None:
    # A multipart body is bytes: a surrogate can only arrive as its (invalid) UTF-8 bytes.
    boundary = b"chorusboundary"
    bad = b"\xed\xa0\x80"

    def part(name: bytes, value: bytes, filename: bytes = b"") -> bytes:
        disposition = b'form-data; name="' + name + b'"'
        if filename:
            disposition += b'; filename="' + filename + b'"\r\nContent-Type: audio/wav'
        return b"--" + boundary + b"\r\nContent-Disposition: " + disposition + b"\r\n\r\n" + value

    body = b"\r\n".join(
        [
            part(b"name", b"narrator " + bad),
            part(b"transcript", bad),
            part(b"audio", audio_file(4.0), filename=b"ref" + bad + b".wav"),
            b"--" + boundary + b"--\r\n",
        ]
    )
    response = alice.client.post(
        "/v1/voices", body, content_type="multipart/form-data; boundary=chorusboundary"
    )

    assert response.status_code in {201, 400}, response.content
    if response.status_code == 201:
        json.dumps(response.json(), ensure_ascii=False).encode("utf-8")  # stored as text
