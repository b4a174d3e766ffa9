"""A key added in the admin is shown once, in the answer to the POST that made it,
and kept nowhere on the server but as its hash: not in a session, a message, a
cookie or a log entry."""

from __future__ import annotations

import re
import secrets
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.template.response import TemplateResponse
from django.test import Client
from django.urls import reverse

from tenants.keys import KEY_MARKER, PREFIX_LENGTH
from tenants.models import ApiKey
from tenants.services import api_key_authenticate
from tests.conftest import Persona

KEY_IN_TEXT = re.compile(r"ck_[A-Za-z0-9_-]{32,}")
HREF = re.compile(r'href="([^"#]+)"')
ADD_URL = reverse("admin:tenants_apikey_add")


@pytest.fixture
def operator(db: None) -> Client:
    """A staff superuser, logged in to the admin."""
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def add_key(operator: Client, persona: Persona, **extra: Any) -> Any:
    data = {
        "tenant": persona.tenant.pk,
        "name": "from the admin",
        "scopes": ["read", "speech:write"],
        "requests_per_minute": "30",
        "_save": "Save",
        **extra,
    }
    return operator.post(ADD_URL, data)


def shown_key(response: Any) -> str:
    found = KEY_IN_TEXT.findall(response.content.decode())
    assert len(found) == 1, found
    return str(found[0])


def secrets_of(raw: str) -> list[str]:
    """The key, and its parts that are not the stored (public) prefix."""
    return [raw, raw[len(KEY_MARKER) :], raw[len(KEY_MARKER) + PREFIX_LENGTH :]]


@pytest.mark.parametrize("button", ["_save", "_continue", "_addanother"])
def test_the_new_key_is_shown_in_the_answer_to_the_post_that_made_it(
    operator: Client, alice: Persona, button: str
) -> None:
    response = add_key(operator, alice, **{button: "Save"})

    assert response.status_code == 200
    raw = shown_key(response)
    key = api_key_authenticate(raw=raw)
    assert key is not None
    assert (key.tenant, key.name) == (alice.tenant, "from the admin")
    assert (key.scopes, key.requests_per_minute) == (["read", "speech:write"], 30)
    assert "no-store" in response["Cache-Control"]
    assert "shown once" in response.content.decode()


class RecordedSecrets:
    """`secrets` as `tenants.keys` sees it, noting the random part of each key made."""

    def __init__(self) -> None:
        self.made: list[str] = []

    def token_urlsafe(self, nbytes: int) -> str:
        token = secrets.token_urlsafe(nbytes)
        self.made.append(token)
        return token


def test_no_session_cookie_or_log_entry_holds_the_new_key(
    operator: Client, alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The key is taken from where it is made, not from the page, so that this
    # test looks for it in storage whichever way it is shown.
    recorded = RecordedSecrets()
    monkeypatch.setattr("tenants.keys.secrets", recorded)

    response = add_key(operator, alice)

    assert len(recorded.made) == 1
    raw = KEY_MARKER + recorded.made[0]
    sessions = list(Session.objects.all())
    assert sessions, "the operator is logged in through a session row"
    for session in sessions:
        for secret in secrets_of(raw):
            assert secret not in session.session_data
            assert secret not in repr(session.get_decoded())
    for cookie in [*response.cookies.values(), *operator.cookies.values()]:
        for secret in secrets_of(raw):
            assert secret not in cookie.value
    for entry in LogEntry.objects.all():
        assert not any(secret in repr(vars(entry)) for secret in secrets_of(raw))
    row = ApiKey.objects.filter(prefix=raw[len(KEY_MARKER) :][:PREFIX_LENGTH]).values().get()
    assert not any(secret in repr(row) for secret in secrets_of(raw))
    assert shown_key(response) == raw


def test_the_key_is_not_shown_again_on_the_next_admin_page(
    operator: Client, alice: Persona
) -> None:
    raw = shown_key(add_key(operator, alice))
    key = api_key_authenticate(raw=raw)
    assert key is not None

    for page in (
        ADD_URL,
        reverse("admin:index"),
        reverse("admin:tenants_apikey_changelist"),
        reverse("admin:tenants_apikey_change", args=[key.pk]),
        reverse("admin:tenants_tenant_change", args=[alice.tenant.pk]),
    ):
        response = operator.get(page)

        assert response.status_code == 200, page
        assert raw not in response.content.decode(), page
        assert not list(response.context["messages"]), page


def test_adding_from_a_popup_shows_the_key_instead_of_closing_the_window(
    operator: Client, alice: Persona
) -> None:
    response = add_key(operator, alice, _popup="1")

    assert response.status_code == 200
    raw = shown_key(response)
    assert api_key_authenticate(raw=raw) is not None
    assert "popup_response" not in response.content.decode()


def test_every_link_on_the_new_key_page_leads_somewhere(operator: Client, alice: Persona) -> None:
    response = add_key(operator, alice)
    links = {
        urljoin(f"http://testserver{ADD_URL}", href)
        for href in HREF.findall(response.content.decode())
    }

    ours = sorted(link for link in links if urlsplit(link).netloc == "testserver")
    assert reverse("admin:tenants_apikey_changelist") in {urlsplit(link).path for link in ours}
    for link in ours:
        parts = urlsplit(link)
        page = operator.get(parts.path + (f"?{parts.query}" if parts.query else ""), follow=True)

        assert page.status_code == 200, link


def test_a_key_whose_page_cannot_be_shown_is_not_kept(
    operator: Client, alice: Persona, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: TemplateResponse) -> TemplateResponse:
        raise RuntimeError("template failed")

    before = ApiKey.objects.count()
    monkeypatch.setattr(TemplateResponse, "render", broken)

    with pytest.raises(RuntimeError, match="template failed"):
        add_key(operator, alice)

    assert ApiKey.objects.count() == before
