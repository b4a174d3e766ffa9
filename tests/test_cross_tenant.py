"""Bob, the outsider, against every route that names one of alice's objects.

The cases are derived from the URL resolver, not listed by hand: every route
under /v1/ with a path parameter, and every method its view handles. A new
route with a parameter this module has no factory for fails the matrix until
someone decides how alice's object for it is made (or which test covers it).
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from batches.services import ItemSpec, batch_create
from quotas.models import LedgerEntry
from synthesis.engines.base import Engine
from synthesis.models import Job, Voice
from synthesis.services.execution import job_execute
from synthesis.services.jobs import job_create
from synthesis.services.voices import voice_create
from synthesis.speech_request import SpeechRequest
from tests.assertions import assert_error
from tests.audio_files import audio_file
from tests.conftest import Persona
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services.endpoints import endpoint_create

_PARAM = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


def _walk(resolver: URLResolver, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry, prefix + str(entry.pattern))
        else:
            yield prefix + str(entry.pattern), entry


def api_routes() -> list[tuple[str, URLPattern]]:
    return [(route, p) for route, p in _walk(get_resolver()) if route.startswith("v1/")]


def params(route: str) -> list[str]:
    return [m["name"] for m in _PARAM.finditer(route)]


def handled_methods(pattern: URLPattern) -> list[str]:
    callback: Any = pattern.callback
    # Class-based views carry `view_class`; the async OpenAI view carries the
    # class that documents it (`cls`), whose handlers are the methods it serves.
    view_class = getattr(callback, "view_class", None) or callback.cls
    methods = [m for m in view_class.http_method_names if hasattr(view_class, m)]
    if "get" in methods and "head" not in methods:
        methods.append("head")  # Django answers HEAD with the GET handler
    return methods


# How alice's object for each path parameter is made: name -> factory.
FACTORIES: dict[str, Callable[[Persona, Engine], str]] = {
    "voice_id": lambda alice, engine: str(
        voice_create(tenant=alice.tenant, name="alice's voice", audio=audio_file(4.0, 24000)).id
    ),
    "job_id": lambda alice, engine: str(
        job_create(
            tenant=alice.tenant,
            api_key=alice.api_key,
            speech=SpeechRequest(text="Alice's secret text."),
        ).id
    ),
    "batch_id": lambda alice, engine: str(
        batch_create(
            tenant=alice.tenant,
            api_key=alice.api_key,
            items=[ItemSpec(speech=SpeechRequest(text="Alice's batch."))],
        ).id
    ),
    "endpoint_id": lambda alice, engine: str(_alices_endpoint(alice).id),
    "delivery_id": lambda alice, engine: str(_alices_delivery(alice).id),
}


def _alices_endpoint(alice: Persona) -> WebhookEndpoint:
    # A name that does not resolve here is accepted at creation (checked at delivery).
    return endpoint_create(tenant=alice.tenant, url="https://hooks.alice.example/chorus")


def _alices_delivery(alice: Persona) -> WebhookDelivery:
    endpoint = _alices_endpoint(alice)
    event = event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={})
    assert event is not None
    return WebhookDelivery.objects.get(event=event, endpoint=endpoint)


# Routes whose parameters are not objects of a tenant but are checked another
# way, with the test in this module that covers them.
COVERED_ELSEWHERE = {
    "file-download": "test_a_link_for_alices_audio_edited_to_bobs_bucket_is_not_found",
}

MATRIX = [
    pytest.param(route, pattern, method, id=f"{method.upper()} /{route}")
    for route, pattern in api_routes()
    if params(route) and pattern.name not in COVERED_ELSEWHERE
    for method in handled_methods(pattern)
]


def url_for(route: str, values: dict[str, str]) -> str:
    return "/" + _PARAM.sub(lambda m: values[m["name"]], route)


def alices_world(alice: Persona) -> dict[str, Any]:
    """Everything of alice's that bob could change: rows, ledger, stored objects."""
    root = Path(settings.STORAGE["local_root"]) / alice.tenant.bucket
    return {
        "voices": list(Voice.objects.filter(tenant=alice.tenant).order_by("id").values()),
        "jobs": list(Job.objects.filter(tenant=alice.tenant).order_by("id").values()),
        "ledger": list(LedgerEntry.objects.filter(tenant=alice.tenant).order_by("id").values()),
        "webhook_endpoints": list(
            WebhookEndpoint.objects.filter(tenant=alice.tenant).order_by("id").values()
        ),
        "webhook_deliveries": list(
            WebhookDelivery.objects.filter(endpoint__tenant=alice.tenant).order_by("id").values()
        ),
        "files": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()),
    }


def test_the_matrix_covers_every_route_with_a_path_parameter() -> None:
    routes = [(route, p) for route, p in api_routes() if params(route)]
    assert routes, "the resolver walk found no routes with parameters"
    for route, pattern in routes:
        if pattern.name in COVERED_ELSEWHERE:
            assert COVERED_ELSEWHERE[pattern.name] in globals(), route
            continue
        unknown = set(params(route)) - set(FACTORIES)
        assert not unknown, (
            f"/{route} has path parameters {sorted(unknown)} that the cross-tenant matrix "
            "cannot fill: add a factory for alice's object to FACTORIES"
        )
        assert handled_methods(pattern), route
    covered = {(case.values[0], case.values[2]) for case in MATRIX}
    assert ("v1/voices/<uuid:voice_id>", "delete") in covered
    assert ("v1/speech/<uuid:job_id>/cancel", "post") in covered


