"""Answers that say what to do instead: the content types a route takes, the route
a trailing slash missed, and the API's docs for the bare host."""

from __future__ import annotations

from django.test import Client

from synthesis.models import Job, Voice
from tests.assertions import assert_error
from tests.conftest import Persona


def test_a_form_body_is_refused_naming_the_content_type_the_route_takes(alice: Persona) -> None:
    # What `curl -d 'text=hi'` sends.
    response = alice.client.post(
        "/v1/speech", "text=hi", content_type="application/x-www-form-urlencoded"
    )

    error = assert_error(response, 415, "unsupported_media_type")
    assert "application/json" in error["message"]
    assert error["details"]["content_types"] == ["application/json"]
    assert not Job.objects.exists()


def test_json_sent_for_a_voice_is_refused_naming_multipart(alice: Persona) -> None:
    response = alice.client.post("/v1/voices", {"name": "narrator"}, format="json")

    error = assert_error(response, 415, "unsupported_media_type")
    assert "multipart/form-data" in error["message"]
    assert error["details"]["content_types"] == ["multipart/form-data"]
    assert not Voice.objects.exists()


def test_a_trailing_slash_is_answered_with_the_route_without_it(alice: Persona) -> None:
    response = alice.client.post("/v1/speech/", {"text": "Hi."}, format="json")

    error = assert_error(response, 404, "not_found")
    assert "/v1/speech." in error["message"]
    assert error["details"]["route"] == "/v1/speech"
    assert not Job.objects.exists()


def test_an_unknown_route_is_still_a_plain_not_found(alice: Persona) -> None:
    error = assert_error(alice.client.get("/v1/nothing-here/"), 404, "not_found")
    assert error["details"] == {}


def test_the_bare_host_leads_to_the_api_docs(db: None) -> None:
    response = Client().get("/")

    assert response.status_code == 302
    assert response["Location"] == "/v1/docs/"
    assert Client().get(response["Location"]).status_code == 200


def test_a_request_without_a_key_is_told_which_header_carries_one(db: None) -> None:
    error = assert_error(Client().get("/v1/usage"), 401, "unauthenticated")
    assert "Authorization: Bearer" in error["message"]


def test_a_key_sent_as_x_api_key_is_told_it_is_not_read(alice: Persona) -> None:
    error = assert_error(
        Client().get("/v1/usage", HTTP_X_API_KEY=alice.key), 401, "unauthenticated"
    )
    assert "X-API-Key" in error["message"]
    assert "Authorization: Bearer" in error["message"]


def test_the_openai_route_without_a_key_names_the_header(db: None) -> None:
    answer = Client().post(
        "/v1/audio/speech", {"input": "hi", "voice": "x"}, content_type="application/json"
    )
    error = assert_error(answer, 401, "unauthenticated")
    assert "Authorization: Bearer" in error["message"]
