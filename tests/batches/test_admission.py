"""A batch's items admitted together (`batches.admission`): a few statements
whatever the batch's size, so a big batch holds the tenant's lock (on SQLite,
the database's one write lock) briefly; each item still an ordinary job,
reserved on its own, queued or held back in submitted order."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from batches import services
from batches.models import Batch, BatchItem
from batches.services import ItemSpec, batch_create
from chorus.errors import NotFound
from quotas.errors import QuotaExceeded
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from synthesis.models import Job, JobStatus, Voice
from synthesis.speech_request import SpeechRequest
from tenants.models import Plan
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db(transaction=True)]

BIG = 1_000


def items(n: int) -> list[ItemSpec]:
    return [
        ItemSpec(speech=SpeechRequest(text=f"Item number {i}."), custom_id=f"c{i}")
        for i in range(n)
    ]


def nothing_created(persona: Persona) -> None:
    assert not Batch.objects.filter(tenant=persona.tenant).exists()
    assert not Job.objects.filter(tenant=persona.tenant).exists()
    assert not LedgerEntry.objects.filter(tenant=persona.tenant).exists()
    period = UsagePeriod.objects.filter(tenant=persona.tenant).first()
    assert period is None or period.characters_reserved == 0


@pytest.fixture
def roomy_batches(plan: Plan) -> None:
    """The test plan takes the free tier's 100 items in a batch: room for a big one."""
    plan.batch_max_items, plan.batch_max_characters = 5_000, 10**6
    plan.save()


def test_a_big_batch_is_admitted_in_a_few_statements(
    alice: Persona, broker: Any, settings: Any, roomy_batches: None
) -> None:
    settings.TENANT_BROKER_SLOTS = 2  # the production default: most items wait

    with CaptureQueriesContext(connection) as queries:
        batch = batch_create(tenant=alice.tenant, api_key=None, items=items(BIG))

    # Item by item, a batch took several statements per item under the lock;
    # in bulk an INSERT takes many rows (on SQLite, as many as 999 values allow).
    assert len(queries) < BIG // 10, len(queries)
    assert batch.items.count() == BIG


def test_each_item_is_reserved_on_its_own_and_the_month_by_their_sum(
    alice: Persona, broker: Any, roomy_batches: None
) -> None:
    specs = items(BIG)

    batch = batch_create(tenant=alice.tenant, api_key=alice.api_key, items=specs)

    jobs = Job.objects.filter(batch_item__batch=batch)
    reserved = LedgerEntry.objects.filter(tenant=alice.tenant, kind=LedgerKind.RESERVE)
    assert reserved.count() == BIG
    assert set(reserved.values_list("job_id", flat=True)) == set(jobs.values_list("pk", flat=True))
    period = UsagePeriod.objects.get(tenant=alice.tenant)
    assert period.characters_reserved == sum(len(s.speech.text) for s in specs)
    assert {(j.in_batch, j.api_key_id, j.priority) for j in jobs} == {
        (True, alice.api_key.pk, "low")
    }


def test_the_first_items_take_the_free_slots_and_the_rest_wait_in_order(
    alice: Persona, broker: Any, settings: Any
) -> None:
    settings.TENANT_BROKER_SLOTS = 2

    batch = batch_create(tenant=alice.tenant, api_key=None, items=items(30))

    by_index = [
        item.job
        for item in BatchItem.objects.filter(batch=batch).select_related("job").order_by("index")
    ]
    assert [j.status for j in by_index[:2]] == [JobStatus.QUEUED] * 2
    assert {j.status for j in by_index[2:]} == {JobStatus.PENDING}
    # Held-back jobs are released oldest first: the items' submitted order.
    released = sorted(by_index[2:], key=lambda j: (j.created_at, j.pk))
    assert released == by_index[2:]
    assert broker.llen("synth.low") == 2  # published after commit, the queued ones only


def test_the_month_running_out_meanwhile_refuses_the_whole_batch(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks passed (a race: the quota ran out in between); admission
    refuses, and nothing of the batch is kept or published."""

    def refuse(**kwargs: Any) -> Any:
        raise QuotaExceeded("The month's characters ran out.")

    monkeypatch.setattr("batches.admission.quota_admit", refuse)

    with pytest.raises(QuotaExceeded):
        batch_create(tenant=alice.tenant, api_key=None, items=items(5))

    nothing_created(alice)
    assert broker.llen("synth.low") == 0


def test_a_voice_deleted_after_the_checks_refuses_the_batch_naming_the_item(
    alice: Persona, broker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    voice = Voice.objects.create(
        tenant=alice.tenant,
        name="Narrator",
        audio_key="voices/narrator.wav",
        audio_format="wav",
        sample_rate=24000,
        channels=1,
        duration_s=4.0,
        size_bytes=1000,
    )
    specs = [*items(2), ItemSpec(speech=SpeechRequest(text="With a voice.", voice_id=voice.pk))]
    checks = services._check

    def check_then_delete(**kwargs: Any) -> None:
        checks(**kwargs)
        Voice.objects.filter(pk=voice.pk).delete()

    monkeypatch.setattr(services, "_check", check_then_delete)

    with pytest.raises(NotFound) as refused:
        batch_create(tenant=alice.tenant, api_key=None, items=specs)

    assert refused.value.details["index"] == 2
    assert refused.value.details["field"] == "voice_id"
    nothing_created(alice)
