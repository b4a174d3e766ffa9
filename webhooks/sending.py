"""One HTTP request of a delivery, to the address the SSRF guard checked.

Redirects are not followed: a 3xx answer is a failed attempt (its Location in
the log), so a receiver cannot bounce a signed request on to an address the
guard never saw. Proxies are never used (a proxy would resolve the name again).

One deadline for the whole attempt (`CHORUS_WEBHOOK_TIMEOUT`, 10 s): connecting,
sending and the answer's first KiB. A timeout per read is no deadline: a receiver
that sends one byte every 8 s kept an attempt (and a worker's thread) 322 s under a
10 s read timeout. So every socket operation here is given what is left of the
attempt's time, never more (`_DeadlineBackend`), and one that starts after the
deadline fails at once. httpcore (httpx's transport) is used directly: httpx has
no way to hand its connection pool a network backend.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache
from typing import Any

import certifi
import httpcore
from django.conf import settings

from webhooks.addresses import WebhookTarget, resolve_webhook_target
from webhooks.errors import InvalidWebhookUrl, WebhookAddressNotAllowed

RESPONSE_BODY_LIMIT = 1024  # bytes of the receiver's answer kept in the log
USER_AGENT = "Chorus-Webhooks/1"
REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    latency_ms: float
    response_status: int | None = None
    response_body: str = ""
    error: str = ""


def webhook_send(*, url: str, body: bytes, headers: dict[str, str]) -> AttemptOutcome:
    started = time.perf_counter()
    deadline = time.monotonic() + settings.WEBHOOK_TIMEOUT_S

    def outcome(**fields: object) -> AttemptOutcome:
        latency = (time.perf_counter() - started) * 1000
        return AttemptOutcome(latency_ms=round(latency, 1), **fields)  # type: ignore[arg-type]

    try:
        target = resolve_webhook_target(url)
    except (InvalidWebhookUrl, WebhookAddressNotAllowed) as exc:
        return outcome(succeeded=False, error=f"{exc.code}: {exc.message}")
    except OSError as exc:
        return outcome(succeeded=False, error=f"dns: {exc}")
    # A pool per request: a connection opened (and, with TLS, checked) for one
    # host name must not carry another name's request to that address.
    with httpcore.ConnectionPool(
        ssl_context=_tls_context(), network_backend=_DeadlineBackend(deadline)
    ) as pool:
        try:
            with _stream(pool, target, body, headers) as response:
                kept = _read_some(response.iter_stream())
        except httpcore.TimeoutException as exc:
            return outcome(succeeded=False, error=f"timeout: {type(exc).__name__}")
        except (
            httpcore.NetworkError,
            httpcore.ProtocolError,
            httpcore.UnsupportedProtocol,
        ) as exc:
            return outcome(succeeded=False, error=f"{type(exc).__name__}: {exc}"[:500])
    text = kept.decode("utf-8", errors="replace")
    status = response.status
    if status in REDIRECTS:
        where = _header(response.headers, b"location")[:300]
        return outcome(
            succeeded=False,
            response_status=status,
            response_body=text,
            error=f"redirect not followed (Location: {where})",
        )
    ok = 200 <= status < 300
    return outcome(
        succeeded=ok,
        response_status=status,
        response_body=text,
        error="" if ok else f"HTTP {status}",
    )


def _stream(
    pool: httpcore.ConnectionPool, target: WebhookTarget, body: bytes, headers: dict[str, str]
) -> AbstractContextManager[httpcore.Response]:
    url = target.url
    address = str(target.address)
    host_in_url = f"[{address}]" if target.address.version == 6 else address
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    default_port = 443 if url.scheme == "https" else 80
    host_header = url.netloc.rsplit("@", 1)[-1]  # name and port as the tenant wrote them
    timeout = settings.WEBHOOK_TIMEOUT_S
    connect = min(settings.WEBHOOK_CONNECT_TIMEOUT_S, timeout)
    extensions: dict[str, Any] = {
        # Each operation's own limit; the backend cuts it to what is left.
        "timeout": {"connect": connect, "read": timeout, "write": timeout, "pool": connect}
    }
    if url.scheme == "https":
        extensions["sni_hostname"] = target.host
    return pool.stream(
        "POST",
        f"{url.scheme}://{host_in_url}:{target.port or default_port}{path}",
        headers=[
            *headers.items(),
            ("Host", host_header),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            ("User-Agent", USER_AGENT),
        ],
        content=body,
        extensions=extensions,
    )


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


@cache
def _tls_context() -> ssl.SSLContext:
    """Loading the CA bundle costs ~15 ms of CPU: once per process, not per attempt.
    (The context holds no connection state; each pool's connections are its own.)"""
    return ssl.create_default_context(cafile=certifi.where())


def _read_some(chunks: Iterator[bytes]) -> bytes:
    """The first KiB of the answer; the rest is never read."""
    kept = b""
    for chunk in chunks:
        kept += chunk
        if len(kept) >= RESPONSE_BODY_LIMIT:
            break
    return kept[:RESPONSE_BODY_LIMIT]


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's own socket backend, with every operation's timeout cut to the
    time left before `deadline` (time.monotonic())."""

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        stream = self._backend.connect_tcp(host, port, left, local_address, socket_options)
        return _DeadlineStream(stream, self._deadline)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadline: float) -> None:
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(self._deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(self._deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        secured = self._stream.start_tls(ssl_context, server_hostname, left)
        return _DeadlineStream(secured, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


def _left(deadline: float, timeout: float | None, expired: type[Exception]) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise expired("the attempt's deadline passed")
    return left if timeout is None else min(timeout, left)
