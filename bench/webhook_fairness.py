"""Does a hanging webhook receiver hold up other tenants' deliveries?

Tenant `slow` has an endpoint that takes `--stall` seconds (3) to answer each
request, under a timeout a second longer (so it counts as slow: half the
timeout or more); `--slow-events` (40) of its events are published first. Right after,
tenant `quick` publishes `--quick-events` (20) to an endpoint that answers at
once. One real webhook worker process (CHORUS_WEBHOOK_WORKER_CONCURRENCY threads, 8)
delivers them over Redis. Each round runs with a cap on one endpoint's attempts
at once (CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY): the default, 2, and the light
worker's thread count, 8, which is no cap at all (how deliveries ran before).
Printed: the quick tenant's delay from its event's creation to its receiver's
2xx, and how long the slow tenant's deliveries took in all.

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_hooks_bench \\
  REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python bench/webhook_fairness.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_hooks_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
os.environ["CHORUS_WEBHOOK_ALLOWED_NETWORKS"] = "127.0.0.1/32"  # the receivers are local

import harness


class Receiver:
    """Answers 204 after `stall` seconds; records when each webhook-id was first
    acknowledged."""

    def __init__(self, stall: float) -> None:
        self.stall = stall
        self.lock = threading.Lock()
        self.acked_at: dict[str, float] = {}
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        server.daemon_threads = True
        server.request_queue_size = 128
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(receiver.stall)
                with receiver.lock:
                    receiver.acked_at.setdefault(self.headers["webhook-id"], time.time())
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def one_round(args: argparse.Namespace, cap: int, tenants: dict[str, Any]) -> dict[str, float]:
    from django.conf import settings

    from chorus.redis_client import get_redis
    from synthesis.worker import light_worker_argv
    from webhooks.events import event_publish
    from webhooks.models import WebhookEndpoint, WebhookEvent
    from webhooks.services.endpoints import endpoint_create

    redis = get_redis()
    assert redis is not None
    redis.delete(settings.WEBHOOK_QUEUE)
    WebhookEvent.objects.all().delete()
    WebhookEndpoint.objects.all().delete()
    slow, quick = Receiver(stall=args.stall), Receiver(stall=0.0)
    for name, receiver in (("slow", slow), ("quick", quick)):
        endpoint_create(tenant=tenants[name], url=receiver.url, event_types=["batch.completed"])

    # The tenant's cap too: its one endpoint is held to `cap` alone.
    env = dict(
        os.environ,
        CHORUS_WEBHOOK_ENDPOINT_CONCURRENCY=str(cap),
        CHORUS_WEBHOOK_TENANT_CONCURRENCY=str(cap),
    )
    worker = subprocess.Popen(
        light_worker_argv(
            queue=settings.WEBHOOK_QUEUE, hostname="benchfair@%h", loglevel="WARNING"
        ),
        cwd=harness.ROOT,
        env=env,
    )
    try:
        time.sleep(4)  # the worker connects to the broker
        created: dict[str, dict[str, float]] = {"slow": {}, "quick": {}}
        started = time.time()
        for name, count in (("slow", args.slow_events), ("quick", args.quick_events)):
            for n in range(count):
                event = event_publish(
                    tenant_id=tenants[name].pk, event_type="batch.completed", data={"n": n}
                )
                assert event is not None
                created[name][event.webhook_id] = event.created_at.timestamp()
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and (
            len(slow.acked_at) < args.slow_events or len(quick.acked_at) < args.quick_events
        ):
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        slow.server.shutdown()
        quick.server.shutdown()
    assert len(quick.acked_at) == args.quick_events, "quick deliveries missing"
    assert len(slow.acked_at) == args.slow_events, "slow deliveries missing"
    delays = [quick.acked_at[i] - at for i, at in created["quick"].items()]
    return {
        "quick p50": statistics.median(delays),
        "quick max": max(delays),
        "slow all": max(slow.acked_at.values()) - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow-events", type=int, default=40)
    parser.add_argument("--quick-events", type=int, default=20)
    parser.add_argument("--stall", type=float, default=3.0)
    parser.add_argument("--caps", default="2,8")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    # An endpoint is slow from half the timeout on: 2 s for a 3 s stall.
    os.environ["CHORUS_WEBHOOK_TIMEOUT"] = str(args.stall + 1)
    harness.setup(broker_slots=2)
    from django.conf import settings

    tenants = {name: harness.tenant(f"hooks-{name}") for name in ("slow", "quick")}
    rows = []
    for _ in range(args.rounds):
        for cap in (int(c) for c in args.caps.split(",")):
            rows.append((cap, one_round(args, cap, tenants)))
    print(
        f"\n{args.slow_events} events to an endpoint answering in {args.stall:g} s, then "
        f"{args.quick_events} to another tenant's answering at once; one webhook worker x "
        f"{settings.WEBHOOK_WORKER_CONCURRENCY} threads\n"
    )
    print(
        "| attempts a slow endpoint may run at once | quick tenant's delay p50 | max "
        "| slow tenant's all |"
    )
    print("| --- | --- | --- | --- |")
    for cap, row in rows:
        print(
            f"| {cap} | {row['quick p50']:.2f} s | {row['quick max']:.2f} s "
            f"| {row['slow all']:.1f} s |"
        )


if __name__ == "__main__":
    main()
