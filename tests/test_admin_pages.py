"""Every admin page answers for every registered model, its forms save, its links lead somewhere.

The tests walk `admin.site._registry`, so a model registered later is covered
without touching this module; only an object of it (`objects`) and, where it can
be added, valid add-form data (`ADD_DATA`) have to be written down here.
Forms are posted as a browser would send them: every field the page rendered,
with its shown value, plus the few values a person would type.
"""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib import admin
from django.contrib.admin.utils import get_deleted_objects
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group
from django.db.models import Model
from django.http import HttpRequest
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from batches.models import Batch
from batches.services import ItemSpec, batch_create
from chorus.errors import StorageError
from quotas.models import LedgerEntry, LedgerKind, UsagePeriod
from quotas.services import quota_commit
from synthesis.calibration.identity import ProfileKey
from synthesis.calibration.measure import Calibration, Level
from synthesis.calibration.models import CalibratedProfile
from synthesis.calibration.services import device_profile_save, worker_limits_record
from synthesis.consent import Consent
from synthesis.engines.base import EngineInfo
from synthesis.heartbeat import Heartbeat
from synthesis.models import Job, Voice, VoiceConsent, WorkerHeartbeat
from synthesis.services.jobs import job_create
from synthesis.services.voices import voice_create
from synthesis.speech_request import SpeechRequest
from synthesis.stream_limits import StreamLimits
from tenants.models import ApiKey, Plan, Tenant
from tests.audio_files import audio_file
from tests.conftest import Persona
from webhooks.events import event_publish
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.services.endpoints import endpoint_create

Objects = dict[type[Model], Model]

REGISTERED = sorted(admin.site._registry, key=lambda model: model._meta.label_lower)
PER_MODEL = pytest.mark.parametrize(
    "model", REGISTERED, ids=[model._meta.label_lower for model in REGISTERED]
)

# What a person types into each add form; every other field keeps what the page shows.
ADD_DATA: dict[type[Model], Callable[[Objects], dict[str, Any]]] = {
    Plan: lambda objects: {"name": "studio"},
    Tenant: lambda objects: {"slug": "globex", "name": "Globex", "plan": objects[Plan].pk},
    ApiKey: lambda objects: {"tenant": objects[Tenant].pk, "name": "from the admin"},
    Group: lambda objects: {"name": "auditors"},
    WebhookEndpoint: lambda objects: {
        "tenant": objects[Tenant].pk,
        "url": "https://hooks.example.invalid/from-the-admin",
        "event_types": ["speech.failed"],
    },
    get_user_model(): lambda objects: {
        "username": "dave",
        "password1": "a long enough passphrase 42",
        "password2": "a long enough passphrase 42",
    },
}

# Add forms that answer with a page of their own instead of a redirect: a new API
# key is shown there, once, since nothing keeps it for a later page.
ADDED_PAGE: dict[type[Model], str] = {ApiKey: "admin/tenants/apikey/key_created.html"}


@pytest.fixture
def operator_user(db: None) -> AbstractBaseUser:
    return get_user_model().objects.create_superuser("operator", "op@example.com", "pw")


@pytest.fixture
def operator(operator_user: AbstractBaseUser) -> Client:
    """A staff superuser, logged in to the admin."""
    client = Client()
    client.force_login(operator_user)
    return client


