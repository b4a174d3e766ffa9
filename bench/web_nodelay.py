"""Sequential requests on one kept-alive connection, against the web server with
1 and 2 processes, with Chorus's protocol (TCP_NODELAY on every connection) and
with uvicorn's plain h11 protocol.

uvicorn's own `--workers N > 1` bound the listening socket with proto 0, and
asyncio only sets TCP_NODELAY on sockets whose proto is IPPROTO_TCP (uvicorn
issue #3149): a response's headers and body then left in two segments, and the
second waited for the client's delayed ACK (~40 ms). Chorus's web server now
binds a socket per process itself, with proto TCP (`chorus.web_supervisor`), and
its protocol sets the option on every connection too: this bench checks both.

    DATABASE_URL=sqlite:////tmp/nodelay/db.sqlite3 REDIS_URL=redis://127.0.0.1:6379/7 \\
      CHORUS_DATA_DIR=/tmp/nodelay .venv/bin/python bench/web_nodelay.py
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from chorus.web_server import PROTOCOL, web_server_argv  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(*, workers: int, protocol: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [str(a) for a in web_server_argv(host="127.0.0.1", port=port, workers=workers)]
    argv += ["--http", protocol]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server did not start")


def timed(session: requests.Session, method: str, url: str, n: int, **kw: object) -> float:
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        session.request(method, url, **kw)  # type: ignore[arg-type]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, check=True)
    print("| workers | protocol | GET /healthz ms | POST /v1/speech (401) ms |")
    print("| --- | --- | --- | --- |")
    for workers in (1, 2):
        for label, protocol in (("h11 (uvicorn)", "h11"), ("chorus", PROTOCOL)):
            proc, url = serve(workers=workers, protocol=protocol)
            try:
                with requests.Session() as s:
                    s.get(f"{url}/healthz")
                    get = timed(s, "GET", f"{url}/healthz", args.requests)
                    post = timed(
                        s,
                        "POST",
                        f"{url}/v1/speech",
                        args.requests,
                        json={"text": "Hello."},
                        headers={"Authorization": "Bearer ck_not_a_key"},
                    )
            finally:
                proc.terminate()
                proc.wait(10)
            print(f"| {workers} | {label} | {get:.1f} | {post:.1f} |")


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chorus.settings")
    main()
