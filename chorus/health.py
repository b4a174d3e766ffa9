"""`/healthz`: is the database reachable? Used by compose and the run command."""

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import path


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


urlpatterns = [path("", healthz, name="healthz")]
