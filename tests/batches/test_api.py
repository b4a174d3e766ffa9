"""POST/GET /v1/batches and cancel: validation, all-or-nothing admission, the
manifest, per-item refunds, the completion signal, tenant isolation."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from batches.cancelling import batch_cancel_finish
from batches.models import ArchiveStatus, Batch, BatchItem
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.engines.base import Engine
from synthesis.models import Job
from synthesis.services.execution import job_execute
from tests.batches.conftest import run_jobs, submit, waiting_jobs
from tests.conftest import Persona
from tests.fake_engines import FailingEngine

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]


def _items(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"text": f"Item number {i}.", **fields} for i in range(n)]


def _nothing_created(persona: Persona) -> None:
    assert not Batch.objects.filter(tenant=persona.tenant).exists()
    assert not Job.objects.filter(tenant=persona.tenant).exists()
    assert not LedgerEntry.objects.filter(tenant=persona.tenant).exists()
    period = UsagePeriod.objects.filter(tenant=persona.tenant).first()
    assert period is None or period.characters_reserved == 0


# --- validation: one bad item refuses the batch, naming it --------------------------


@pytest.mark.parametrize(
    ("bad", "status", "code", "field"),
    [
        ({"text": ""}, 400, "invalid_request", "text"),
        ({"text": "Hi.", "speed": 9}, 400, "invalid_request", "speed"),
        ({"text": "Hi.", "format": "aiff"}, 400, "invalid_request", "format"),
        ({"text": "Hi.", "fromat": "mp3"}, 400, "unknown_field", ""),
        ({"text": "Hi.", "metadata": {"blob": "x" * 3000}}, 400, "invalid_request", "metadata"),
        ({"text": "Hi.", "metadata": ["not", "an", "object"]}, 400, "invalid_request", "metadata"),
        ({"text": "Hi.", "custom_id": "a", "id": "b"}, 400, "invalid_request", "custom_id"),
        ({"text": "x" * 5000}, 422, "text_too_long", "text"),
        (
            {"text": "Hi.", "format": "opus", "sample_rate": 22050},
            422,
            "unsupported_output",
            "sample_rate",
        ),
        ({"text": "Hi.", "voice_id": str(uuid.uuid4())}, 404, "not_found", "voice_id"),
        ("just text", 400, "invalid_request", "items"),
    ],
)
def test_one_bad_item_refuses_the_batch_with_its_index_and_field(
    alice: Persona, broker: Any, bad: Any, status: int, code: str, field: str
) -> None:
    items: list[Any] = [*_items(3), bad, *_items(2)]

    response = submit(alice, items)

    assert response.status_code == status, response.json()
    error = response.json()["error"]
    assert error["code"] == code
    assert error["details"]["index"] == 3
    if field:
        assert error["details"]["field"] == field
    assert error["message"].startswith("Item 3: ")
    _nothing_created(alice)


def test_a_batch_needs_items_and_takes_no_unknown_field(alice: Persona, broker: Any) -> None:
    empty = submit(alice, [])
    assert empty.status_code == 400
    assert empty.json()["error"]["details"]["fields"]["items"]
    unknown = submit(alice, _items(1), colour="red")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "unknown_field"
    _nothing_created(alice)


def test_more_items_than_the_plan_takes_is_refused_whole(alice: Persona, broker: Any) -> None:
    limit = alice.tenant.plan.batch_max_items

    response = submit(alice, _items(limit + 1))

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "batch_too_large"
    assert response.json()["error"]["details"] == {
        "limit": limit,
        "value": limit + 1,
        "field": "items",
    }
    _nothing_created(alice)


def test_more_characters_than_the_plan_takes_in_one_batch_is_refused(
    alice: Persona, broker: Any
) -> None:
    limit = alice.tenant.plan.batch_max_characters
    items = [{"text": "y" * 290} for _ in range(limit // 290 + 1)]

    response = submit(alice, items)

    assert response.status_code == 422
    assert response.json()["error"]["details"]["limit"] == limit
    _nothing_created(alice)


def test_a_priority_outside_the_plan_is_refused(alice: Persona, broker: Any) -> None:
    alice.tenant.limit_overrides = {"allowed_priorities": ["low"]}
    alice.tenant.save()

    response = submit(alice, _items(2), priority="high")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "priority_not_allowed"
    _nothing_created(alice)


# --- admission is all or nothing --------------------------------------------------


def test_a_batch_that_does_not_fit_the_months_quota_is_refused_whole(
    alice: Persona, broker: Any
) -> None:
    items = _items(5)
    needed = sum(len(item["text"]) for item in items)
    alice.tenant.limit_overrides = {"monthly_characters": needed - 1}
    alice.tenant.save()

    response = submit(alice, items)

    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert error["details"]["requested"] == needed
    _nothing_created(alice)


def test_a_batch_refused_during_admission_keeps_nothing(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks before admission passed (a race: the quota ran out in between);
    admission, of every item at once (`batches.admission`), refuses them all."""
    from quotas.errors import QuotaExceeded

    def refuse(**kwargs: Any) -> Any:
        raise QuotaExceeded("The month's characters ran out.")

    monkeypatch.setattr("batches.admission.quota_admit", refuse)

    response = submit(alice, _items(5))

    assert response.status_code == 429
    assert response.json()["error"]["code"] == "quota_exceeded"
    _nothing_created(alice)
    assert broker.llen("synth.low") == 0  # nothing was published either