@pytest.fixture
def objects(alice: Persona) -> Objects:
    """One real object of each registered model, made the way the product makes it."""
    voice = voice_create(
        tenant=alice.tenant,
        name="Narrator",
        audio=audio_file(4.0),
        consent=Consent(speaker_name="Alice", method="self", given_at=timezone.now()),
    )
    job = job_create(
        tenant=alice.tenant,
        api_key=alice.api_key,
        speech=SpeechRequest(text="hello", voice_id=voice.id),
    )
    quota_commit(job_id=job.id)
    info = EngineInfo(name="synthetic", sample_rate=22050, device="cpu", memory_bytes=2**30)
    Heartbeat(name="worker-1", info=info).beat()
    profile = calibrated_profile(worker="worker-1")
    endpoint = endpoint_create(tenant=alice.tenant, url="https://hooks.example.invalid/chorus")
    event_publish(tenant_id=alice.tenant.pk, event_type="batch.completed", data={"id": "b1"})
    return {
        Plan: alice.tenant.plan,
        Tenant: alice.tenant,
        ApiKey: alice.api_key,
        Voice: voice,
        Job: job,
        WorkerHeartbeat: WorkerHeartbeat.objects.get(name="worker-1"),
        UsagePeriod: UsagePeriod.objects.get(tenant=alice.tenant),
        LedgerEntry: LedgerEntry.objects.get(job=job, kind=LedgerKind.COMMIT),
        Batch: batch_create(
            tenant=alice.tenant,
            api_key=alice.api_key,
            items=[
                ItemSpec(speech=SpeechRequest(text="one")),
                ItemSpec(speech=SpeechRequest(text="two")),
            ],
        ),
        Group: Group.objects.create(name="support"),
        get_user_model(): get_user_model().objects.create_user("carol", password="pw"),
        WebhookEndpoint: endpoint,
        WebhookDelivery: WebhookDelivery.objects.get(endpoint=endpoint),
        VoiceConsent: VoiceConsent.objects.get(voice=voice),
        AuditEvent: AuditEvent.objects.filter(tenant=alice.tenant).first(),
        CalibratedProfile: profile,
    }


def calibrated_profile(*, worker: str) -> CalibratedProfile:
    """A card measured at one and two streams, and a worker that took its limits."""
    key = ProfileKey(digest="c" * 64, parts={"engine": "synthetic", "card": "emulated t4"})
    calibration = Calibration(
        name="calibrated-cccccccccccc",
        levels=[Level(1, 1.48, 3.2, 4.0, 1.0, 0, 1.0), Level(2, 1.52, 3.45, 4.0, 1.0, 0, 1.03)],
        stopped_because="stream bound (2)",
    )
    limits = StreamLimits(1, 2, 4)
    row = device_profile_save(key=key, owner="host:1", calibration=calibration, limits=limits)
    worker_limits_record(
        worker=worker,
        limits=limits,
        source="calibrated",
        profile_name=calibration.name,
        profile_key=row.key,
    )
    return row


def object_of(model: type[Model], objects: Objects) -> Model:
    assert model in objects, f"make a {model.__name__} in the `objects` fixture"
    return objects[model]


def model_admin(model: type[Model]) -> admin.ModelAdmin[Any]:
    return admin.site._registry[model]


def request_by(user: AbstractBaseUser) -> HttpRequest:
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def url(model: type[Model], view: str, *args: object) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