@pytest.mark.parametrize(("route", "pattern", "method"), MATRIX)
def test_bob_cannot_reach_alices_object(
    alice: Persona, bob: Persona, engine: Engine, route: str, pattern: URLPattern, method: str
) -> None:
    unknown = [name for name in params(route) if name not in FACTORIES]
    assert not unknown, f"no factory for {unknown} in /{route}"
    values = {name: FACTORIES[name](alice, engine) for name in params(route)}
    nowhere = {name: str(uuid.uuid4()) for name in params(route)}
    before = alices_world(alice)

    response = bob.client.generic(method.upper(), url_for(route, values))
    missing = bob.client.generic(method.upper(), url_for(route, nowhere))

    if method == "options":
        # Metadata about the route, the same for any id: nothing about the object.
        assert response.status_code == missing.status_code == 200
        assert response.content == missing.content
    elif method == "head":
        assert response.status_code == missing.status_code == 404
    else:
        error = assert_error(response, 404, "not_found")
        # Indistinguishable from an id that exists nowhere.
        assert error["message"] == assert_error(missing, 404, "not_found")["message"]
    assert alices_world(alice) == before
    # And alice still reaches it.
    own = alice.client.get(url_for(route, values)) if "get" in handled_methods(pattern) else None
    assert own is None or own.status_code == 200


def test_every_list_shows_bob_none_of_alices_objects(
    alice: Persona, bob: Persona, engine: Engine
) -> None:
    voice = voice_create(tenant=alice.tenant, name="alice's voice", audio=audio_file(4.0, 24000))
    job = job_create(
        tenant=alice.tenant,
        api_key=alice.api_key,
        speech=SpeechRequest(text="Alice's secret text."),
    )
    done = job_create(
        tenant=alice.tenant, api_key=alice.api_key, speech=SpeechRequest(text="Alice's other text.")
    )
    job_execute(job_id=done.id, engine=engine, worker="w1")
    secrets = [str(voice.id), str(job.id), str(done.id), "Alice's secret", alice.tenant.bucket]
    lists = [
        route
        for route, pattern in api_routes()
        if not params(route) and "get" in handled_methods(pattern)
    ]
    assert {"v1/voices", "v1/speech", "v1/usage"} <= set(lists)

    for route in lists:
        response = bob.client.get(f"/{route}")
        assert response.status_code == 200, (route, response.content)
        leaked = [s for s in secrets if s in response.content.decode()]
        assert not leaked, (route, leaked)
    # Sanity: alice's own lists do show them.
    assert str(voice.id) in alice.client.get("/v1/voices").content.decode()
    assert str(job.id) in alice.client.get("/v1/speech").content.decode()


# --- signed download links --------------------------------------------------------


def _succeeded(persona: Persona, engine: Engine) -> Job:
    job = job_create(
        tenant=persona.tenant, api_key=persona.api_key, speech=SpeechRequest(text="Signed for me.")
    )
    job_execute(job_id=job.id, engine=engine, worker="w1")
    job.refresh_from_db()
    return job


def _link(persona: Persona, job: Job) -> str:
    url = persona.client.get(f"/v1/speech/{job.id}").json()["audio_url"]
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def test_a_link_for_alices_audio_edited_to_bobs_bucket_is_not_found(
    alice: Persona, bob: Persona, engine: Engine, anonymous: APIClient
) -> None:
    job = _succeeded(alice, engine)
    link = _link(alice, job)
    assert f"/v1/files/{alice.tenant.bucket}/" in link
    # The same key exists in bob's bucket too, so only the signature stands in the way.
    root = Path(settings.STORAGE["local_root"])
    copy = root / bob.tenant.bucket / job.output_key
    copy.parent.mkdir(parents=True)
    shutil.copy(root / alice.tenant.bucket / job.output_key, copy)

    edited = link.replace(f"/files/{alice.tenant.bucket}/", f"/files/{bob.tenant.bucket}/")

    assert anonymous.get(link).status_code == 200
    assert_error(anonymous.get(edited), 404, "not_found")
    assert_error(bob.client.get(edited), 404, "not_found")


def test_bobs_link_edited_to_alices_object_is_not_found(
    alice: Persona, bob: Persona, engine: Engine, anonymous: APIClient
) -> None:
    alices = _succeeded(alice, engine)
    bobs = _succeeded(bob, engine)
    link = _link(bob, bobs)

    edited = link.replace(f"/files/{bob.tenant.bucket}/", f"/files/{alice.tenant.bucket}/")
    edited = edited.replace(str(bobs.id), str(alices.id))

    assert anonymous.get(link).status_code == 200
    assert_error(anonymous.get(edited), 404, "not_found")
