"""The SSRF guard: which addresses a webhook may go to, checked after DNS and
kept for the connection."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from tests.webhooks.receiver import receiver_running
from webhooks import addresses
from webhooks.addresses import address_refusal, resolve_webhook_target, url_check
from webhooks.errors import InvalidWebhookUrl, WebhookAddressNotAllowed
from webhooks.sending import webhook_send


@pytest.fixture(autouse=True)
def _defaults(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE = False
    settings.WEBHOOK_ALLOWED_NETWORKS = []


def refusal(address: str) -> str:
    return address_refusal(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.5", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "cloud metadata"),
        ("169.254.10.10", "link-local"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "non-public"),
        ("::ffff:127.0.0.1", "loopback (inside ::ffff:7f00:1)"),
        ("::ffff:169.254.169.254", "cloud metadata (inside ::ffff:a9fe:a9fe)"),
        ("64:ff9b::a00:1", "private (inside 64:ff9b::a00:1)"),
        ("2002:7f00:1::", "loopback (inside 2002:7f00:1::)"),
    ],
)
def test_it_refuses_addresses_that_are_not_public(address: str, reason: str) -> None:
    assert refusal(address) == reason


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_it_allows_public_addresses(address: str) -> None:
    assert refusal(address) == ""


def test_allowing_private_addresses_still_refuses_the_metadata_service(settings: Any) -> None:
    settings.WEBHOOK_ALLOW_PRIVATE = True
    assert refusal("10.1.2.3") == ""
    assert refusal("127.0.0.1") == ""
    assert refusal("169.254.169.254") == "cloud metadata"
    assert refusal("fd00:ec2::254") == "cloud metadata"


def test_an_allowed_network_opens_only_that_network(settings: Any) -> None:
    settings.WEBHOOK_ALLOWED_NETWORKS = ["10.20.0.0/16", "127.0.0.1/32"]
    assert refusal("10.20.3.4") == ""
    assert refusal("127.0.0.1") == ""
    assert refusal("10.21.0.1") == "private"
    assert refusal("127.0.0.2") == "loopback"


def test_a_name_that_resolves_to_loopback_is_refused() -> None:
    # `localhost` resolves through the system's resolver, as a tenant's name would.
    with pytest.raises(WebhookAddressNotAllowed) as refused:
        resolve_webhook_target("https://localhost/hooks")
    assert refused.value.details["reason"] == "loopback"
    assert refused.value.details["host"] == "localhost"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/",
        "https://10.0.0.1/hook",
        "http://0x7f000001/",  # another spelling of 127.0.0.1
        "http://2130706433/",  # and another
    ],
)
def test_endpoint_urls_at_private_addresses_are_refused(url: str) -> None:
    with pytest.raises(WebhookAddressNotAllowed):
        url_check(url)


@pytest.mark.parametrize(
    "url",
    ["ftp://example.com/", "example.com/hook", "https:///path", "https://user:pw@example.com/", ""],
)
def test_urls_that_are_not_http_with_a_host_are_invalid(url: str) -> None:
    with pytest.raises(InvalidWebhookUrl):
        url_check(url)


def test_a_name_that_does_not_resolve_yet_is_accepted_at_creation() -> None:
    url_check("https://no-such-host.invalid/hooks")  # its deliveries check again


# DNS cannot be made to answer differently here, so the system resolver is
# replaced for the two tests below, and only it.


def test_one_private_address_among_public_ones_refuses_the_name(monkeypatch: Any) -> None:
    def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port)),
        ]

    monkeypatch.setattr(addresses.socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(WebhookAddressNotAllowed) as refused:
        resolve_webhook_target("https://mixed.example/hooks")
    assert refused.value.details["address"] == "10.0.0.7"


def test_the_request_goes_to_the_checked_address_without_a_second_lookup(
    monkeypatch: Any, settings: Any
) -> None:
    """DNS rebinding: the name answers an allowed address, then a private one.
    The sender resolves once and connects to what it checked, naming the host
    in the Host header."""
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    answers = ["127.0.0.1", "10.0.0.7"]
    lookups: list[str] = []
    system_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if host != "rebind.example":  # the connection's own lookup of an address literal
            return system_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = answers.pop(0)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    # Every lookup in the process, the HTTP client's included, goes through this.
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with receiver_running() as receiver:
        outcome = webhook_send(
            url=f"http://rebind.example:{receiver.port}/hooks?x=1",
            body=b"{}",
            headers={"webhook-id": "msg_1"},
        )
        assert outcome.succeeded, outcome
        [request] = receiver.received
    assert lookups == ["rebind.example"]
    assert request.headers["Host"] == f"rebind.example:{receiver.port}"
    assert request.path == "/hooks?x=1"


def test_a_delivery_to_a_refused_address_makes_no_connection() -> None:
    with receiver_running() as receiver:
        outcome = webhook_send(url=receiver.url, body=b"{}", headers={})
        assert receiver.received == []
    assert not outcome.succeeded
    assert outcome.error.startswith("webhook_address_not_allowed: 127.0.0.1 resolves to 127.0.0.1")
