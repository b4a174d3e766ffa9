"""What the HTTP/1.1 protocol itself costs the web process, per request.

One uvicorn process on asyncio's loop serves a minimal ASGI app that answers as
a submit does (202, the headers Django sends, a small JSON body), so what moves
between rows is the protocol: uvicorn's h11 (pure Python), uvicorn's httptools
(llhttp, C) and Chorus's protocol (`chorus.web_server.PROTOCOL`: httptools with
the header deadline and the body idle limit). 8 kept-alive clients post back to
back, with a submit's request headers; the server's CPU (utime + stime) over the
requests served, in alternating rounds in fresh processes, medians.

    .venv/bin/python bench/http_protocol.py [--rounds 6] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = {
    "h11 (uvicorn)": "h11",
    "httptools (uvicorn)": "httptools",
    "chorus": "chorus.web_server:TimedHttpToolsProtocol",
}
BODY = b'{"text": "Hello there, this is a test of the service.", "voice_id": null}'
REQUEST = (
    b"POST /v1/speech HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Authorization: Bearer ck_0123456789abcdef0123456789abcdef\r\n"
    b"User-Agent: python-httpx/0.28.1\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
    b"Connection: keep-alive\r\nIdempotency-Key: 6c1f0e6a-8a2b-4f5e-9d3c-1b2a3c4d5e6f\r\n"
    b"Content-Type: application/json\r\n" + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY
)
ANSWER = b'{"id": "0193a0b1-aaaa-bbbb-cccc-ddddeeeeffff", "status": "queued"}'
ANSWER_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(ANSWER)).encode()),
    (b"location", b"/v1/speech/0193a0b1-aaaa-bbbb-cccc-ddddeeeeffff"),
    (b"vary", b"Accept, Authorization, origin"),
    (b"allow", b"GET, POST, HEAD, OPTIONS"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"x-request-id", b"5f0c8d7e6b5a49382716"),
    (b"x-ratelimit-limit", b"600"),
    (b"x-ratelimit-remaining", b"599"),
]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A submit's answer, without the submit."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 202, "headers": ANSWER_HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})


async def client(port: int, until: float, served: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.monotonic() < until:
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        served[0] += 1
    writer.close()


async def load(port: int, seconds: float, clients: int) -> int:
    served = [0]
    until = time.monotonic() + seconds
    await asyncio.gather(*(client(port, until, served) for _ in range(clients)))
    return served[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(protocol: str, seconds: float, clients: int) -> tuple[float, float]:
    """(server CPU µs per request, requests/s) for one fresh server."""
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "http_protocol:app", "--app-dir", str(ROOT / "bench")]
    argv += ["--port", str(port), "--http", protocol, "--loop", "asyncio"]
    argv += ["--log-level", "warning", "--no-access-log"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(argv, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.1)
        asyncio.run(load(port, 0.5, clients))  # warm up
        process = psutil.Process(server.pid)
        before = sum(process.cpu_times()[:2])  # user + system
        served = asyncio.run(load(port, seconds, clients))
        spent = sum(process.cpu_times()[:2]) - before
    finally:
        server.terminate()
        server.wait(10)
    return spent / served * 1e6, served / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {label: [] for label in PROTOCOLS}
    rate: dict[str, list[float]] = {label: [] for label in PROTOCOLS}
    for _ in range(args.rounds):
        for label, protocol in PROTOCOLS.items():
            micros, per_second = one_round(protocol, args.seconds, args.clients)
            cpu[label].append(micros)
            rate[label].append(per_second)
    print(
        f"{args.rounds} alternating rounds of {args.seconds:g} s, {args.clients} clients, "
        "one process on asyncio's loop; medians (range)"
    )
    print("| protocol | server CPU µs per request | requests/s |")
    print("| --- | --- | --- |")
    for label in PROTOCOLS:
        print(
            f"| {label} | {statistics.median(cpu[label]):.0f} "
            f"({min(cpu[label]):.0f}-{max(cpu[label]):.0f}) | "
            f"{statistics.median(rate[label]):.0f} |"
        )


if __name__ == "__main__":
    main()
