import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
django.setup(set_prefix=False)  # as django.core.asgi.get_asgi_application does

from chorus.asgi_handler import ChorusASGIHandler, in_own_context  # noqa: E402  (settings first)
from chorus.gc_tuning import tune_for_requests  # noqa: E402
from chorus.warm_up import web_warm_up  # noqa: E402
from quotas.middleware import BodyLimitMiddleware  # noqa: E402
from synthesis.realtime.endpoint import PATH as REALTIME_PATH  # noqa: E402
from synthesis.realtime.endpoint import realtime_endpoint  # noqa: E402

django_application = ChorusASGIHandler()
http_application = BodyLimitMiddleware(django_application)


async def routed(scope: Any, receive: Any, send: Any) -> None:
    """HTTP to Django; the one WebSocket route (realtime sessions) to its own app.
    Any other WebSocket is refused before its handshake completes (403)."""
    if scope["type"] != "websocket":
        await http_application(scope, receive, send)
    elif scope["path"].rstrip("/") == REALTIME_PATH:
        await realtime_endpoint(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": 1008})


application = in_own_context(routed)
web_warm_up()  # the first request waits no longer than the next ones
tune_for_requests()  # last: the application and what it loaded are in place
