"""`/v1/playground/`: a page for trying realtime sessions in a browser.

It holds no secret and needs no login: the visitor pastes a key, which stays in
the page; the page makes a one-time client token with it and connects with that
(docs/api/realtime.md).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.generic import TemplateView

from synthesis.realtime.endpoint import PATH


class PlaygroundView(TemplateView):
    template_name = "realtime/playground.html"
    http_method_names = ["get", "head"]

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {"realtime_path": PATH, "tokens_path": reverse("realtime-tokens")}

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().get(request, *args, **kwargs)
        response["Cache-Control"] = "no-store"
        return response
