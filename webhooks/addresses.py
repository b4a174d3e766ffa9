"""Which addresses a webhook may be sent to (the SSRF guard).

A tenant chooses the URL and Chorus makes the request from inside the
operator's network, so the URL could point at the metadata service of a cloud
machine, at Redis on loopback or at an admin page on the private network. The
host is resolved once, every address it resolves to is checked, and the
request then goes to the checked address (`WebhookTarget.address`) with the
original name in `Host` and in TLS: a DNS answer that changes between the check
and the connection (DNS rebinding) is never asked for.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from django.conf import settings

from webhooks.errors import InvalidWebhookUrl, WebhookAddressNotAllowed

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_LENGTH = 2000

# Instance metadata services (AWS, GCP, Azure, OpenStack, ECS tasks, Alibaba,
# Oracle). Refused even where private addresses are allowed: a receiver never
# lives there, and a leaked answer holds the machine's credentials.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",
        "169.254.170.2",
        "169.254.169.123",
        "100.100.100.200",
        "192.0.0.192",
        "fd00:ec2::254",
        "fd00:ec2::23",
    )
)
# IPv6 forms that carry an IPv4 address the OS may route to: NAT64's well-known
# prefix (RFC 6052); IPv4-mapped and 6to4 are unwrapped through the stdlib.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


@dataclass(frozen=True)
class WebhookTarget:
    url: SplitResult
    host: str  # as written in the URL (a name, or an address)
    port: int
    address: IPAddress  # the checked address the connection goes to


def parse_webhook_url(url: str) -> SplitResult:
    """An http(s) URL with a host and nothing we would send that the tenant did
    not mean (no user:password part); InvalidWebhookUrl otherwise."""
    if len(url) > MAX_URL_LENGTH:
        raise InvalidWebhookUrl(
            f"The URL is longer than {MAX_URL_LENGTH} characters.", details={"url": url[:100]}
        )
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        raise InvalidWebhookUrl(f"The URL is not valid: {exc}.", details={"url": url}) from None
    if parts.scheme not in ("http", "https"):
        raise InvalidWebhookUrl(
            "A webhook URL must start with https:// or http://.", details={"url": url}
        )
    if not parts.hostname:
        raise InvalidWebhookUrl("The URL has no host.", details={"url": url})
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhookUrl(
            "Put no user or password in the URL; verify deliveries by their signature.",
            details={"url": url},
        )
    return parts


def resolve_webhook_target(url: str) -> WebhookTarget:
    """Parse `url`, resolve its host once and check every address it has.

    Raises InvalidWebhookUrl, WebhookAddressNotAllowed, or OSError when the name
    does not resolve (a delivery retries that; creating an endpoint refuses it)."""
    parts = parse_webhook_url(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = resolve_host(host, port)
    for address in addresses:
        reason = address_refusal(address)
        if reason:
            raise WebhookAddressNotAllowed(
                f"{host} resolves to {address}, a {reason} address; Chorus does not send "
                f"webhooks there.{_how_to_allow(reason)}",
                details={"host": host, "address": str(address), "reason": reason},
            )
    return WebhookTarget(url=parts, host=host, port=port, address=addresses[0])


def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address of `host` (an address literal resolves to itself)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        # An IPv6 sockaddr may carry a zone ("fe80::1%eth0"): the zone is not the address.
        seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), None)
    if not seen:
        raise OSError(f"{host} has no address")
    return list(seen)


def address_refusal(address: IPAddress) -> str:
    """Why Chorus will not connect to `address` ("" when it will)."""
    inner = _embedded_ipv4(address)
    if inner is not None and inner != address:
        reason = address_refusal(inner)
        return reason and f"{reason} (inside {address})"
    if _operator_allows(address):
        return ""
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    if settings.WEBHOOK_ALLOW_PRIVATE:
        return ""
    # The narrowest name first: the stdlib counts link-local and reserved ranges as private too.
    for kind in ("loopback", "link_local", "multicast", "unspecified", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:  # shared (CGNAT), documentation, benchmarking ranges
        return "non-public"
    return ""


def _how_to_allow(reason: str) -> str:
    """What the operator sets to allow it: someone trying Chorus on one machine
    points a webhook at a receiver on loopback and should learn the switch from the
    error. Cloud metadata is refused whatever is set."""
    if reason.startswith("cloud metadata"):
        return ""
    return (
        " To deliver to this machine or a private network (a receiver you run yourself),"
        " start Chorus with CHORUS_WEBHOOK_ALLOW_PRIVATE=true, or allow ranges with"
        " CHORUS_WEBHOOK_ALLOWED_NETWORKS."
    )


def _embedded_ipv4(address: IPAddress) -> IPAddress | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _operator_allows(address: IPAddress) -> bool:
    return any(address in network for network in allowed_networks())


def allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(cidr, strict=False) for cidr in settings.WEBHOOK_ALLOWED_NETWORKS]


def url_check(url: str) -> None:
    """The check made when a tenant sets an endpoint's URL: its form, and the
    addresses its host has now. A name that does not resolve yet is accepted
    (its DNS may come later); every delivery checks again, and that check is
    the one that protects."""
    try:
        resolve_webhook_target(url)
    except OSError:
        parse_webhook_url(url)
