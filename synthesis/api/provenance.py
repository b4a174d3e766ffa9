"""POST /v1/provenance/verify: what a file's Content Credentials say, and
whether they still hold for its bytes (synthesis.provenance)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.openapi import (
    INVALID_REQUEST,
    MALFORMED_REQUEST,
    TENANT_ERRORS,
    UNKNOWN_FIELD,
    ErrorDoc,
    error_responses,
)
from chorus.api.serializers import StrictInput
from chorus.api.views import TenantAPIView
from chorus.errors import EmptyFile, FileTooLarge
from quotas.plans import tenant_limits
from synthesis.provenance import Verification, verify_audio
from synthesis.uploads import upload_limit


class VerifyInput(StrictInput):
    file = serializers.FileField(
        allow_empty_file=True, help_text="The audio file (wav, mp3 or flac carry the manifest)."
    )
    sidecar = serializers.FileField(
        required=False,
        default=None,
        allow_empty_file=True,
        help_text="Its sidecar manifest (`.c2pa`), for opus and pcm audio.",
    )


class ClaimsOutput(serializers.Serializer):
    actions = serializers.ListField(child=serializers.CharField())
    digital_source_type = serializers.CharField(allow_null=True)
    software_agent = serializers.CharField(allow_null=True)
    job_id = serializers.CharField(allow_null=True)
    tenant_sha256 = serializers.CharField(allow_null=True)
    issuer = serializers.CharField(allow_null=True)


class VerifyOutput(serializers.Serializer):
    manifest_present = serializers.BooleanField()
    valid = serializers.BooleanField(help_text="Signature and audio hash both hold.")
    embedded = serializers.BooleanField()
    signature_valid = serializers.BooleanField()
    hash_valid = serializers.BooleanField(help_text="The audio is the audio that was signed.")
    trusted = serializers.BooleanField(help_text="Signed by this deployment's certificate chain.")
    validation_state = serializers.CharField()
    claims = ClaimsOutput(required=False)
    failures = serializers.ListField(child=serializers.CharField())


def verification_answer(result: Verification) -> dict[str, Any]:
    answer = {**asdict(result), "valid": result.valid}
    if not result.claims:  # no manifest could be read: nothing is claimed
        del answer["claims"]
    return answer


class ProvenanceVerifyView(TenantAPIView):
    # Verifying changes nothing: a read-only key may do it.
    write_scope = "read"
    parser_classes = [MultiPartParser]

    @extend_schema(
        operation_id="provenance_verify",
        summary="Check a file's C2PA Content Credentials",
        description="Upload an audio file (and its `.c2pa` sidecar for opus or pcm). The "
        "answer says whether a manifest is present, what it claims, whether its "
        "signature holds and whether the audio is unchanged since it was signed. A "
        "file without credentials is answered 200 with `manifest_present: false`.",
        request={"multipart/form-data": VerifyInput},
        examples=[
            OpenApiExample(
                "A file",
                summary="Choose the audio as `file` (and its `.c2pa` as `sidecar` for opus or pcm)",
                value={},
                request_only=True,
                media_type="multipart/form-data",
            )
        ],
        responses={
            200: OpenApiResponse(VerifyOutput, description="The verification."),
            **error_responses(
                *TENANT_ERRORS,
                INVALID_REQUEST,
                UNKNOWN_FIELD,
                MALFORMED_REQUEST,
                ErrorDoc.of(EmptyFile, "The uploaded file is empty."),
                ErrorDoc.of(FileTooLarge, "The file is larger than your plan's upload size."),
            ),
        },
    )
    def post(self, request: Request) -> Response:
        with upload_limit(tenant_limits(self.tenant).max_upload_bytes):
            serializer = VerifyInput(data=request.data)
            serializer.is_valid(raise_exception=True)
        data = serializer.validated_data["file"].read()
        if not data:
            raise EmptyFile("The uploaded file is empty.")
        sidecar = serializer.validated_data["sidecar"]
        result = verify_audio(data=data, sidecar=sidecar.read() if sidecar else None)
        return Response(VerifyOutput(verification_answer(result)).data)
