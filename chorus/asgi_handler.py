"""Django's ASGI handler, reading bodies sent without a Content-Length.

A client may send its body chunked (`Transfer-Encoding: chunked`, no
Content-Length: HTTP/1.1 allows it, and streaming HTTP clients do it). Django's
ASGI handler reads such a body completely (into a file that spills to disk),
but DRF sizes the body from the Content-Length header and reads an absent one as
"no body": a chunked JSON submit was answered 400 as if empty. Here the length
of the body as received is filled in where the client did not declare one.
`chorus.body_limit` has already cut off a body past the service's ceiling.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.handlers.asgi import ASGIHandler


class ChorusASGIHandler(ASGIHandler):
    def create_request(self, scope: Any, body_file: Any) -> Any:
        request, error = super().create_request(scope, body_file)
        if request is not None and "CONTENT_LENGTH" not in request.META:
            size = body_file.seek(0, os.SEEK_END)
            body_file.seek(0)
            if size:
                request.META["CONTENT_LENGTH"] = str(size)
        return request, error
