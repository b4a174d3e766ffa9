"""Do one tenant's trickling webhook receivers hold up another tenant's webhook
and the long texts' splitting?

Tenant `a` has `--endpoints` (10) endpoints on a receiver that answers one byte
every `--trickle-every` seconds (2), its whole answer taking `--trickle-for` (40),
each byte well inside any read timeout; `--a-events` (2) of its events are
published first (a delivery per endpoint each). A second later tenant `b`
publishes one event to a receiver that answers at once, and tenant `c` submits a
long text, whose split (after its first segment) is a task on the `light` queue.
Printed: how long `b`'s webhook took to be acknowledged and `c`'s text to be split.

The same script runs on the code before this change (deliveries on the `light`
queue with the splits, a read timeout and no deadline, no tenant cap) from a
checkout of it: `git archive <commit> | tar -x -C /tmp/before`, copy this file to
/tmp/before/bench/ and run it there. It starts the light worker and, where the
code has a `webhooks` queue, the webhook worker, as `make run` does (8 threads each).

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_isolation_bench \\
  REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python bench/webhook_isolation.py
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_isolation_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
os.environ["CHORUS_WEBHOOK_ALLOWED_NETWORKS"] = "127.0.0.1/32"  # the receivers are local

import harness

SENTENCE = "A sentence of a long text, which the light worker splits into segments. "


class Trickler:
    """Reads each request, then answers 200 a byte every `every` seconds for `total`."""

    def __init__(self, every: float, total: float) -> None:
        self.every, self.total = every, total
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hooks"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                slow = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * int(self.total / self.every)
                for byte in slow:
                    conn.sendall(bytes([byte]))
                    time.sleep(self.every)
                conn.sendall(b"\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass  # the sender gave up


class Quick:
    """Answers 204 at once; records when it first acknowledged each webhook-id."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        acked: dict[str, float] = {}

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                acked.setdefault(self.headers["webhook-id"], time.time())
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.acked = acked
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"


def light_workers() -> list[subprocess.Popen[bytes]]:
    """What `make run` starts for work that needs no GPU, in this checkout."""
    from django.conf import settings

    from synthesis.worker import light_worker_argv

    argvs = [light_worker_argv(hostname="benchlight@%h", loglevel="WARNING")]
    queue = getattr(settings, "WEBHOOK_QUEUE", None)
    if queue:  # deliveries on a worker of their own
        argvs.append(light_worker_argv(queue=queue, hostname="benchhooks@%h", loglevel="WARNING"))
    return [subprocess.Popen(argv, cwd=harness.ROOT) for argv in argvs]


def _wait_ready(count: int, timeout: float = 120) -> None:
    """Until every worker answers a ping through the broker (it consumes by then)."""
    from chorus.celery import app

    deadline = time.monotonic() + timeout
    while len(app.control.ping(timeout=1.0)) < count:
        if time.monotonic() > deadline:
            raise SystemExit("the light workers did not start")
    time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--a-events", type=int, default=2)
    parser.add_argument("--trickle-every", type=float, default=2.0)
    parser.add_argument("--trickle-for", type=float, default=40.0)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    harness.setup(broker_slots=2)
    from django.conf import settings

    from chorus.redis_client import get_redis
    from synthesis.models import Job
    from synthesis.services.jobs import job_create
    from synthesis.speech_request import SpeechRequest
    from webhooks.events import event_publish
    from webhooks.models import WebhookEndpoint, WebhookEvent
    from webhooks.services.endpoints import endpoint_create

    redis = get_redis()
    assert redis is not None
    redis.delete("light", "webhooks")
    WebhookEvent.objects.all().delete()
    WebhookEndpoint.objects.all().delete()
    tenants = {name: harness.tenant(f"iso-{name}") for name in ("a", "b", "c")}
    trickler, quick = Trickler(args.trickle_every, args.trickle_for), Quick()
    for n in range(args.endpoints):
        endpoint_create(tenant=tenants["a"], url=f"{trickler.url}?n={n}")
    endpoint_create(tenant=tenants["b"], url=quick.url)

    workers = light_workers()
    try:
        _wait_ready(len(workers))
        for n in range(args.a_events):
            event_publish(tenant_id=tenants["a"].pk, event_type="batch.completed", data={"n": n})
        time.sleep(1)
        event = event_publish(tenant_id=tenants["b"].pk, event_type="batch.completed", data={})
        assert event is not None
        text = SENTENCE * 200
        job = job_create(
            tenant=tenants["c"],
            api_key=None,
            speech=SpeechRequest(text=text, language="en", format="wav"),
        )
        published = event.created_at.timestamp()
        webhook_s = split_s = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and (webhook_s is None or split_s is None):
            if webhook_s is None and event.webhook_id in quick.acked:
                webhook_s = quick.acked[event.webhook_id] - published
            if split_s is None and Job.objects.filter(pk=job.pk, segments_total__gt=0).exists():
                split_s = time.time() - job.created_at.timestamp()
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:  # still waiting on a trickling receiver
                worker.kill()
        quick.server.shutdown()
        trickler.listener.close()

    def shown(value: float | None) -> str:
        return f"{value:.1f} s" if value is not None else f"over {args.timeout:.0f} s"

    code = "webhooks queue" if hasattr(settings, "WEBHOOK_QUEUE") else "deliveries on light"
    print(
        f"\ntenant a: {args.endpoints} endpoints answering a byte every {args.trickle_every:g} s "
        f"for {args.trickle_for:g} s, {args.a_events} events each; "
        f"light worker(s) x {settings.LIGHT_WORKER_CONCURRENCY} threads ({code})\n"
    )
    print("| code | tenant b's webhook acknowledged after | tenant c's long text split after |")
    print("| --- | --- | --- |")
    print(f"| {code} | {shown(webhook_s)} | {shown(split_s)} |")


if __name__ == "__main__":
    main()
