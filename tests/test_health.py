"""/healthz (the process answers) and /readyz (what a request needs answers)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unreachable import unreachable_broker  # noqa: F401  (a fixture)


@pytest.mark.django_db
def test_liveness_answers_ok(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readiness_checks_database_broker_and_storage(client: Any) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ready",
        "checks": {"database": "ok", "broker": "ok", "storage": "ok"},
    }


@pytest.mark.django_db
@pytest.mark.usefixtures("unreachable_broker")
def test_readiness_fails_while_the_broker_is_down(client: Any) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["storage"] == "ok"
    assert body["checks"]["broker"].startswith("failed: ")
    assert "127.0.0.1" not in response.content.decode()  # no addresses in the answer


@pytest.mark.django_db
def test_readiness_fails_when_the_storage_folder_cannot_be_written(
    client: Any, settings: Any, tmp_path: Any
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    settings.STORAGE = {**settings.STORAGE, "local_root": str(blocker / "storage")}
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["storage"] == "failed: StorageError"
