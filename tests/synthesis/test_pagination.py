"""Lists paged by a cursor on (created_at, id): every row once, in order, at the
same cost however deep, with `limit` and the old `offset` still understood."""

from __future__ import annotations

from datetime import timedelta
from itertools import chain
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from synthesis.models import Job, Voice
from tests.assertions import assert_error
from tests.conftest import Persona


def jobs(persona: Persona, n: int, *, status: str = "succeeded", **fields: Any) -> list[Job]:
    """`n` jobs, oldest first; several share a created_at, as a burst can."""
    now = timezone.now()
    made = Job.objects.bulk_create(
        Job(tenant=persona.tenant, text=f"job {i}", characters=5, status=status, **fields)
        for i in range(n)
    )
    for i, job in enumerate(made):
        job.created_at = now - timedelta(seconds=(n - i) // 3)  # three per second
    Job.objects.bulk_update(made, ["created_at"])
    return sorted(made, key=lambda j: (j.created_at, j.id))


def walk(persona: Persona, url: str) -> list[list[str]]:
    pages = []
    while url:
        body = persona.client.get(url).json()
        pages.append([row["id"] for row in body["results"]])
        url = body["next"]
    return pages


def test_following_next_visits_every_job_once_newest_first(alice: Persona) -> None:
    made = jobs(alice, 25)

    pages = walk(alice, "/v1/speech?limit=10")

    assert [len(page) for page in pages] == [10, 10, 5]
    assert list(chain(*pages)) == [str(job.id) for job in reversed(made)]


def test_previous_leads_back_to_the_same_page(alice: Persona) -> None:
    jobs(alice, 12)
    first = alice.client.get("/v1/speech", {"limit": 5}).json()
    second = alice.client.get(first["next"]).json()

    back = alice.client.get(second["previous"]).json()

    assert first["previous"] is None
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]
    assert back["previous"] is None
    assert back["next"]


def test_a_job_submitted_while_paging_neither_repeats_nor_skips_a_row(alice: Persona) -> None:
    made = jobs(alice, 8)
    first = alice.client.get("/v1/speech", {"limit": 4}).json()
    jobs(alice, 1)  # newer than everything: it belongs before the first page

    second = alice.client.get(first["next"]).json()

    seen = [r["id"] for r in first["results"] + second["results"]]
    assert seen == [str(job.id) for job in reversed(made)]
    assert second["next"] is None


def test_offset_still_works_and_its_next_link_continues_with_a_cursor(alice: Persona) -> None:
    made = jobs(alice, 9)

    page = alice.client.get("/v1/speech", {"limit": 3, "offset": 3}).json()
    rest = walk(alice, page["next"])

    newest_first = [str(job.id) for job in reversed(made)]
    assert [r["id"] for r in page["results"]] == newest_first[3:6]
    assert "cursor=" in page["next"]
    assert "offset" not in page["next"]
    assert page["previous"]
    assert list(chain(*rest)) == newest_first[6:]


def test_an_offset_past_the_deepest_answered_is_refused_with_a_pointer_to_cursors(
    alice: Persona,
) -> None:
    jobs(alice, 2)

    assert alice.client.get("/v1/speech", {"offset": 10_000}).json()["results"] == []
    error = assert_error(alice.client.get("/v1/speech", {"offset": 10_001}), 400, "offset_too_deep")
    assert error["details"] == {"field": "offset", "max": 10_000, "value": 10_001}
    assert "next" in error["message"]
    assert_error(alice.client.get("/v1/voices", {"offset": 50_000}), 400, "offset_too_deep")


def test_the_limit_defaults_to_20_and_stops_at_100(alice: Persona) -> None:
    jobs(alice, 105)

    assert len(alice.client.get("/v1/speech").json()["results"]) == 20
    assert len(alice.client.get("/v1/speech", {"limit": 1000}).json()["results"]) == 100
    assert len(alice.client.get("/v1/speech", {"limit": "many"}).json()["results"]) == 20


def test_the_job_list_gives_no_count_and_the_voice_list_does(alice: Persona) -> None:
    jobs(alice, 3)

    assert "count" not in alice.client.get("/v1/speech").json()
    assert alice.client.get("/v1/voices").json()["count"] == Voice.objects.count() == 0


def test_a_cursor_that_was_not_given_out_is_refused(alice: Persona) -> None:
    for cursor in ("nonsense", "eHx5fHo", "%ED%A0%80"):
        error = assert_error(
            alice.client.get(f"/v1/speech?cursor={cursor}"), 400, "invalid_request"
        )
        assert error["details"] == {"field": "cursor"}


def test_an_outsider_following_alices_cursor_sees_only_its_own_jobs(
    alice: Persona, bob: Persona
) -> None:
    jobs(alice, 6)
    bobs = jobs(bob, 2)
    alices_next = alice.client.get("/v1/speech", {"limit": 2}).json()["next"]

    body = bob.client.get(alices_next).json()

    assert {r["id"] for r in body["results"]} <= {str(job.id) for job in bobs}


