"""Every size limit on a request comes from `quotas.body_limits`, per route and plan,
and every tenant route passes the one admission (`quotas.admission`)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings

from chorus.api import views as base_views
from quotas.admission import tenant_request_admit
from quotas.body_limits import (
    DEFAULT_BODY_BYTES,
    MULTIPART_OVERHEAD_BYTES,
    body_limit_for,
    upload_limit_bytes,
)
from tenants.models import Plan
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona

pytestmark = [pytest.mark.embedded, pytest.mark.django_db]


def test_alices_upload_limit_is_her_plans_and_the_body_adds_only_framing(
    alice: Persona,
) -> None:
    alice.tenant.plan = Plan.objects.create(name="small uploads", max_upload_bytes=50_000)
    alice.tenant.save()

    assert upload_limit_bytes(alice.tenant) == 50_000
    for path in ("/v1/voices", "/v1/voices/", "/v1/provenance/verify"):
        limit = body_limit_for(method="POST", path=path, tenant=alice.tenant)
        assert (limit.limit_bytes, limit.code) == (50_000, "file_too_large")
        assert limit.max_bytes == 50_000 + MULTIPART_OVERHEAD_BYTES


def test_a_route_without_a_plan_limit_gets_the_default_and_the_ceiling_caps_all(
    alice: Persona,
) -> None:
    assert body_limit_for(method="GET", path="/v1/voices", tenant=alice.tenant).max_bytes == (
        DEFAULT_BODY_BYTES
    )
    with override_settings(MAX_REQUEST_BYTES=10_000):
        limit = body_limit_for(method="POST", path="/v1/voices", tenant=alice.tenant)
    assert (limit.max_bytes, limit.code) == (10_000, "file_too_large")


def test_a_voice_file_over_alices_upload_limit_is_refused_as_it_is_parsed(
    alice: Persona,
) -> None:
    audio = audio_file(4.0)
    alice.tenant.plan = Plan.objects.create(name="tiny uploads", max_upload_bytes=len(audio) - 1)
    alice.tenant.save()

    # The body is within the limit and its framing allowance; the file's own
    # bytes are counted as they are parsed, against the same number.
    upload = SimpleUploadedFile("ref.wav", audio, "audio/wav")
    response = alice.client.post(
        "/v1/voices", {"name": "Narrator", "audio": upload}, format="multipart"
    )

    assert_error(response, 413, "file_too_large")
    assert response.json()["error"]["details"]["limit_bytes"] == len(audio) - 1


def test_the_tenant_base_view_runs_the_admission_quotas_registered() -> None:
    assert base_views._admission == [tenant_request_admit]
