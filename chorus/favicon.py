"""/favicon.ico: browsers ask for it on every admin page."""

from __future__ import annotations

from pathlib import Path

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

ICON = (Path(__file__).parent / "favicon.ico").read_bytes()


@require_safe
def favicon(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(ICON, content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
