from __future__ import annotations

import uuid

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from chorus.api.openapi import TENANT_ERRORS, error_responses, response_headers
from chorus.api.pagination import paginate
from chorus.api.views import TenantAPIView
from synthesis.api.docs import PAGE_PARAMETERS
from webhooks import selectors
from webhooks.api import docs
from webhooks.api.serializers import (
    DeliveryOutput,
    DeliveryPage,
    EndpointCreateInput,
    EndpointList,
    EndpointOutput,
    EndpointUpdateInput,
    EndpointWithSecretOutput,
)
from webhooks.services.deliveries import delivery_redeliver
from webhooks.services.endpoints import (
    endpoint_create,
    endpoint_delete,
    endpoint_rotate_secret,
    endpoint_update,
)

# Changing where a tenant's job results go is as much as submitting jobs.
WRITE_SCOPE = "speech:write"


class EndpointListCreateView(TenantAPIView):
    write_scope = WRITE_SCOPE

    @extend_schema(
        operation_id="webhook_endpoints_list",
        tags=["webhooks"],
        summary="List your webhook endpoints",
        description=docs.ENDPOINT_LIST,
        parameters=response_headers(200),
        responses={200: EndpointList, **error_responses(*TENANT_ERRORS)},
    )
    def get(self, request: Request) -> Response:
        endpoints = selectors.endpoint_list(tenant=self.tenant).order_by("-created_at")
        return Response({"results": EndpointOutput(endpoints, many=True).data})

    @extend_schema(
        operation_id="webhook_endpoints_create",
        tags=["webhooks"],
        summary="Add a webhook endpoint; its signing secret is in the answer",
        description=docs.ENDPOINT_CREATE,
        request=EndpointCreateInput,
        examples=docs.ENDPOINT_EXAMPLES,
        parameters=response_headers(201),
        responses={201: EndpointWithSecretOutput, **error_responses(*docs.CREATE_ERRORS)},
    )
    def post(self, request: Request) -> Response:
        serializer = EndpointCreateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        endpoint = endpoint_create(
            tenant=self.tenant,
            url=data["url"],
            event_types=data.get("event_types"),
            enabled=data["enabled"],
            description=data["description"],
        )
        return Response(EndpointWithSecretOutput(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetailView(TenantAPIView):
    write_scope = WRITE_SCOPE

    @extend_schema(
        operation_id="webhook_endpoints_retrieve",
        tags=["webhooks"],
        summary="Read a webhook endpoint",
        description=docs.ENDPOINT_RETRIEVE,
        parameters=response_headers(200),
        responses={200: EndpointOutput, **error_responses(*TENANT_ERRORS, docs.ENDPOINT_NOT_FOUND)},
    )
    def get(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        return Response(EndpointOutput(endpoint).data)

    @extend_schema(
        operation_id="webhook_endpoints_update",
        tags=["webhooks"],
        summary="Change or disable a webhook endpoint",
        description=docs.ENDPOINT_UPDATE,
        request=EndpointUpdateInput,
        examples=docs.UPDATE_EXAMPLES,
        parameters=response_headers(200),
        responses={200: EndpointOutput, **error_responses(*docs.UPDATE_ERRORS)},
    )
    def patch(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        serializer = EndpointUpdateInput(data=request.data)
        serializer.is_valid(raise_exception=True)
        endpoint = endpoint_update(
            tenant=self.tenant, endpoint=endpoint, **serializer.validated_data
        )
        return Response(EndpointOutput(endpoint).data)

    @extend_schema(
        operation_id="webhook_endpoints_destroy",
        tags=["webhooks"],
        summary="Delete a webhook endpoint",
        description=docs.ENDPOINT_DESTROY,
        parameters=response_headers(204),
        responses={
            204: OpenApiResponse(description="Deleted."),
            **error_responses(*TENANT_ERRORS, docs.ENDPOINT_NOT_FOUND),
        },
    )
    def delete(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        endpoint_delete(tenant=self.tenant, endpoint=endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointRotateSecretView(TenantAPIView):
    write_scope = WRITE_SCOPE

    @extend_schema(
        operation_id="webhook_endpoints_rotate_secret",
        tags=["webhooks"],
        summary="Give a webhook endpoint a new signing secret",
        description=docs.ENDPOINT_ROTATE,
        request=None,
        parameters=response_headers(200),
        responses={
            200: EndpointWithSecretOutput,
            **error_responses(*TENANT_ERRORS, docs.ENDPOINT_NOT_FOUND),
        },
    )
    def post(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        endpoint = endpoint_rotate_secret(tenant=self.tenant, endpoint=endpoint)
        return Response(EndpointWithSecretOutput(endpoint).data)


class DeliveryListView(TenantAPIView):
    @extend_schema(
        operation_id="webhook_deliveries_list",
        tags=["webhooks"],
        summary="An endpoint's deliveries and the log of their attempts",
        description=docs.DELIVERY_LIST,
        parameters=[*PAGE_PARAMETERS, *response_headers(200)],
        responses={200: DeliveryPage, **error_responses(*TENANT_ERRORS, docs.ENDPOINT_NOT_FOUND)},
    )
    def get(self, request: Request, endpoint_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        page = paginate(request, selectors.delivery_list(endpoint=endpoint))
        return Response(page.body(DeliveryOutput(page.rows, many=True).data))


class DeliveryRedeliverView(TenantAPIView):
    write_scope = WRITE_SCOPE

    @extend_schema(
        operation_id="webhook_deliveries_redeliver",
        tags=["webhooks"],
        summary="Send a delivery's event again",
        description=docs.DELIVERY_REDELIVER,
        request=None,
        parameters=response_headers(202),
        responses={202: DeliveryOutput, **error_responses(*docs.REDELIVER_ERRORS)},
    )
    def post(self, request: Request, endpoint_id: uuid.UUID, delivery_id: uuid.UUID) -> Response:
        endpoint = selectors.endpoint_get(tenant=self.tenant, endpoint_id=endpoint_id)
        delivery = selectors.delivery_get(endpoint=endpoint, delivery_id=delivery_id)
        again = delivery_redeliver(tenant=self.tenant, endpoint=endpoint, delivery=delivery)
        fresh = selectors.delivery_get(endpoint=endpoint, delivery_id=again.id)
        return Response(DeliveryOutput(fresh).data, status=status.HTTP_202_ACCEPTED)
