"""The web server's protocol sets TCP_NODELAY on every connection it accepts.

uvicorn with several workers binds the listening socket with proto 0, and
asyncio leaves TCP_NODELAY off on such sockets (uvicorn issue #3149): every
response's body then waited ~40 ms for the client's delayed ACK. The figures are
bench/web_nodelay.py's; this checks the option itself. It also checks that
`--threads` reaches every web process's settings.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import pytest

from chorus import web_server
from chorus.web_server import _no_delay


class _Transport(asyncio.Transport):
    def __init__(self, sock: Any) -> None:
        super().__init__()
        self.sock = sock

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default


def test_an_accepted_connection_gets_tcp_nodelay_even_from_a_proto_0_listener() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:  # proto 0, as uvicorn's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.proto == 0
                assert not accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)

                _no_delay(_Transport(accepted))

                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert client


def test_a_connection_without_a_tcp_socket_is_left_alone() -> None:
    left, right = socket.socketpair()
    with left, right:
        _no_delay(_Transport(left))  # a Unix socket has no TCP options
        _no_delay(_Transport(None))


def test_threads_is_handed_to_the_web_processes_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHORUS_WEB_THREADS", "2")
    seen: list[str | None] = []
    monkeypatch.setattr(
        web_server.uvicorn, "run", lambda **_: seen.append(os.environ.get("CHORUS_WEB_THREADS"))
    )
    assert web_server.main(["--threads", "5"]) == 0
    assert seen == ["5"]
    with pytest.raises(SystemExit, match="at least 1"):
        web_server.main(["--threads", "0"])
