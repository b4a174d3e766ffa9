"""Each request: one JSON log line, its id in X-Request-Id (the client's when safe)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from chorus.logs import JsonFormatter, log_bind, log_scope, request_id_from
from tests.conftest import Persona

GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.mark.parametrize("given", ["abc", "req-42", "2f1c:7.retry_2", "a" * 64])
def test_a_safe_client_request_id_is_kept(given: str) -> None:
    assert request_id_from(given) == given


@pytest.mark.parametrize(
    "given", [None, "", "a" * 65, "two words", "-leading-dash", "x\ny", "é", '"quoted"']
)
def test_anything_else_gets_a_fresh_id(given: str | None) -> None:
    assert GENERATED.fullmatch(request_id_from(given))


@pytest.mark.django_db
def test_the_request_id_comes_back_in_the_answer(alice: Persona) -> None:
    echoed = alice.client.get("/v1/usage", HTTP_X_REQUEST_ID="client-7")
    assert echoed["X-Request-Id"] == "client-7"
    fresh = alice.client.get("/v1/usage", HTTP_X_REQUEST_ID="not safe!")
    assert GENERATED.fullmatch(fresh["X-Request-Id"])
    # Errors and unknown routes carry one too.
    assert GENERATED.fullmatch(alice.client.get("/v1/nothing-here")["X-Request-Id"])


@pytest.mark.django_db
def test_one_line_per_request_with_route_tenant_and_job_never_the_text(
    alice: Persona, caplog: Any
) -> None:
    text = "The quick brown fox speaks in confidence."
    with caplog.at_level(logging.INFO):
        response = alice.client.post(
            "/v1/speech", {"text": text}, format="json", HTTP_X_REQUEST_ID="submit-1"
        )
    assert response.status_code == 202
    lines = [json.loads(JsonFormatter().format(record)) for record in caplog.records]
    [request] = [line for line in lines if line.get("event") == "request"]
    assert request["request_id"] == "submit-1"
    assert request["route"] == "speech-list"
    assert (request["method"], request["status"]) == ("POST", 202)
    assert request["tenant_id"] == alice.tenant.pk
    assert request["job_id"] == response.json()["id"]
    [admitted] = [line for line in lines if line.get("event") == "job"]
    assert admitted["request_id"] == "submit-1"
    assert admitted["status"] == "queued"
    everything = json.dumps(lines)
    assert text not in everything
    assert alice.key not in everything


def test_the_formatter_adds_the_scope_and_extra_fields_and_the_traceback() -> None:
    logger = logging.getLogger("chorus.test")
    with log_scope(request_id="r1"):
        log_bind(tenant_id=3)
        try:
            raise ValueError("boom")
        except ValueError:
            record = logger.makeRecord(
                "chorus.test",
                logging.ERROR,
                __file__,
                1,
                "failed %s",
                ("here",),
                None,
                extra={"route": "x"},
            )
            import sys

            record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "failed here"
    assert (line["request_id"], line["tenant_id"], line["route"]) == ("r1", 3, "x")
    assert line["level"] == "error"
    assert "ValueError: boom" in line["exc"]
    # Outside any scope, nothing is bound and nothing leaks from the last one.
    log_bind(tenant_id=4)
    bare = json.loads(JsonFormatter().format(logging.makeLogRecord({"msg": "hi"})))
    assert "tenant_id" not in bare
    assert "request_id" not in bare
