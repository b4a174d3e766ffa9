from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from chorus.favicon import favicon
from chorus.health import readyz
from synthesis.metrics import metrics_view

handler400 = "chorus.api.errors.json_400"
handler403 = "chorus.api.errors.json_403"
handler404 = "chorus.api.errors.json_404"
handler500 = "chorus.api.errors.json_500"

# The admin's "View site" link: this service has no page at "/"; its page for
# people is the API's documentation (tests/test_admin_pages.py follows the link).
admin.site.site_url = "/v1/docs/"
admin.site.site_header = "Chorus"
admin.site.site_title = "Chorus"
admin.site.index_title = "Chorus administration"

urlpatterns = [
    # The bare host: where a person looking at the API should land.
    path("", RedirectView.as_view(pattern_name="docs"), name="root"),
    path("admin/", admin.site.urls),
    path("v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("v1/", include("synthesis.api.urls")),
    path("v1/", include("quotas.api.urls")),
    path("v1/", include("batches.api.urls")),
    path("v1/", include("webhooks.api.urls")),
    path("v1/", include("audit.api.urls")),
    path("healthz", include("chorus.health")),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", favicon, name="favicon"),
]