def test_batch_items_do_not_hold_the_plans_jobs_at_once(alice: Persona, broker: Any) -> None:
    alice.tenant.limit_overrides = {"max_concurrent_jobs": 2}
    alice.tenant.save()

    batch = submit(alice, _items(6))
    singles = [
        alice.client.post("/v1/speech", {"text": f"A single job, {n}."}, format="json")
        for n in range(3)
    ]

    assert batch.status_code == 202, batch.json()
    assert [r.status_code for r in singles] == [202, 202, 429]
    assert singles[2].json()["error"]["details"] == {"limit": 2, "value": 2}
    # The count reads single jobs only: a batch's jobs are marked as its items.
    marked = dict(Job.objects.filter(tenant=alice.tenant).values_list("text", "in_batch"))
    assert sorted(marked.values()) == [False] * 2 + [True] * 6


# --- the manifest -------------------------------------------------------------------


def test_the_manifest_reports_each_item_and_the_batch_completes(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    items = [
        {"text": "First.", "custom_id": "a-1", "metadata": {"chapter": 1}},
        {"text": "Second.", "id": "a-2", "format": "mp3"},
    ]
    created = submit(alice, items)
    assert created.status_code == 202, created.json()
    body = created.json()
    assert created["Location"] == f"/v1/batches/{body['id']}"
    assert body["status"] == "running"
    assert body["priority"] == "low"
    assert body["item_count"] == 2
    assert body["counts"]["queued"] == 2
    assert body["archive"] == {"status": "waiting", "url": None, "expires_at": None, "bytes": None}
    first, second = body["items"]["results"]
    assert (first["index"], first["custom_id"], first["metadata"]) == (0, "a-1", {"chapter": 1})
    assert (second["index"], second["custom_id"]) == (1, "a-2")
    assert first["status"] == "queued"
    assert first["audio_url"] is None
    assert broker.llen("synth.low") == 2

    run_jobs(engine, waiting_jobs(body["id"]))

    manifest = alice.client.get(f"/v1/batches/{body['id']}").json()
    assert manifest["status"] == "completed"
    assert manifest["counts"]["succeeded"] == 2
    assert manifest["finished_at"]
    for item in manifest["items"]["results"]:
        assert item["status"] == "succeeded"
        assert item["error"] is None
        assert "/v1/files/chorus-alice/speech/" in item["audio_url"]
    assert completions == [(uuid.UUID(body["id"]), "completed")]
    assert light_queue.llen("light") == 1  # the archive, for a light worker


def test_the_manifest_pages_its_items_with_a_cursor(alice: Persona, broker: Any) -> None:
    batch_id = submit(alice, _items(7)).json()["id"]
    seen: list[int] = []
    url: str | None = f"/v1/batches/{batch_id}?limit=3"
    pages = 0
    while url:
        page = alice.client.get(url).json()["items"]
        seen += [item["index"] for item in page["results"]]
        url = page["next"]
        pages += 1
    assert seen == list(range(7))
    assert pages == 3
    bad = alice.client.get(f"/v1/batches/{batch_id}?cursor=%%%")
    assert bad.status_code == 400
    assert bad.json()["error"]["details"] == {"field": "cursor"}


def test_the_list_shows_the_tenants_batches_newest_first_with_counts(
    alice: Persona, bob: Persona, broker: Any, settings: Any
) -> None:
    settings.TENANT_BROKER_SLOTS = 2  # the production default: later items wait
    older = submit(alice, _items(2)).json()["id"]
    newer = submit(alice, _items(3)).json()["id"]
    submit(bob, _items(1))

    listed = alice.client.get("/v1/batches").json()

    assert [b["id"] for b in listed["results"]] == [newer, older]
    counts = [(b["counts"]["queued"], b["counts"]["pending"]) for b in listed["results"]]
    assert counts == [(0, 3), (2, 0)]  # the older batch's two took alice's two slots
    assert "items" not in listed["results"][0]


# --- partial failure, refunds and cancel -----------------------------------------


def test_failed_items_are_refunded_one_by_one_and_reported(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    body = submit(alice, _items(3)).json()
    first, second, third = waiting_jobs(body["id"])

    run_jobs(engine, [first, third])
    job_execute(job_id=second.pk, engine=FailingEngine(engine), worker="w", epoch=second.epoch)  # type: ignore[arg-type]

    manifest = alice.client.get(f"/v1/batches/{body['id']}").json()
    assert manifest["status"] == "completed_with_failures"
    assert manifest["counts"]["succeeded"] == 2
    assert manifest["counts"]["failed"] == 1
    failed = manifest["items"]["results"][1]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "engine_error"
    assert failed["audio_url"] is None
    refunded = LedgerEntry.objects.filter(tenant=alice.tenant, kind=LedgerKind.REFUND)
    assert list(refunded.values_list("job_id", flat=True)) == [second.pk]
    committed = LedgerEntry.objects.filter(tenant=alice.tenant, kind=LedgerKind.COMMIT)
    assert {e.job_id for e in committed} == {first.pk, third.pk}
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert period.characters_reserved == 0
    assert period.characters_used == first.characters + third.characters
    assert completions == [(uuid.UUID(body["id"]), "completed_with_failures")]


def test_cancel_stops_unfinished_items_and_refunds_them(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    body = submit(alice, _items(4)).json()
    done = waiting_jobs(body["id"])[0]
    run_jobs(engine, [done])

    cancelled = alice.client.post(f"/v1/batches/{body['id']}/cancel")

    assert cancelled.status_code == 202, cancelled.json()
    manifest = cancelled.json()
    assert manifest["status"] == "cancelling"  # until a light worker ends it
    assert manifest["counts"]["succeeded"] == 1
    assert manifest["counts"]["cancelled"] == 3
    refunds = LedgerEntry.objects.filter(tenant=alice.tenant, kind=LedgerKind.REFUND)
    assert refunds.count() == 3
    assert done.pk not in set(refunds.values_list("job_id", flat=True))
    assert UsagePeriod.objects.get(tenant=alice.tenant).characters_reserved == 0
    assert completions == []
    assert light_queue.llen("light") == 1  # the batch's end

    assert batch_cancel_finish(batch_id=uuid.UUID(body["id"]))
    assert alice.client.get(f"/v1/batches/{body['id']}").json()["status"] == "cancelled"
    assert completions == [(uuid.UUID(body["id"]), "cancelled")]
    assert light_queue.llen("light") == 2  # and its archive

    again = alice.client.post(f"/v1/batches/{body['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "batch_not_cancellable"
    assert len(completions) == 1


def test_the_last_two_items_finishing_at_once_complete_the_batch_once(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine, completions: list[Any]
) -> None:
    rounds = 5
    for _ in range(rounds):
        body = submit(alice, _items(3)).json()
        first, *last_two = waiting_jobs(body["id"])
        run_jobs(engine, [first])
        start = threading.Barrier(len(last_two))

        def finish(job: Job, start: threading.Barrier = start) -> None:
            try:
                start.wait()
                job_execute(job_id=job.pk, engine=engine, worker="w", epoch=job.epoch)
            finally:
                connection.close()

        threads = [threading.Thread(target=finish, args=(job,)) for job in last_two]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert Batch.objects.get(pk=body["id"]).status == "completed"
    assert len(completions) == rounds
    assert len({batch_id for batch_id, _ in completions}) == rounds
    assert light_queue.llen("light") == rounds


# --- isolation ----------------------------------------------------------------------


def test_another_tenants_batch_does_not_exist(alice: Persona, bob: Persona, broker: Any) -> None:
    batch_id = submit(alice, _items(2)).json()["id"]

    for response in (
        bob.client.get(f"/v1/batches/{batch_id}"),
        bob.client.post(f"/v1/batches/{batch_id}/cancel"),
    ):
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
    assert bob.client.get("/v1/batches").json()["results"] == []
    assert Batch.objects.get(pk=batch_id).status == "running"
    assert BatchItem.objects.filter(batch_id=batch_id).count() == 2
    assert Batch.objects.get(pk=batch_id).archive_status == ArchiveStatus.WAITING


def test_a_failing_batch_completed_receiver_does_not_stop_the_archive(
    alice: Persona, broker: Any, light_queue: Any, engine: Engine
) -> None:
    from batches.signals import batch_completed

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a webhook that is down")

    batch_completed.connect(broken, dispatch_uid="test-broken")
    try:
        body = submit(alice, _items(1)).json()
        run_jobs(engine, waiting_jobs(body["id"]))
    finally:
        batch_completed.disconnect(dispatch_uid="test-broken")

    assert Batch.objects.get(pk=body["id"]).status == "completed"
    assert Job.objects.get(batch_item__batch_id=body["id"]).status == "succeeded"
    assert light_queue.llen("light") == 1


# --- Idempotency-Key: a retried batch is admitted and charged once -----------------


def _submit_with_key(persona: Persona, items: list[dict[str, Any]], key: str) -> Any:
    return persona.client.post(
        "/v1/batches", {"items": items}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )


def _reserved(persona: Persona) -> int:
    return UsagePeriod.objects.get(tenant=persona.tenant).characters_reserved


def test_the_same_key_and_batch_give_the_same_batch_charged_once(
    alice: Persona, broker: Any
) -> None:
    items = _items(3)
    once = _submit_with_key(alice, items, "retry-1")
    reserved = _reserved(alice)

    again = _submit_with_key(alice, items, "retry-1")

    assert once.status_code == again.status_code == 202
    assert once.json()["id"] == again.json()["id"]
    assert Batch.objects.filter(tenant=alice.tenant).count() == 1
    assert Job.objects.filter(tenant=alice.tenant).count() == 3
    assert _reserved(alice) == reserved == sum(len(item["text"]) for item in items)
    # Without a key, the same body is a new batch, as before.
    assert submit(alice, items).json()["id"] != once.json()["id"]


def test_the_same_key_with_another_batch_is_refused_and_keys_are_per_tenant(
    alice: Persona, bob: Persona, broker: Any
) -> None:
    first = _submit_with_key(alice, _items(2), "k")

    other = _submit_with_key(alice, _items(2, speed=1.5), "k")
    bobs = _submit_with_key(bob, _items(2), "k")

    assert other.status_code == 409
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.json()["error"]["details"]["batch_id"] == first.json()["id"]
    assert Batch.objects.filter(tenant=alice.tenant).count() == 1
    assert bobs.status_code == 202
    assert bobs.json()["id"] != first.json()["id"]


def test_a_refused_batch_keeps_no_key_and_a_key_is_forgotten_after_a_day(
    alice: Persona, broker: Any
) -> None:
    items = _items(2)
    alice.tenant.limit_overrides = {"monthly_characters": 5}
    alice.tenant.save()
    assert _submit_with_key(alice, items, "k").status_code == 429
    _nothing_created(alice)
    alice.tenant.limit_overrides = {}
    alice.tenant.save()

    admitted = _submit_with_key(alice, items, "k")  # a new attempt, admitted
    assert admitted.status_code == 202
    Batch.objects.filter(pk=admitted.json()["id"]).update(
        created_at=timezone.now() - timedelta(hours=25)
    )
    later = _submit_with_key(alice, _items(1), "k")  # another batch: the key was forgotten

    assert later.status_code == 202
    assert later.json()["id"] != admitted.json()["id"]
    assert Batch.objects.filter(tenant=alice.tenant).count() == 2


def test_two_requests_racing_with_one_key_make_one_batch(alice: Persona, broker: Any) -> None:
    items = _items(20)
    start = threading.Barrier(2)
    answers: list[Any] = []

    def post() -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {alice.key}")
        start.wait()
        try:
            answers.append(_submit_with_key_as(client, items, "race"))
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [answer.status_code for answer in answers] == [202, 202]
    assert answers[0].json()["id"] == answers[1].json()["id"]
    assert Batch.objects.filter(tenant=alice.tenant).count() == 1
    assert Job.objects.filter(tenant=alice.tenant).count() == 20
    assert _reserved(alice) == sum(len(item["text"]) for item in items)


def _submit_with_key_as(client: APIClient, items: list[dict[str, Any]], key: str) -> Any:
    return client.post("/v1/batches", {"items": items}, format="json", HTTP_IDEMPOTENCY_KEY=key)
