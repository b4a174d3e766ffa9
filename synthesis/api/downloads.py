"""Downloads for the local storage backend: the app checks its own signatures.

With S3 storage, links point at the bucket itself and this view answers 404.
The signature covers bucket, key, expiry and filename, so a link to one tenant's
object cannot be edited into a link to another's.
"""

from __future__ import annotations

import mimetypes

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.views import APIView

from chorus.errors import NotFound
from synthesis.storage.local import LocalStorage
from synthesis.storage_runtime import get_storage


class FileDownloadView(APIView):
    authentication_classes: list[type] = []
    permission_classes = [AllowAny]

    @extend_schema(
        operation_id="files_download",
        summary="Download a stored file through a signed link (local storage only).",
        parameters=[
            OpenApiParameter("expires", int, required=True),
            OpenApiParameter("signature", str, required=True),
            OpenApiParameter("filename", str, required=False),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            404: OpenApiResponse(description="not_found: unknown object or invalid link"),
            410: OpenApiResponse(description="link_expired"),
        },
    )
    def get(self, request: Request, bucket: str, key: str) -> FileResponse:
        storage = get_storage()
        if not isinstance(storage, LocalStorage):
            raise NotFound("Not found.")
        filename = request.query_params.get("filename")
        storage.verify(
            bucket=bucket,
            key=key,
            expires=request.query_params.get("expires", ""),
            signature=request.query_params.get("signature", ""),
            filename=filename,
        )
        try:
            path = storage.path_for(bucket, key)
        except ValueError:
            raise NotFound("Not found.") from None
        if not path.is_file():
            raise NotFound("Not found.")
        content_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        response = FileResponse(
            path.open("rb"),
            content_type=content_type,
            as_attachment=bool(filename),
            filename=filename or "",
        )
        response["Cache-Control"] = "private, no-store"
        return response
