from django.urls import path

from quotas.api.views import UsageView

urlpatterns = [path("usage", UsageView.as_view(), name="usage")]
