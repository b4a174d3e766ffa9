"""Webhook deliveries against a receiver that fails 30 % of the time.

N events (1,000 by default) are published for one endpoint; real light worker
processes deliver them over Redis to an HTTP receiver on loopback that answers
500 at random to 30 % of requests and 204 otherwise. The receiver verifies
every signature with the `standardwebhooks` library and dedupes by
`webhook-id`, counting an acknowledgement of an id it had already acknowledged
as a duplicate. The retry schedule is compressed through
CHORUS_WEBHOOK_RETRY_SCHEDULE (default here 0.2,0.5,1,2,4,8,8 s: eight attempts
in ~24 s; in production 5 s ... 10 h, ~28 h), so the run takes a minute, not a day.

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_hooks_bench \\
  REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python bench/webhooks.py [--events 1000]

Delay: from the event's creation to the receiver's first 2xx for it. CPU: the
light workers' CPU seconds (user + system, from /proc) over the run, per
delivery, a measure the other processes on a shared machine disturb less than
wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_hooks_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
os.environ.setdefault("CHORUS_WEBHOOK_RETRY_SCHEDULE", "0.2,0.5,1,2,4,8,8")
os.environ["CHORUS_WEBHOOK_ALLOWED_NETWORKS"] = "127.0.0.1/32"  # the receiver is local

import harness

FAILURE_RATE = 0.3


class Receiver:
    def __init__(self, secret: str, seed: int) -> None:
        from standardwebhooks import Webhook

        self.verifier = Webhook(secret)
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.failed_on_purpose = 0
        self.bad_signatures = 0
        self.acked_at: dict[str, float] = {}  # webhook-id -> first 2xx
        self.duplicates = 0

    def answer(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            self.verifier.verify(body, headers)
        except Exception:
            with self.lock:
                self.requests += 1
                self.bad_signatures += 1
            return 400
        webhook_id = headers["webhook-id"]
        with self.lock:
            self.requests += 1
            if self.rng.random() < FAILURE_RATE:
                self.failed_on_purpose += 1
                return 500
            if webhook_id in self.acked_at:
                self.duplicates += 1  # acknowledged before: dropped, not processed again
            else:
                self.acked_at[webhook_id] = time.time()
            return 204


def serve(receiver: Receiver) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status = receiver.answer(body, {k.lower(): v for k, v in self.headers.items()})
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.request_queue_size = 128
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hooks"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children that exited, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--light-workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()

    harness.setup(broker_slots=2)
    import subprocess

    from django.conf import settings

    from chorus.redis_client import get_redis
    from synthesis.worker import light_worker_argv
    from webhooks.events import event_publish
    from webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
    from webhooks.services.endpoints import endpoint_create

    redis = get_redis()
    assert redis is not None
    redis.delete(settings.WEBHOOK_QUEUE)
    WebhookEvent.objects.all().delete()
    WebhookEndpoint.objects.all().delete()
    tenant = harness.tenant("webhooks")

    receiver = Receiver(secret="whsec_" + "A" * 43 + "=", seed=args.seed)  # replaced below
    server, url = serve(receiver)
    endpoint = endpoint_create(tenant=tenant, url=url, event_types=["batch.completed"])
    receiver.__init__(secret=endpoint.secret, seed=args.seed)  # type: ignore[misc]

    workers = [
        subprocess.Popen(
            light_worker_argv(
                queue=settings.WEBHOOK_QUEUE, hostname=f"benchlight{n}@%h", loglevel="WARNING"
            ),
            cwd=harness.ROOT,
            env=dict(os.environ),
        )
        for n in range(args.light_workers)
    ]
    try:
        time.sleep(4)  # the workers connect to the broker
        cpu_before = sum(cpu_seconds(w.pid) for w in workers)
        created: dict[str, float] = {}
        started = time.time()
        for n in range(args.events):
            event = event_publish(tenant_id=tenant.pk, event_type="batch.completed", data={"n": n})
            assert event is not None
            created[event.webhook_id] = event.created_at.timestamp()
        published_s = time.time() - started
        deadline = time.monotonic() + args.timeout
        while len(receiver.acked_at) < args.events and time.monotonic() < deadline:
            time.sleep(0.2)
        # Deliveries still pending, or an acknowledgement the database has not
        # recorded yet, would be sent again: wait for every row to settle.
        while (
            WebhookDelivery.objects.filter(status="pending").exists()
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        time.sleep(1.0)  # any stray second attempt would arrive now
        cpu = sum(cpu_seconds(w.pid) for w in workers) - cpu_before
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
        server.shutdown()

    delays = [receiver.acked_at[i] - created[i] for i in created if i in receiver.acked_at]
    attempts = WebhookAttempt.objects.filter(delivery__endpoint=endpoint).count()
    failed = WebhookDelivery.objects.filter(endpoint=endpoint, status="failed").count()
    most = max(WebhookDelivery.objects.filter(endpoint=endpoint).values_list("attempts", flat=True))
    rows = [
        ("events published", f"{args.events} in {published_s:.1f} s"),
        ("delivered (acknowledged once)", f"{len(receiver.acked_at)}"),
        ("acknowledged twice as new", f"{receiver.duplicates}"),
        ("gave up (schedule used up)", f"{failed}"),
        ("requests received", f"{receiver.requests}"),
        ("answered 500 on purpose", f"{receiver.failed_on_purpose}"),
        ("bad signatures", f"{receiver.bad_signatures}"),
        ("attempts logged", f"{attempts} ({attempts / args.events:.2f} per event, most {most})"),
        ("delay p50", f"{statistics.median(delays):.2f} s"),
        ("delay p95", f"{harness.percentile(delays, 0.95):.2f} s"),
        ("delay max", f"{max(delays):.2f} s"),
        ("light worker CPU", f"{cpu:.1f} s ({cpu / max(attempts, 1) * 1000:.1f} ms per attempt)"),
    ]
    print(
        f"\n{args.events} webhooks, receiver failing {FAILURE_RATE:.0%} at random, "
        f"{args.light_workers} light worker(s) x {settings.WEBHOOK_WORKER_CONCURRENCY} threads, "
        f"retry schedule {os.environ['CHORUS_WEBHOOK_RETRY_SCHEDULE']} s (compressed)\n"
    )
    print("| measure | value |\n| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")
    if receiver.duplicates or receiver.bad_signatures or len(receiver.acked_at) < args.events:
        sys.exit(1)


if __name__ == "__main__":
    main()
