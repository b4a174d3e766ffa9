from django.urls import path

from batches.api import views

urlpatterns = [
    path("batches", views.BatchListCreateView.as_view(), name="batch-list"),
    path("batches/<uuid:batch_id>", views.BatchDetailView.as_view(), name="batch-detail"),
    path("batches/<uuid:batch_id>/cancel", views.BatchCancelView.as_view(), name="batch-cancel"),
]
