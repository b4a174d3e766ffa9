"""A job's admin page: how long each step took, and its audio."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from synthesis.models import Job, JobStatus
from synthesis.storage_runtime import get_storage
from tests.conftest import Persona

LINK = re.compile(r'<a href="([^"]+)">Download</a>')


@pytest.fixture
def operator(db: None) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    return client


def finished_job(persona: Persona, **fields: object) -> Job:
    job = Job.objects.create(
        tenant=persona.tenant, text="hello", characters=5, status=JobStatus.SUCCEEDED, **fields
    )
    created = job.created_at
    Job.objects.filter(pk=job.pk).update(
        started_at=created + timedelta(seconds=1.25),
        first_audio_at=created + timedelta(seconds=1.75),
        finished_at=created + timedelta(seconds=4.5),
    )
    return job


def test_a_jobs_page_shows_its_timings_in_seconds(operator: Client, alice: Persona) -> None:
    job = finished_job(alice)

    page = operator.get(reverse("admin:synthesis_job_change", args=[job.pk])).content.decode()

    assert "<tr><th>Queue wait</th><td>1.250 s</td></tr>" in page
    assert "<tr><th>First audio</th><td>0.500 s</td></tr>" in page
    assert "<tr><th>Total</th><td>4.500 s</td></tr>" in page
    started = timezone.localtime(job.created_at + timedelta(seconds=1.25))
    assert f"<tr><th>Started</th><td>{started:%Y-%m-%d %H:%M:%S}</td></tr>" in page


def test_a_succeeded_jobs_page_links_its_audio_with_a_signed_link(
    operator: Client, alice: Persona
) -> None:
    key = "outputs/hello.wav"
    get_storage().put(
        bucket=alice.tenant.bucket, key=key, data=b"RIFF-audio", content_type="audio/wav"
    )
    job = finished_job(alice, output_key=key, output_bytes=10)

    page = operator.get(reverse("admin:synthesis_job_change", args=[job.pk])).content.decode()

    links = LINK.findall(page)
    assert len(links) == 1
    url = links[0].replace("&amp;", "&")
    assert "signature=" in url
    assert "10 bytes, signed link, expires" in page
    download = Client().get(url)  # no login: the link is the permission
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == b"RIFF-audio"


def test_a_job_without_audio_has_no_link(operator: Client, alice: Persona) -> None:
    job = Job.objects.create(tenant=alice.tenant, text="hello", characters=5)

    page = operator.get(reverse("admin:synthesis_job_change", args=[job.pk])).content.decode()

    assert not LINK.search(page)
    assert "<tr><th>Total</th><td>-</td></tr>" in page


def test_the_jobs_list_shows_a_long_text_as_one_job_and_its_segments_from_its_page(
    operator: Client, alice: Persona
) -> None:
    singles = [finished_job(alice) for _ in range(3)]
    parent = finished_job(alice, segments_total=57)
    segments = [finished_job(alice, parent=parent, segment_index=i) for i in range(57)]
    jobs_url = reverse("admin:synthesis_job_changelist")

    listed = operator.get(jobs_url)

    assert listed.context["cl"].result_count == 4
    assert {job.pk for job in listed.context["cl"].result_list} == {
        parent.pk,
        *(job.pk for job in singles),
    }
    page = operator.get(reverse("admin:synthesis_job_change", args=[parent.pk])).content.decode()
    [link] = re.findall(r'<a href="([^"]+)">57 segments</a>', page)
    under = operator.get(link.replace("&amp;", "&"))
    assert under.status_code == 200
    assert under.context["cl"].result_count == 57
    segment = segments[12]
    found = operator.get(jobs_url, {"q": str(segment.pk)})
    assert [job.pk for job in found.context["cl"].result_list] == [segment.pk]
    assert operator.get(reverse("admin:synthesis_job_change", args=[segment.pk])).status_code == 200
