"""`/v1/playground/`: a page for trying realtime sessions in a browser.

It holds no secret and needs no login: the visitor pastes a key, which stays in
the page; the page makes a one-time client token with it and connects with that
(docs/api/realtime.md).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse

from synthesis.realtime.endpoint import PATH


def playground(request: HttpRequest) -> HttpResponse:
    response = render(
        request,
        "realtime/playground.html",
        {"realtime_path": PATH, "tokens_path": reverse("realtime-tokens")},
    )
    response["Cache-Control"] = "no-store"
    return response
