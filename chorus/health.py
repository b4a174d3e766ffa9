"""Health probes of the web tier.

- `/healthz` (liveness): the process answers and reaches its database. Used by
  the run command and tests to see that a server is up.
- `/readyz` (readiness): everything a request may need answers now: the
  database, the broker (Redis: job queues, streams, rate limits) and the
  storage backend. 503 with the failing checks otherwise, so a load balancer or
  compose stops sending traffic here until they are back.

Workers have their own probe: `manage.py worker_ready`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import path

from chorus.redis_client import get_redis, note_redis_failure, redis_failed_lately
from synthesis.storage_runtime import get_storage

log = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")


def check_broker() -> None:
    client = get_redis()
    if client is None:
        raise ConnectionError("no broker configured (REDIS_URL)")
    if redis_failed_lately():
        raise ConnectionError("the broker failed moments ago")
    try:
        client.ping()
    except Exception:
        note_redis_failure()
        raise


def check_storage() -> None:
    get_storage().check()


CHECKS: dict[str, Callable[[], None]] = {
    "database": check_database,
    "broker": check_broker,
    "storage": check_storage,
}


def readyz(request: HttpRequest) -> JsonResponse:
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            check()
            results[name] = "ok"
        except Exception as exc:  # whatever breaks, the probe says which part
            # The class name only: a message may carry hosts or credentials.
            log.warning("readiness: %s failed: %s", name, exc)
            results[name] = f"failed: {type(exc).__name__}"
    ready = all(result == "ok" for result in results.values())
    return JsonResponse(
        {"status": "ready" if ready else "not_ready", "checks": results},
        status=200 if ready else 503,
    )


urlpatterns = [path("", healthz, name="healthz")]
