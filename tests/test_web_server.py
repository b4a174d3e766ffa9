"""The web server's protocol sets TCP_NODELAY on every connection it accepts.

uvicorn with several workers binds the listening socket with proto 0, and
asyncio leaves TCP_NODELAY off on such sockets (uvicorn issue #3149): every
response's body then waited ~40 ms for the client's delayed ACK. The figures are
bench/web_nodelay.py's; this checks the option itself.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

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
