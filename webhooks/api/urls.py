from django.urls import path

from webhooks.api import views

urlpatterns = [
    path(
        "webhooks/endpoints",
        views.EndpointListCreateView.as_view(),
        name="webhook-endpoint-list",
    ),
    path(
        "webhooks/endpoints/<uuid:endpoint_id>",
        views.EndpointDetailView.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhooks/endpoints/<uuid:endpoint_id>/rotate-secret",
        views.EndpointRotateSecretView.as_view(),
        name="webhook-endpoint-rotate-secret",
    ),
    path(
        "webhooks/endpoints/<uuid:endpoint_id>/deliveries",
        views.DeliveryListView.as_view(),
        name="webhook-delivery-list",
    ),
    path(
        "webhooks/endpoints/<uuid:endpoint_id>/deliveries/<uuid:delivery_id>/redeliver",
        views.DeliveryRedeliverView.as_view(),
        name="webhook-delivery-redeliver",
    ),
]
