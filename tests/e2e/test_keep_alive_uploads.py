"""Voice uploads one after another on one kept-alive connection, under the real
web server.

A body larger than uvicorn's read buffer makes it pause and resume reading the
socket from inside the request; the callback it registers then carries that
request's context. A request that set context variables (asgiref's thread
context, Django's) leaked them into the next request on the connection: the
upload limit's lookup, which runs before Django, found the previous request's
ended thread context and the second upload was answered 500.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from tenants.models import Plan
from tests.audio_files import audio_file
from tests.conftest import make_persona
from tests.e2e.asgi import AsgiServer, asgi_server  # noqa: F401  (a fixture)


def test_uploads_on_one_connection_each_succeed(
    asgi_server: Callable[..., AsgiServer],  # noqa: F811
    plan: Plan,
) -> None:
    server = asgi_server()
    alice = make_persona("alice", plan)
    reference = audio_file(8.0, 24000)  # ~380 KB: past the server's read buffer
    assert len(reference) > 256 * 1024
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {alice.key}"}, timeout=30
    ) as http:
        statuses = []
        for n in range(4):
            answer = http.post(
                "/v1/voices",
                data={"name": f"narrator-{n}", "transcript": "A reference.", "language": "en"},
                files={"audio": ("n.wav", reference, "audio/wav")},
            )
            statuses.append(answer.status_code)
            # Other requests on the same connection, before and after Django.
            statuses.append(http.get("/v1/voices").status_code)
    assert statuses == [201, 200] * 4, "".join(server.lines[-40:])
