"""Quota settlement through a real worker: every job ends charged or refunded,
once, and the period's books balance."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quotas.models import LedgerKind, UsagePeriod
from quotas.services import ledger_total
from tests.audio_files import audio_file
from tests.e2e.conftest import HttpCaller, WorkerProcess, wait_for_job

pytestmark = [pytest.mark.e2e, pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def test_a_real_worker_charges_successes_and_refunds_failures_and_cancels(
    start_worker: Callable[..., WorkerProcess], http_caller: Callable[[str], HttpCaller]
) -> None:
    alice = http_caller("alice")
    upload = alice.http.post(
        "/v1/voices",
        data={"name": "soon gone", "transcript": "A reference.", "language": "en"},
        files={"audio": ("ref.flac", audio_file(4.0, 24000, format="FLAC"), "audio/flac")},
    )
    assert upload.status_code == 201, upload.text
    voice_id = upload.json()["id"]

    def speak(text: str, **body: str) -> dict[str, str]:
        response = alice.http.post("/v1/speech", json={"text": text, **body})
        assert response.status_code == 202, response.text
        return response.json()

    # Submitted before any worker runs, so the voice is gone by the time they do.
    plain = [speak(f"Plain job number {n}." + "!" * n) for n in range(4)]
    voiced = [speak(f"Voiced job {n}." + "?" * n, voice_id=voice_id) for n in range(2)]
    cancelled = plain.pop()
    response = alice.http.post(f"/v1/speech/{cancelled['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "cancelled"
    assert alice.http.delete(f"/v1/voices/{voice_id}").status_code == 204

    start_worker()
    finished = {job["id"]: wait_for_job(alice.http, job["id"]) for job in plain + voiced}

    assert [finished[job["id"]]["status"] for job in plain] == ["succeeded"] * 3
    for job in voiced:
        assert finished[job["id"]]["status"] == "failed"
        assert finished[job["id"]]["error"]["code"] == "engine_error"
        assert "was deleted" in finished[job["id"]]["error"]["message"]
    assert alice.http.get(f"/v1/speech/{cancelled['id']}").json()["status"] == "cancelled"

    tenant = alice.persona.tenant
    committed = ledger_total(tenant=tenant, kind=LedgerKind.COMMIT)
    refunded = ledger_total(tenant=tenant, kind=LedgerKind.REFUND)
    reserved = ledger_total(tenant=tenant, kind=LedgerKind.RESERVE)
    period = UsagePeriod.objects.get(tenant=tenant)
    print(
        f"\nreal worker: reserved {reserved}, committed {committed}, refunded {refunded}, "
        f"used {period.characters_used}, still reserved {period.characters_reserved}"
    )
    assert committed == sum(int(job["characters"]) for job in plain)
    assert refunded == sum(int(job["characters"]) for job in [*voiced, cancelled])
    assert reserved == committed + refunded
    assert period.characters_used == committed
    assert period.characters_reserved == 0
    usage = alice.http.get("/v1/usage").json()
    assert usage["characters"]["used"] == committed
    assert usage["jobs"] == {
        "pending": 0,
        "queued": 0,
        "running": 0,
        "succeeded": 3,
        "failed": 2,
        "cancelled": 1,
    }
