"""Django's ASGI handler, with three changes for the web tier, and the wrapper
that gives every request a context of its own (`in_own_context`).

**Request threads are reused.** Django runs each request in an asgiref
`ThreadSensitiveContext`, whose sync code gets a thread of its own: a new thread
per request, started and joined again, a quarter of the CPU of a request that
does little (py-spy, a refused submit). Here each request borrows a
single-thread executor from a pool kept on the event loop and hands it back at
its end: still one thread per request in flight (requests do not wait for each
other's database round trips), as a threaded WSGI server reuses its threads.
asgiref's `ThreadSensitiveContext(executor=...)` is made for this. A task that
outlived its request could not make thread-sensitive calls (asgiref refuses
them); the one such task, a stream's cancel when its client leaves, ends before
its request does (Django awaits the cancelled response, which awaits the cancel).

**One thread hop per request to a sync view.** Under ASGI Django builds the
middleware chain in async mode. Every middleware built on `MiddlewareMixin`
(sessions, CSRF, auth, messages, security, ...) then runs its `process_request`
and `process_response` each through `sync_to_async`, a hop from the event loop
to the request thread and back, and a sync-only middleware switches the chain
back the other way: about a dozen hops per request before the sync view's own.
They were half of a submit's CPU (py-spy, `bench/admission.py`). Here a request
for a sync view, nearly every route, runs the same middleware (settings.MIDDLEWARE)
built in sync mode, whole, in one hop to the thread Django runs sync views on,
and with it what Django's handler runs in two more hops of their own: the
`request_started` signal before, and the close of a response whose body is in
memory after (`request_finished`, which returns the database connection to its
pool; a streamed response closes once its body has been relayed).
Async views (the OpenAI-compatible stream, which awaits its first audio on the
event loop) keep Django's async chain: run from that thread they would hold it,
and every other request with it, while they wait.

**Two requests at a time run Python in a process.** A request takes one of
`settings.WEB_REQUEST_THREADS` places of its process (`CHORUS_WEB_THREADS`,
`--threads`, default 2) once its body has been read, and waits on the event loop
until one is free; only then does its thread run anything. Without that bound, 16
requests in flight in one process meant 16 threads taking the GIL from one
another: at 32 clients on two web processes, alternating runs, the tier accepted
207 and 227 jobs/s at 6.2 and 5.6 ms of web CPU each, and 258 and 265 jobs/s at
5.0 and 4.8 ms with two places (`bench/admission.py`). Two places still overlap
one request's database round trips with the other's Python. Bounding instead
only the hop that runs the middleware and view, with a lock in each request's
thread, gained little: what counts is how few threads wake. A slow client holds
no place while it uploads. A request that goes on without Python gives its place
back early: a streamed answer (relayed on the event loop for as long as it
lasts) and an async view (the OpenAI-compatible stream). A request that blocks in
its view (an S3 put of a voice upload) holds its place meanwhile; raise the
setting where such calls are slow.

**Bodies sent without a Content-Length.** A client may send its body chunked
(`Transfer-Encoding: chunked`: HTTP/1.1 allows it, and streaming HTTP clients do
it). Django's ASGI handler reads such a body completely (into a file that spills
to disk), but DRF sizes the body from the Content-Length header and reads an
absent one as "no body": a chunked JSON submit was answered 400 as if empty.
Here the length of the body as received is filled in where the client did not
declare one. `quotas.middleware` has already cut off a body past the ceiling.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.core.handlers.base import BaseHandler
from django.http import FileResponse, HttpRequest
from django.http.response import HttpResponseBase
from django.urls import Resolver404, ResolverMatch, get_resolver, set_script_prefix

# Idle request threads kept for the next requests; past this many they end.
IDLE_REQUEST_THREADS = 64


class _RequestThreads:
    """Single-thread executors lent to one request at a time. Used from the
    event loop's thread only, so it needs no lock."""

    def __init__(self) -> None:
        self._idle: list[ThreadPoolExecutor] = []

    def take(self) -> ThreadPoolExecutor:
        if self._idle:
            return self._idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        if len(self._idle) < IDLE_REQUEST_THREADS:
            self._idle.append(executor)
        else:
            executor.shutdown(wait=False)