class _FormFields(HTMLParser):
    """The fields a browser submits from one form: named inputs, checked boxes,
    selected options (the first one where none is), textareas; not buttons or
    disabled fields."""

    def __init__(self, form_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.inside = False
        self.fields: dict[str, list[str]] = {}
        self._select: tuple[str, bool] | None = None
        self._options: list[tuple[str, bool]] = []
        self._textarea: str | None = None
        self._text: list[str] = []

    def _add(self, name: str, value: str) -> None:
        self.fields.setdefault(name, []).append(value)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == self.form_id:
            self.inside = True
        if not self.inside:
            return
        name = a.get("name") or ""
        enabled = "disabled" not in a
        kind = (a.get("type") or "text").lower()
        if tag == "input" and name and enabled:
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self._add(name, a.get("value") or "on")
            elif kind not in ("submit", "button", "image", "reset", "file"):
                self._add(name, a.get("value") or "")
        elif tag == "select":
            self._select = (name if enabled else "", "multiple" in a)
            self._options = []
        elif tag == "option" and self._select is not None:
            self._options.append((a.get("value") or "", "selected" in a))
        elif tag == "textarea" and name and enabled:
            self._textarea, self._text = name, []

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "select" and self._select is not None:
            name, multiple = self._select
            chosen = [value for value, selected in self._options if selected]
            if not chosen and not multiple and self._options:
                chosen = [self._options[0][0]]
            for value in chosen if name else []:
                self._add(name, value)
            self._select = None
        elif tag == "textarea" and self._textarea is not None:
            text = "".join(self._text)
            # Browsers drop the newline that follows <textarea>, as Django renders it.
            self._add(self._textarea, text.removeprefix("\r\n").removeprefix("\n"))
            self._textarea = None


def form_as_shown(model: type[Model], page: Any) -> dict[str, Any]:
    parser = _FormFields(f"{model._meta.model_name}_form")
    parser.feed(page.content.decode())
    return {**parser.fields, "_save": "Save"}


def links_on(page_url: str, page: Any) -> set[str]:
    class Links(HTMLParser):
        found: set[str] = set()

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            href = dict(attrs).get("href")
            if tag == "a" and href and not href.startswith(("#", "javascript:", "mailto:")):
                self.found.add(urljoin(page_url, href).split("#")[0])

    parser = Links()
    parser.found = set()
    parser.feed(page.content.decode())
    return parser.found


# --- pages ------------------------------------------------------------------------


def test_the_admin_index_and_every_app_index_render(operator: Client, objects: Objects) -> None:
    assert operator.get(reverse("admin:index")).status_code == 200
    assert operator.get(reverse("admin:password_change")).status_code == 200
    for app_label in {model._meta.app_label for model in REGISTERED}:
        response = operator.get(reverse("admin:app_list", args=[app_label]))

        assert response.status_code == 200, app_label


@PER_MODEL
def test_the_list_page_renders_and_searches(
    operator: Client, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)

    listed = operator.get(url(model, "changelist"))

    assert listed.status_code == 200
    assert obj in listed.context["cl"].result_list
    if model_admin(model).search_fields:
        for term in (str(obj), str(obj.pk), "no such thing"):
            assert operator.get(url(model, "changelist"), {"q": term}).status_code == 200, term


@PER_MODEL
def test_the_change_history_and_delete_pages_of_an_object_render(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)
    may_delete = model_admin(model).has_delete_permission(request_by(operator_user), obj)

    assert operator.get(url(model, "change", obj.pk)).status_code == 200
    assert operator.get(url(model, "history", obj.pk)).status_code == 200
    assert operator.get(url(model, "delete", obj.pk)).status_code == (200 if may_delete else 403)


@PER_MODEL
def test_the_add_page_renders_where_adding_is_allowed(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    may_add = model_admin(model).has_add_permission(request_by(operator_user))

    assert operator.get(url(model, "add")).status_code == (200 if may_add else 403)


# --- forms ------------------------------------------------------------------------


@PER_MODEL
def test_the_add_form_creates_the_object_or_is_refused(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    before = model._default_manager.count()
    if not model_admin(model).has_add_permission(request_by(operator_user)):
        assert operator.post(url(model, "add"), {"_save": "Save"}).status_code == 403
        assert model._default_manager.count() == before
        return
    assert model in ADD_DATA, f"write what a person types into the {model.__name__} add form"
    data = form_as_shown(model, operator.get(url(model, "add")))

    response = operator.post(url(model, "add"), {**data, **ADD_DATA[model](objects)})

    if model in ADDED_PAGE:
        assert response.status_code == 200
        assert ADDED_PAGE[model] in [template.name for template in response.templates]
    else:
        errors = response.context and response.context["adminform"].form.errors
        assert response.status_code == 302, errors
    assert model._default_manager.count() == before + 1


@PER_MODEL
def test_saving_the_change_form_as_shown_keeps_the_object_or_is_refused(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)
    may_change = model_admin(model).has_change_permission(request_by(operator_user), obj)
    data = form_as_shown(model, operator.get(url(model, "change", obj.pk)))

    response = operator.post(url(model, "change", obj.pk), data)

    errors = response.context and response.context["adminform"].form.errors
    assert response.status_code == (302 if may_change else 403), errors
    assert model._default_manager.filter(pk=obj.pk).exists()


@PER_MODEL
def test_deleting_an_object_deletes_it_or_says_why_not(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)
    request = request_by(operator_user)
    may_delete = model_admin(model).has_delete_permission(request, obj)
    _, _, perms_needed, protected = get_deleted_objects([obj], request, admin.site)

    response = operator.post(url(model, "delete", obj.pk), {"post": "yes"})

    if not may_delete or (perms_needed and not protected):
        assert response.status_code == 403
    elif protected:
        assert response.status_code == 200
        assert response.context["protected"]
    else:
        assert response.status_code == 302
    gone = may_delete and not perms_needed and not protected
    assert model._default_manager.filter(pk=obj.pk).exists() is not gone


@PER_MODEL
def test_every_action_answers_for_a_selected_object(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)

    for action in model_admin(model).get_actions(request_by(operator_user)):
        response = operator.post(
            url(model, "changelist"), {"action": action, "_selected_action": [obj.pk]}
        )

        # delete_selected asks for confirmation first; the others act and return to the list.
        assert response.status_code == (200 if action == "delete_selected" else 302), action


# --- what the pages refuse -------------------------------------------------------


@pytest.mark.parametrize("model", [Voice, Job, WorkerHeartbeat, UsagePeriod, LedgerEntry, Batch])
def test_rows_that_services_write_are_shown_but_not_saved_from_the_admin(
    operator: Client, objects: Objects, model: type[Model]
) -> None:
    obj = object_of(model, objects)

    assert operator.get(url(model, "change", obj.pk)).status_code == 200
    assert operator.post(url(model, "change", obj.pk), {"_save": "Save"}).status_code == 403


def test_voices_are_uploaded_through_the_api_not_added_in_the_admin(
    operator: Client, alice: Persona
) -> None:
    assert b"voice/add/" not in operator.get(url(Voice, "changelist")).content
    assert operator.get(url(Voice, "add")).status_code == 403
    assert operator.post(url(Voice, "add"), {"tenant": alice.tenant.pk}).status_code == 403
    assert not Voice.objects.exists()


def test_a_tenants_slug_stays_what_named_its_bucket(operator: Client, objects: Objects) -> None:
    alice = objects[Tenant]
    data = form_as_shown(Tenant, operator.get(url(Tenant, "change", alice.pk)))

    renamed = operator.post(url(Tenant, "change", alice.pk), {**data, "slug": "alice-renamed"})
    again = operator.post(
        url(Tenant, "add"),
        {**form_as_shown(Tenant, operator.get(url(Tenant, "add"))), **ADD_DATA[Tenant](objects)}
        | {"slug": "alice"},
    )

    assert renamed.status_code == 302
    alice.refresh_from_db()
    assert (alice.slug, alice.bucket) == ("alice", "chorus-alice")
    assert again.status_code == 200
    assert "slug" in again.context["adminform"].form.errors
    assert Tenant.objects.count() == 1


def test_unavailable_storage_is_a_form_error_when_adding_a_tenant(
    operator: Client, objects: Objects, monkeypatch: pytest.MonkeyPatch
) -> None:
    def storage_down(*, slug: str) -> str:
        raise StorageError("Object storage is unavailable (create_bucket on chorus-globex).")

    monkeypatch.setattr("tenants.admin.tenant_bucket_provision", storage_down)
    data = form_as_shown(Tenant, operator.get(url(Tenant, "add")))

    response = operator.post(url(Tenant, "add"), {**data, **ADD_DATA[Tenant](objects)})

    assert response.status_code == 200
    assert "Object storage is unavailable" in str(response.context["adminform"].form.errors)
    assert not Tenant.objects.filter(slug="globex").exists()


# --- links ------------------------------------------------------------------------


def test_view_site_leads_to_a_page_that_exists(operator: Client, anonymous: APIClient) -> None:
    index = operator.get(reverse("admin:index"))
    site_url = index.context["site_url"]

    assert site_url
    assert f'href="{site_url}"' in index.content.decode()
    assert anonymous.get(site_url).status_code == 200


def test_every_link_on_the_admin_pages_leads_somewhere(
    operator: Client, operator_user: AbstractBaseUser, objects: Objects
) -> None:
    request = request_by(operator_user)
    pages = [reverse("admin:index")]
    for model in REGISTERED:
        obj, model_admin_ = object_of(model, objects), model_admin(model)
        pages += [url(model, "changelist"), url(model, "change", obj.pk)]
        pages += [url(model, "history", obj.pk)]
        if model_admin_.has_add_permission(request):
            pages.append(url(model, "add"))
        if model_admin_.has_delete_permission(request, obj):
            pages.append(url(model, "delete", obj.pk))
    links: set[str] = set()
    for page in pages:
        response = operator.get(page)
        assert response.status_code == 200, page
        links |= links_on(f"http://testserver{page}", response)

    ours = {link for link in links if urlsplit(link).netloc == "testserver"}
    assert ours, "the admin pages link to nothing?"
    for link in sorted(ours):
        parts = urlsplit(link)
        response = operator.get(
            parts.path + (f"?{parts.query}" if parts.query else ""), follow=True
        )

        assert response.status_code == 200, link