def test_voices_page_the_same_way(alice: Persona) -> None:
    now = timezone.now()
    Voice.objects.bulk_create(
        Voice(
            tenant=alice.tenant,
            name=f"voice {i}",
            audio_key=f"voices/{i}/v1/reference.wav",
            audio_format="wav",
            sample_rate=22050,
            channels=1,
            duration_s=4.0,
            size_bytes=1000,
        )
        for i in range(7)
    )
    Voice.objects.update(created_at=now)  # all at once: ties broken by id

    pages = walk(alice, "/v1/voices?limit=3")

    assert [len(page) for page in pages] == [3, 3, 1]
    assert len(set(list(chain(*pages)))) == 7


def queries_for(persona: Persona, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert persona.client.get(url).status_code == 200
    return len(queries)


def test_a_page_of_waiting_jobs_costs_a_fixed_number_of_queries(
    alice: Persona, bob: Persona, settings: Any
) -> None:
    settings.TENANT_BROKER_SLOTS = 2
    for who in (alice, bob):
        for priority in ("low", "normal", "low"):
            jobs(who, 2, status="queued", priority=priority)
            jobs(who, 9, status="pending", priority=priority)

    alice.client.get("/v1/usage")  # the key's last use is stamped once, here
    # A connection prepares the line's statements at its first page, once
    # (`chorus.statements`): one query that later pages do not make.
    queries_for(alice, "/v1/speech?limit=24")
    # Both pages hold low and normal jobs, queued and pending.
    small = queries_for(alice, "/v1/speech?limit=24")
    full = queries_for(alice, "/v1/speech?limit=33")

    assert full == small  # the places of a page are read together, not per job
    assert full <= 12


def long_texts(persona: Persona, n: int, *, segments: int = 3) -> list[Job]:
    """`n` long-form jobs, each with its segments, one of them done."""
    now = timezone.now()
    parents = Job.objects.bulk_create(
        Job(
            tenant=persona.tenant,
            text="A long text. " * 50,
            characters=650,
            status="running",
            segments_total=segments,
        )
        for _ in range(n)
    )
    Job.objects.bulk_create(
        Job(
            tenant=persona.tenant,
            text="A long text. " * 10,
            characters=130,
            parent=parent,
            segment_index=i,
            status="succeeded" if i == 0 else "queued",
            duration_s=2.5 if i == 0 else None,
            started_at=now if i == 0 else None,
            first_audio_at=now if i == 0 else None,
            finished_at=now if i == 0 else None,
        )
        for parent in parents
        for i in range(segments)
    )
    return parents


def test_a_page_of_long_texts_costs_the_same_queries_with_one_or_twenty(
    alice: Persona,
) -> None:
    alice.client.get("/v1/usage")  # the key's last use is stamped once, here
    long_texts(alice, 1)
    one = queries_for(alice, "/v1/speech")
    long_texts(alice, 19)

    twenty = queries_for(alice, "/v1/speech")

    assert twenty == one  # the page's segments are read together, not per job
    page = alice.client.get("/v1/speech").json()["results"]
    assert len(page) == 20
    assert {row["progress"]["segments_done"] for row in page} == {1}
    assert {row["progress"]["audio_seconds"] for row in page} == {2.5}
    assert all(row["timings"]["started_at"] for row in page)


def test_a_page_of_fields_without_progress_or_timings_reads_no_segments(
    alice: Persona,
) -> None:
    alice.client.get("/v1/usage")
    long_texts(alice, 3)

    without = queries_for(alice, "/v1/speech?fields=id,status")
    every = queries_for(alice, "/v1/speech")

    assert without == every - 1
    rows = alice.client.get("/v1/speech?fields=id,status").json()["results"]
    assert [set(row) for row in rows] == [{"id", "status"}] * 3


def test_queue_places_on_a_page_match_each_jobs_own(alice: Persona, bob: Persona) -> None:
    for who in (alice, bob):
        jobs(who, 3, status="queued", priority="normal")
        jobs(who, 5, status="pending", priority="normal")
        jobs(who, 4, status="pending", priority="low")

    listed = {
        row["id"]: row["queue"]
        for page in [alice.client.get("/v1/speech", {"limit": 100}).json()]
        for row in page["results"]
    }
    one_by_one = {
        job_id: alice.client.get(f"/v1/speech/{job_id}").json()["queue"] for job_id in listed
    }

    positions = {job_id: q["position"] for job_id, q in listed.items()}
    assert positions == {job_id: q["position"] for job_id, q in one_by_one.items()}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="reads PostgreSQL's plans")
def test_a_deep_page_is_read_off_the_index_without_a_sort(alice: Persona) -> None:
    made = jobs(alice, 30)
    middle = alice.client.get("/v1/speech", {"limit": 10}).json()["next"]

    with CaptureQueriesContext(connection) as queries:
        alice.client.get(middle)
    listing = next(q["sql"] for q in queries if q["sql"].startswith('SELECT "synthesis_job"."id"'))
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {listing}")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "job_tenant_newest" in plan, plan
    assert "Sort" not in plan, plan
    assert len(made) == 30
