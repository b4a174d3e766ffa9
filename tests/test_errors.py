"""Errors outside any view still answer in the JSON envelope."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.conftest import Persona


def assert_envelope(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]


@pytest.mark.parametrize(
    "path", ["/v1/nothing-here", "/v1/voices/not-a-uuid", "/v1/speech/123", "/v2/voices"]
)
def test_an_unknown_url_answers_404_in_the_envelope(alice: Persona, path: str) -> None:
    assert_envelope(alice.client.get(path), 404, "not_found")


@pytest.mark.django_db
def test_an_unknown_url_answers_404_even_without_credentials(anonymous: APIClient) -> None:
    assert_envelope(anonymous.get("/v1/nothing-here"), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("put", "/v1/voices"),
        ("patch", "/v1/speech"),
        ("delete", "/v1/speech"),
        ("post", "/v1/voices/{voice}"),
    ],
)
def test_a_method_a_route_does_not_support_answers_405_in_the_envelope(
    alice: Persona, method: str, path: str
) -> None:
    url = path.format(voice="00000000-0000-4000-8000-000000000000")

    response = getattr(alice.client, method)(url, {}, format="json")

    assert_envelope(response, 405, "method_not_allowed")
    assert response["Allow"]


def test_a_job_cannot_be_deleted_through_the_api(alice: Persona) -> None:
    job_id = alice.client.post("/v1/speech", {"text": "keep me"}, format="json").json()["id"]

    assert_envelope(alice.client.delete(f"/v1/speech/{job_id}"), 405, "method_not_allowed")
    assert alice.client.get(f"/v1/speech/{job_id}").status_code == 200


def test_an_unacceptable_accept_header_answers_406_in_the_envelope(alice: Persona) -> None:
    response = alice.client.get("/v1/voices", HTTP_ACCEPT="text/html")

    assert_envelope(response, 406, "not_acceptable")


def test_an_unsupported_content_type_answers_415_in_the_envelope(alice: Persona) -> None:
    response = alice.client.post("/v1/speech", "text=hi", content_type="text/plain")

    assert_envelope(response, 415, "unsupported_media_type")


def test_a_database_pool_with_no_free_connection_answers_503_service_busy(
    alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real pool of one connection, held, times out; where the web tier's own
    pool would raise it (authenticating the key) is where it is made to surface."""
    from django.db import connection
    from psycopg_pool import ConnectionPool

    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL (make test sets DATABASE_URL)")
    params = connection.get_connection_params()
    pool = ConnectionPool(kwargs=params, min_size=1, max_size=1, open=True)
    try:
        held = pool.getconn()

        def exhausted(**_: Any) -> None:
            with connection.wrap_database_errors:  # as Django wraps driver errors
                pool.getconn(timeout=0.05)

        monkeypatch.setattr("tenants.authentication.api_key_authenticate", exhausted)
        response = alice.client.get("/v1/usage")
        pool.putconn(held)
    finally:
        pool.close()
    assert_envelope(response, 503, "service_busy")
    assert response["Retry-After"] == "1"
