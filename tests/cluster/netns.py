"""Hosts as Linux network namespaces on one bridge, for the cluster tests.

Every host is a namespace with one veth link (`eth0`) whose other end sits on a
bridge inside a namespace of its own (the "switch"). The test network's range,
198.18.0.0/24 (RFC 2544's, set aside for benchmarking networks), is addressed
only inside these namespaces: the machine's own namespace gets no address and no
route to it, so nothing the tests send can leave the switch.

Namespaces are named with a prefix per run; `teardown` removes them, and a run
starting removes any a killed earlier run left behind. Needs root (CI runs as root).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

from chorus.processes import process_alive

PREFIX = "chorus-c-"
SUBNET = "198.18.0"
_CLONE_NEWNET = 0x40000000


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces() -> list[str]:
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    return [line.split()[0] for line in listed if line.strip()]


def run_id() -> str:
    """This process's runs are named after it, so that a later run can tell a
    dead run's leftovers from a run that is still going."""
    return format(os.getpid(), "x")


def remove_stale() -> None:
    """Namespaces of an earlier run whose process died before its teardown."""
    for name in namespaces():
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX) :].partition("-")[0]
        with contextlib.suppress(ValueError):
            if process_alive(int(owner, 16)):
                continue
        _kill_all_in(name)
        _ip("netns", "del", name, check=False)


def _kill_all_in(namespace: str) -> None:
    pids = _ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


@dataclass(frozen=True)
class Link:
    host: str
    namespace: str
    address: str
    switch_end: str  # the veth end on the bridge


class Network:
    """One switch and the hosts plugged into it."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.switch = f"{PREFIX}{run_id}-sw"
        self.links: dict[str, Link] = {}
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, host: str, last_octet: int) -> Link:
        namespace = f"{PREFIX}{self.run_id}-{host}"
        switch_end = f"v{last_octet}"
        address = f"{SUBNET}.{last_octet}"
        _ip("netns", "add", namespace)
        _ip(
            "link", "add", "eth0", "netns", namespace, "type", "veth",
            "peer", "name", switch_end, "netns", self.switch,
        )  # fmt: skip
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "lo", "up")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", switch_end, "master", "br0", "up")
        link = Link(host, namespace, address, switch_end)
        self.links[host] = link
        return link

    def cut(self, host: str) -> None:
        """Unplug the host's cable: nothing reaches it or leaves it."""
        _ip("-n", self.switch, "link", "set", self.links[host].switch_end, "down")

    def plug(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", self.links[host].switch_end, "up")

    def kill_processes(self, host: str) -> None:
        """SIGKILL everything running on the host, as a machine that loses power."""
        _kill_all_in(self.links[host].namespace)

    def teardown(self) -> None:
        for link in self.links.values():
            _kill_all_in(link.namespace)
            _ip("netns", "del", link.namespace, check=False)
        _ip("netns", "del", self.switch, check=False)


_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Run this thread (and the threads it starts) inside `namespace`: sockets it
    opens belong to that host's network. Back to the original one after."""
    with open("/proc/self/ns/net") as original, open(f"/run/netns/{namespace}") as target:
        _setns(target.fileno())
        try:
            yield
        finally:
            _setns(original.fileno())


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
