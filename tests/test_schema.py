"""The OpenAPI schema is valid and documents every /v1/ route; the docs page renders."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate
from rest_framework.test import APIClient

from synthesis.audio_out import CONTENT_TYPES

_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")
# Pages for people, not API operations: the schema, its docs page, the realtime playground.
_NOT_IN_SCHEMA = {"/v1/schema/", "/v1/docs/", "/v1/playground/"}


def routes(patterns: list[Any], prefix: str = "") -> Iterator[str]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from routes(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            yield "/" + route


def api_paths() -> set[str]:
    paths = {_CONVERTER.sub(r"{\1}", route) for route in routes(get_resolver().url_patterns)}
    return {p for p in paths if p.startswith("/v1/") and p not in _NOT_IN_SCHEMA}


@pytest.fixture
def schema(anonymous: APIClient) -> dict[str, Any]:
    response = anonymous.get("/v1/schema/", {"format": "json"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return response.json()


@pytest.mark.django_db
def test_the_schema_is_a_valid_openapi_document(schema: dict[str, Any]) -> None:
    validate(schema)

    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Chorus API"


@pytest.mark.django_db
def test_the_schema_is_also_served_as_json_by_accept_header(anonymous: APIClient) -> None:
    response = anonymous.get("/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    assert response.status_code == 200
    validate(response.json())


@pytest.mark.django_db
def test_every_v1_route_is_in_the_schema(schema: dict[str, Any]) -> None:
    expected = api_paths()

    assert {"/v1/voices", "/v1/voices/{voice_id}", "/v1/speech"} <= expected
    assert expected <= set(schema["paths"]), expected - set(schema["paths"])
    assert set(schema["paths"]) <= expected


@pytest.mark.django_db
def test_the_schema_documents_the_bearer_key_on_tenant_routes(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    bearer = [name for name, s in schemes.items() if s.get("scheme", "").lower() == "bearer"]
    assert bearer

    for path in ("/v1/voices", "/v1/speech"):
        for operation in schema["paths"][path].values():
            names = {name for requirement in operation["security"] for name in requirement}
            assert names & set(bearer), (path, operation["operationId"])


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/speech", "/v1/audio/speech"])
def test_a_streamed_answer_lists_every_media_type_the_relay_sends(
    schema: dict[str, Any], path: str
) -> None:
    streamed = schema["paths"][path]["post"]["responses"]["200"]
    audio_types = set(CONTENT_TYPES.values())

    assert set(streamed["content"]) == audio_types | {"text/event-stream"}
    assert {"audio/wav", "application/octet-stream", "audio/ogg"} <= audio_types
    for media_type in audio_types:
        assert streamed["content"][media_type]["schema"] == {"type": "string", "format": "binary"}
    assert streamed["content"]["text/event-stream"]["examples"]
    assert streamed["description"]


@pytest.mark.django_db
def test_a_job_submitted_to_speech_is_also_documented_as_202(schema: dict[str, Any]) -> None:
    responses = schema["paths"]["/v1/speech"]["post"]["responses"]

    assert responses["202"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/JobOutput"
    }
    assert {"Location", "X-RateLimit-Remaining"} <= set(responses["202"]["headers"])
    assert {"Location", "X-Job-Id"} <= set(responses["200"]["headers"])
    assert "Retry-After" in responses["429"]["headers"]


@pytest.mark.django_db
def test_every_operation_is_tagged_with_a_described_tag(schema: dict[str, Any]) -> None:
    described = {tag["name"] for tag in schema["tags"] if tag.get("description")}
    for item in schema["paths"].values():
        for operation in item.values():
            assert set(operation["tags"]) <= described, operation["operationId"]


@pytest.mark.django_db
def test_the_docs_page_renders(anonymous: APIClient) -> None:
    response = anonymous.get("/v1/docs/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"swagger" in response.content.lower()
