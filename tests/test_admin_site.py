"""The admin says whose it is, and has an icon."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


@pytest.fixture
def operator(db: None) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("op", "op@example.com", "pw"))
    return client


def test_the_admin_is_titled_chorus(operator: Client) -> None:
    index = operator.get("/admin/").content.decode()
    login = Client().get("/admin/login/").content.decode()

    for page in (index, login):
        assert "<title>" in page
        assert "Django" not in page
    assert '<a href="/admin/">Chorus</a>' in index
    assert "Chorus administration | Chorus</title>" in index


def test_the_favicon_is_served(db: None) -> None:
    response = Client().get("/favicon.ico")

    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