class _Places:
    """The places of one process, on its event loop (a test may run one handler
    on several loops in turn, and an asyncio semaphore belongs to one)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free = asyncio.Semaphore(count)

    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._free = loop, asyncio.Semaphore(self._count)
        return self._free


class _Place:
    """One request's hold on a place: taken once, given back at most once."""

    def __init__(self, places: _Places) -> None:
        self._places = places
        self._held: asyncio.Semaphore | None = None

    async def take(self) -> None:
        free = self._places.semaphore()
        await free.acquire()
        self._held = free

    def give_back(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.release()


_request_place: contextvars.ContextVar[_Place | None] = contextvars.ContextVar(
    "chorus_request_place", default=None
)


class ChorusASGIHandler(ASGIHandler):
    def __init__(self) -> None:
        super().__init__()  # the async chain, for async views
        self._sync_handler = _SyncHandler()
        self._sync_handler.load_middleware(is_async=False)
        self._in_thread = sync_to_async(self._respond, thread_sensitive=True)
        self._threads = _RequestThreads()
        self._places = _Places(settings.WEB_REQUEST_THREADS)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)  # Django refuses it
            return
        place = _Place(self._places)
        # Seen by this request's tasks, which copy the context.
        token = _request_place.set(place)
        # An idle executor's thread runs nothing until the place is taken (`read_body`).
        executor = self._threads.take()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            place.give_back()
            _request_place.reset(token)
            self._threads.give_back(executor)

    async def read_body(self, receive: Any) -> Any:
        body = await super().read_body(receive)
        place = _request_place.get()
        if place is not None:
            await place.take()
        return body

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        match = _resolve(_path_info(scope))
        if match is not None and iscoroutinefunction(match.func):
            await super().handle(scope, receive, send)  # Django's async chain
            return
        scope = {**scope, _MATCH: match}  # resolved once (`_SyncHandler`)
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response: HttpResponseBase = await self._in_thread(scope, body_file)
            if response.streaming:
                place = _request_place.get()
                if place is not None:
                    place.give_back()  # its body is relayed on the event loop
                await self._relay(response, receive, send)
            else:
                await self.send_response(response, send)  # closed already
        finally:
            body_file.close()

    def _respond(self, scope: Any, body_file: Any) -> HttpResponseBase:
        """In the request's thread, all that Django's handler would run there in
        three hops: `request_started`, the middleware and view, and the close of
        a response whose body is in memory (`request_finished`, which hands the
        database connection back to its pool before the bytes go out)."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self._sync_handler.get_response(request)
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size
        if not response.streaming:
            response.close()
        return response

    async def _relay(self, response: HttpResponseBase, receive: Any, send: Any) -> None:
        """A streamed body, sent as Django's handler sends it: a client that leaves
        cancels the sending (the relay learns it so), then the response closes."""
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(self.send_response(response, send)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if not task.done():
                    task.cancel()
                with contextlib.suppress(RequestAborted, asyncio.CancelledError):
                    await task
        finally:
            await sync_to_async(response.close)()

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # Only async views come here (`handle`): they await on the event loop.
        place = _request_place.get()
        if place is not None:
            place.give_back()
        return await super().get_response_async(request)

    def create_request(self, scope: Any, body_file: Any) -> Any:
        request, error = super().create_request(scope, body_file)
        if request is not None and "CONTENT_LENGTH" not in request.META:
            size = body_file.seek(0, os.SEEK_END)
            body_file.seek(0)
            if size:
                request.META["CONTENT_LENGTH"] = str(size)
        return request, error


def _path_info(scope: Any) -> str:
    """The request's path below the script prefix, as Django's ASGI request has it."""
    prefix = get_script_prefix(scope)
    return scope["path"].removeprefix(prefix) if prefix else scope["path"]


def _resolve(path: str) -> ResolverMatch | None:
    """The view for this path, or None for an unknown path (whose 404 comes from
    the sync chain, as any sync view's answer)."""
    try:
        return get_resolver().resolve(path)
    except Resolver404:
        return None


# Where `handle` leaves a sync request's resolved view, in the request's scope.
_MATCH = "chorus.resolver_match"


class _SyncHandler(BaseHandler):
    """Django's sync chain, taking the view `handle` resolved already to tell
    sync from async (the URL patterns were walked twice per request: 2 % of a
    submit's CPU)."""

    def resolve_request(self, request: HttpRequest) -> ResolverMatch:
        match = getattr(request, "scope", {}).get(_MATCH)
        if match is None or hasattr(request, "urlconf"):  # a middleware chose other URLs
            return super().resolve_request(request)
        request.resolver_match = match
        return match


def in_own_context(app: Any) -> Any:
    """Run each request of `app` in a new, empty context.

    uvicorn starts a request's task in the context of the callback that read it,
    and a request whose body overflows the read buffer makes uvicorn pause and
    resume reading from inside that request: the resumed callback, and so the
    next request on the connection, inherited the earlier request's context
    variables (asgiref's thread context, Django's per-request locals). The
    upload limit's lookup, before Django, then met an ended thread context and
    the next upload was answered 500 (`tests/e2e/test_keep_alive_uploads.py`).
    """

    async def app_in_own_context(scope: Any, receive: Any, send: Any) -> None:
        # Awaited: cancelling this task (a shutdown) cancels the request's too.
        await asyncio.create_task(app(scope, receive, send), context=contextvars.Context())

    return app_in_own_context
