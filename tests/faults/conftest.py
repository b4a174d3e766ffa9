"""Fault injection runs on the end-to-end fixtures: real worker processes, the web
tier under uvicorn, real PostgreSQL and Redis."""

from tests.e2e.asgi import asgi_server  # noqa: F401
from tests.e2e.conftest import http_caller, s3_endpoint, start_worker  # noqa: F401
