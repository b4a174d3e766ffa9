"""One HTTP request of a delivery, to the address the SSRF guard checked.

Redirects are not followed: a 3xx answer is a failed attempt (its Location in
the log), so a receiver cannot bounce a signed request on to an address the
guard never saw. Timeouts: connect and read, from settings. Proxies from the
environment are ignored (a proxy would resolve the name again).
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from functools import cache

import certifi
import httpx
from django.conf import settings

from webhooks.addresses import WebhookTarget, resolve_webhook_target
from webhooks.errors import InvalidWebhookUrl, WebhookAddressNotAllowed

RESPONSE_BODY_LIMIT = 1024  # bytes of the receiver's answer kept in the log
USER_AGENT = "Chorus-Webhooks/1"


@dataclass(frozen=True)
class AttemptOutcome:
    succeeded: bool
    latency_ms: float
    response_status: int | None = None
    response_body: str = ""
    error: str = ""


def webhook_send(*, url: str, body: bytes, headers: dict[str, str]) -> AttemptOutcome:
    started = time.perf_counter()

    def outcome(**fields: object) -> AttemptOutcome:
        latency = (time.perf_counter() - started) * 1000
        return AttemptOutcome(latency_ms=round(latency, 1), **fields)  # type: ignore[arg-type]

    try:
        target = resolve_webhook_target(url)
    except (InvalidWebhookUrl, WebhookAddressNotAllowed) as exc:
        return outcome(succeeded=False, error=f"{exc.code}: {exc.message}")
    except OSError as exc:
        return outcome(succeeded=False, error=f"dns: {exc}")
    timeout = httpx.Timeout(
        connect=settings.WEBHOOK_CONNECT_TIMEOUT_S,
        read=settings.WEBHOOK_READ_TIMEOUT_S,
        write=settings.WEBHOOK_READ_TIMEOUT_S,
        pool=settings.WEBHOOK_CONNECT_TIMEOUT_S,
    )
    # A client per request: a pooled connection opened (and, with TLS, checked)
    # for one host name must not carry another name's request to that address.
    with httpx.Client(
        timeout=timeout, follow_redirects=False, trust_env=False, verify=_tls_context()
    ) as client:
        try:
            response = client.send(_request(client, target, body, headers), stream=True)
            try:
                kept = _read_some(response)
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            return outcome(succeeded=False, error=f"timeout: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return outcome(succeeded=False, error=f"{type(exc).__name__}: {exc}"[:500])
    text = kept.decode("utf-8", errors="replace")
    if response.is_redirect:
        where = response.headers.get("location", "")[:300]
        return outcome(
            succeeded=False,
            response_status=response.status_code,
            response_body=text,
            error=f"redirect not followed (Location: {where})",
        )
    ok = response.is_success
    return outcome(
        succeeded=ok,
        response_status=response.status_code,
        response_body=text,
        error="" if ok else f"HTTP {response.status_code}",
    )


def _request(
    client: httpx.Client, target: WebhookTarget, body: bytes, headers: dict[str, str]
) -> httpx.Request:
    url = target.url
    address = str(target.address)
    host_in_url = f"[{address}]" if target.address.version == 6 else address
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    default_port = 443 if url.scheme == "https" else 80
    host_header = url.netloc.rsplit("@", 1)[-1]  # name and port as the tenant wrote them
    extensions = {"sni_hostname": target.host} if url.scheme == "https" else {}
    return client.build_request(
        "POST",
        f"{url.scheme}://{host_in_url}:{target.port or default_port}{path}",
        content=body,
        headers={
            **headers,
            "Host": host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
        },
        extensions=extensions,
    )


@cache
def _tls_context() -> ssl.SSLContext:
    """Loading the CA bundle costs ~15 ms of CPU: once per process, not per attempt.
    (The context holds no connection state; each client's connections are its own.)"""
    return ssl.create_default_context(cafile=certifi.where())


def _read_some(response: httpx.Response) -> bytes:
    """The first KiB of the answer; the rest is never read."""
    kept = b""
    for chunk in response.iter_raw():
        kept += chunk
        if len(kept) >= RESPONSE_BODY_LIMIT:
            break
    return kept[:RESPONSE_BODY_LIMIT]
