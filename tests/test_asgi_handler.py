"""The web tier's ASGI handler: a sync view's request runs the middleware and the
view in one hop to a request thread, threads are reused across requests, a
request does not wait for another's, and async views stay on the event loop.
Past `WEB_REQUEST_THREADS` requests running at once the next one waits its turn;
a request still uploading, a streamed answer being relayed and an async view
awaiting hold no place.

Driven in-process through the ASGI interface with this module as the URLconf.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.urls import URLResolver, path

from chorus.asgi_handler import ChorusASGIHandler

release = threading.Event()
entered = threading.Event()


def thread_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(threading.get_ident()))


def blocking_view(request: HttpRequest) -> HttpResponse:
    entered.set()
    release.wait(10)
    return HttpResponse("done")


async def async_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(threading.get_ident()))


# Set by a test on its own loop: a streamed body or an async view waits for it.
loop_release: asyncio.Event | None = None


def streaming_view(request: HttpRequest) -> StreamingHttpResponse:
    async def body() -> Any:
        yield b"first "
        assert loop_release is not None
        await loop_release.wait()
        yield b"last"

    return StreamingHttpResponse(body())


async def waiting_async_view(request: HttpRequest) -> HttpResponse:
    assert loop_release is not None
    await loop_release.wait()
    return HttpResponse("awaited")


urlpatterns = [
    path("thread", thread_view),
    path("blocking", blocking_view),
    path("async", async_view),
    path("streaming", streaming_view),
    path("waiting-async", waiting_async_view),
]


@pytest.fixture(autouse=True)
def _urls(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__
    release.clear()
    entered.clear()


async def _get(
    app: ChorusASGIHandler,
    url: str,
    *,
    body_sent: asyncio.Event | None = None,
    events: list[tuple[str, int]] | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request; with `body_sent`, its body arrives only once that is set; with
    `events`, each part of the answer's body sent is noted in it."""
    messages: list[dict[str, Any]] = []
    answered = asyncio.Event()
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            if body_sent is not None:
                await body_sent.wait()
            return {"type": "http.request", "body": b"", "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)
        if events is not None and message["type"] == "http.response.body":
            events.append(("body", threading.get_ident()))
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answered.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    start = messages[0]
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return start["status"], dict(start["headers"]), body


def test_requests_to_sync_views_reuse_one_thread_when_one_at_a_time() -> None:
    app = ChorusASGIHandler()

    async def run() -> list[bytes]:
        return [(await _get(app, "/thread"))[2] for _ in range(10)]

    before = threading.active_count()
    idents = asyncio.run(run())
    assert len(set(idents)) == 1
    assert int(idents[0]) != threading.get_ident()  # a request thread, not the loop's
    assert threading.active_count() <= before + 1


def test_a_request_does_not_wait_for_another_requests_sync_view() -> None:
    app = ChorusASGIHandler()

    async def run() -> tuple[bytes, bytes, bool]:
        slow = asyncio.create_task(_get(app, "/blocking"))
        await asyncio.to_thread(entered.wait, 5)
        quick = await asyncio.wait_for(_get(app, "/thread"), timeout=5)
        still_blocked = not slow.done()
        release.set()
        return (await slow)[2], quick[2], still_blocked

    slow_body, quick_body, still_blocked = asyncio.run(run())
    assert still_blocked
    assert slow_body == b"done"
    assert quick_body.isdigit()


def test_an_async_view_runs_on_the_event_loop_through_the_same_middleware() -> None:
    app = ChorusASGIHandler()

    async def run() -> tuple[tuple[int, dict[bytes, bytes], bytes], ...]:
        loop_thread = str(threading.get_ident()).encode()
        answers = (await _get(app, "/async"), await _get(app, "/thread"))
        assert answers[0][2] == loop_thread
        assert answers[1][2] != loop_thread
        return answers

    for status, headers, _ in asyncio.run(run()):
        assert status == 200
        # chorus.request_log and Django's security middleware answered on both paths.
        assert headers[b"X-Request-Id"]
        assert headers[b"X-Content-Type-Options"] == b"nosniff"


def test_a_sync_views_path_is_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Telling a sync view from an async one resolves the path; Django's sync
    chain takes that match rather than walking the URL patterns again."""
    app = ChorusASGIHandler()
    resolved: list[str] = []
    resolve = URLResolver.resolve

    def counted(resolver: URLResolver, path: str) -> Any:
        if resolver.pattern.describe() == "'^/'":  # the root: once per resolution
            resolved.append(path)
        return resolve(resolver, path)

    monkeypatch.setattr(URLResolver, "resolve", counted)

    status, _, body = asyncio.run(_get(app, "/thread"))

    assert status == 200
    assert body.isdigit()
    assert resolved == ["/thread"]


def test_an_unknown_path_is_a_404_from_the_sync_chain() -> None:
    app = ChorusASGIHandler()
    status, headers, _ = asyncio.run(_get(app, "/nowhere"))
    assert status == 404
    assert headers[b"X-Request-Id"]


def test_past_its_places_a_request_waits_for_one_to_be_given_back(settings: Any) -> None:
    settings.WEB_REQUEST_THREADS = 1
    app = ChorusASGIHandler()

    async def run() -> tuple[bool, bytes, bytes]:
        slow = asyncio.create_task(_get(app, "/blocking"))
        await asyncio.to_thread(entered.wait, 5)
        quick = asyncio.create_task(_get(app, "/thread"))
        await asyncio.sleep(0.3)
        waited = not quick.done()
        release.set()
        return waited, (await slow)[2], (await asyncio.wait_for(quick, timeout=5))[2]

    waited, slow_body, quick_body = asyncio.run(run())
    assert waited  # the only place was the blocked request's
    assert slow_body == b"done"
    assert quick_body.isdigit()


def test_an_upload_in_progress_a_streamed_answer_and_an_async_view_hold_no_place(
    settings: Any,
) -> None:
    settings.WEB_REQUEST_THREADS = 1
    app = ChorusASGIHandler()

    async def run() -> list[bytes]:
        global loop_release
        loop_release = asyncio.Event()
        body_sent = asyncio.Event()
        uploading = asyncio.create_task(_get(app, "/thread", body_sent=body_sent))
        streaming = asyncio.create_task(_get(app, "/streaming"))
        awaiting = asyncio.create_task(_get(app, "/waiting-async"))
        await asyncio.sleep(0.3)  # all three are under way, none can finish
        quick = await asyncio.wait_for(_get(app, "/thread"), timeout=5)
        assert not uploading.done()
        assert not streaming.done()
        assert not awaiting.done()
        body_sent.set()
        loop_release.set()
        answers = [(await task)[2] for task in (uploading, streaming, awaiting)]
        return [quick[2], *answers]

    quick, uploaded, streamed, awaited = asyncio.run(run())
    assert quick.isdigit()
    assert uploaded.isdigit()
    assert streamed == b"first last"
    assert awaited == b"awaited"


def test_a_sync_views_request_starts_and_ends_in_its_one_hop_before_its_body_goes_out() -> None:
    app = ChorusASGIHandler()
    events: list[tuple[str, int]] = []

    def started(**_: Any) -> None:
        events.append(("started", threading.get_ident()))

    def finished(**_: Any) -> None:
        events.append(("finished", threading.get_ident()))

    async def run() -> tuple[bytes, bytes]:
        global loop_release
        loop_release = asyncio.Event()
        loop_release.set()
        plain = (await _get(app, "/thread", events=events))[2]
        events.append(("--", 0))
        streamed = (await _get(app, "/streaming", events=events))[2]
        return plain, streamed

    request_started.connect(started, weak=False)
    request_finished.connect(finished, weak=False)
    try:
        plain, streamed = asyncio.run(run())
    finally:
        request_started.disconnect(started)
        request_finished.disconnect(finished)

    view_thread = int(plain)
    cut = events.index(("--", 0))
    in_memory, relayed = events[:cut], events[cut + 1 :]
    # The request's connection goes back to its pool before the answer is sent,
    # by the thread that ran the view, in the same hop.
    assert [name for name, _ in in_memory] == ["started", "finished", "body"]
    assert in_memory[0][1] == in_memory[1][1] == view_thread
    # A streamed answer ends once its body has gone out.
    assert streamed == b"first last"
    names = [name for name, _ in relayed]
    assert (names[0], names[-1]) == ("started", "finished")
    assert names.count("body") >= 2
