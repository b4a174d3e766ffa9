"""How many speech jobs the web tier accepts per second, and what each costs.

Real HTTP against real uvicorn web processes (`chorus.web_server.web_server_argv`)
on PostgreSQL and Redis, no workers: N clients (default 1, 8, 32), each on one
keep-alive connection posting `POST /v1/speech` back to back, as M tenants
(default 1 and 100; client i is tenant i mod M). Fair admission as in
production (two broker slots per tenant), so most jobs are held back `pending`.

For each (tenants, clients) it prints accepted jobs/s, latency percentiles, and
per accepted job: CPU ms of the web processes and of this database's
PostgreSQL backends (utime + stime from /proc/<pid>/stat; CPU time, so the other
work on the machine disturbs it far less than wall time), the round trips to
PostgreSQL one submit makes (counted by Django in a one-request probe, in this
process, against the same database, as the wire shows them (`chorus.pg_trace`):
psycopg's own BEGIN and COMMIT included, a string of statements sent together
counted once), and a fixed Python loop's time: the
machine's speed, next to which the figures of different runs compare.

The load generator is one asyncio process with a minimal HTTP/1.1 client, so
that it takes little of the CPU it measures. By default each client posts back
to back (throughput; the latency is then the queue the clients themselves keep
full: 32 clients at R jobs/s wait 32/R s on average). `--rate R` offers R jobs/s
in all, spread evenly over the clients, and counts each request's latency from
the instant it was due: the latency at a given load.

  DATABASE_URL=postgres://postgres@127.0.0.1:5432/chorus_admission_bench \\
  REDIS_URL=redis://127.0.0.1:6379/12 .venv/bin/python bench/admission.py \\
    [--web 2] [--clients 1,8,32] [--tenants 1,100] [--seconds 8] [--rate 60] [--poll]

`--poll` times the request clients make most instead: each client reads one
held-back job of its tenant (`GET /v1/speech/{id}`: the job, its place in line
and the estimate of its start) over and over.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/chorus_admission_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")
os.environ.setdefault("CHORUS_LOG_LEVEL", "WARNING")  # a log line per job is not the subject
import harness

BODY = harness.ADMISSION_BODY.encode()
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
    except OSError:  # a thread or the process ended meanwhile
        pass
    return found


def web_pids(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children(pid)
    return pids


def backend_pids() -> list[int]:
    """This database's PostgreSQL backends (children of the postmaster)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall()]


class Sampler:
    """CPU of a changing set of processes between two instants."""

    def __init__(self, pids: list[int]) -> None:
        self.start = {pid: cpu_seconds(pid) for pid in pids}

    def used(self, pids: list[int]) -> float:
        # A process that appeared during the run counts from zero.
        return sum(cpu_seconds(pid) - self.start.get(pid, 0.0) for pid in pids)


def submit_request(key: str) -> bytes:
    return (
        f"POST /v1/speech HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
    ).encode() + BODY


def poll_request(key: str, job_id: str) -> bytes:
    return (
        f"GET /v1/speech/{job_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {key}\r\n\r\n"
    ).encode()


async def client(
    port: int,
    request: bytes,
    stop: list[float],
    latencies: list[float],
    statuses: dict[int, int],
    schedule: tuple[float, float] | None = None,
) -> None:
    """Posts back to back, or, with `schedule` (first send, interval), at fixed
    instants: then a request's latency counts from the instant it was due, so a
    server that falls behind is charged for the wait too (no coordinated omission)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    due = schedule[0] if schedule else 0.0
    while time.monotonic() < stop[0]:
        t0 = time.monotonic()
        if schedule:
            if due > t0:
                await asyncio.sleep(due - t0)
            t0, due = due, due + schedule[1]
            if t0 >= stop[0]:
                break
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 "):
            raise RuntimeError(f"unexpected answer: {head[:200]!r}")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        latencies.append(time.monotonic() - t0)
        statuses[status] = statuses.get(status, 0) + 1
    writer.close()


async def load(
    port: int, requests: list[bytes], clients: int, seconds: float, rate: float | None = None
) -> dict[str, Any]:
    """`clients` connections for `seconds` (client i sends requests[i mod len]),
    back to back, or together offering `rate` requests a second; returns
    latencies and statuses."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    t0 = time.monotonic()
    stop = [t0 + seconds]

    def schedule(i: int) -> tuple[float, float] | None:
        # Client i sends at t0 + (i + k * clients) / rate: staggered, evenly spread.
        return None if rate is None else (t0 + 0.05 + i / rate, clients / rate)

    await asyncio.gather(
        *(
            client(port, requests[i % len(requests)], stop, latencies, statuses, schedule(i))
            for i in range(clients)
        )
    )
    return {"latencies": latencies, "statuses": statuses, "wall": time.monotonic() - t0}


def reset_jobs() -> None:
    """An empty line before each run: no jobs, no queued messages, fresh windows."""
    from django.conf import settings
    from django.db import connection

    from chorus.redis_client import get_redis

    with connection.cursor() as cursor:
        cursor.execute(
            # CASCADE: batch items hang off jobs too.
            "TRUNCATE synthesis_idempotencykey, quotas_ledgerentry, synthesis_job, "
            "quotas_usageperiod CASCADE"
        )
        cursor.execute("VACUUM ANALYZE synthesis_job")
    client = get_redis()
    assert client is not None
    client.delete(*settings.SYNTH_QUEUES, "unacked", "unacked_index")
    for key in client.scan_iter("chorus:rl:*"):
        client.delete(key)


def reference_loop_ms() -> float:
    """The median of three runs of a fixed pure-Python loop: the same code's
    figures move with the machine's speed (a shared host's two cores ran this
    loop in 1.3 to 2.3 s within one evening), so compare runs next to it."""
    times = []
    for _ in range(3):
        started = time.process_time()
        total = 0
        for i in range(5_000_000):
            total += i
        times.append(time.process_time() - started)
    return statistics.median(times) * 1000


def held_back_job(port: int, key: str) -> str:
    """The id of a job of this key's tenant held back `pending` (its third: two
    go to the broker), for `--poll`: a poll of it computes a place in line."""
    import requests

    for _ in range(3):
        answer = requests.post(
            f"http://127.0.0.1:{port}/v1/speech",
            data=BODY,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            timeout=10,
        )
        answer.raise_for_status()
    job = answer.json()
    assert job["status"] == "pending", job
    return str(job["id"])


def statements_per_submit(key: str) -> tuple[int, int]:
    """Round trips to PostgreSQL of an accepted submit, counted in this process
    (a string of statements sent together is one; `chorus.statements`): (one that
    goes straight to the broker, one held back pending). With two broker slots
    and no workers, a tenant's second job is queued and its third held back."""
    from django.test import Client

    from chorus.pg_trace import queries_sent

    reset_jobs()
    web = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    web.post("/v1/speech", BODY, content_type="application/json")  # opens the period
    counts = []
    for expected in ("queued", "pending"):
        with queries_sent() as sent:
            response = web.post("/v1/speech", BODY, content_type="application/json")
        assert response.status_code == 202, response.content
        assert response.json()["status"] == expected, response.content
        if os.environ.get("BENCH_SHOW_SQL"):
            for query in sent:
                print("   ", query[:160].replace("\n", " "), file=sys.stderr)
        # A connection prepares a statement the first time it meets it, once
        # (`chorus.statements`): not a cost of every submit.
        counts.append(sum(1 for query in sent if not query.startswith("PREPARE")))
    return counts[0], counts[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--web", type=int, default=2, help="web processes")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--tenants", default="1,100")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="offer this many jobs/s in all (latency at a given load) instead of back to back",
    )
    parser.add_argument(
        "--poll",
        action="store_true",
        help="poll instead of submit: each client reads one held-back job of its tenant",
    )
    args = parser.parse_args()
    ok = 200 if args.poll else 202

    os.environ["CHORUS_TENANT_BROKER_SLOTS"] = "2"  # the production default
    harness.ensure_database()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    tenant_counts = [int(t) for t in args.tenants.split(",")]
    keys = [harness.http_tenant(f"admission-{n:03d}")[1] for n in range(max(tenant_counts))]

    rows = []
    with harness.quiet_web(workers=args.web) as (web, port):
        sql = statements_per_submit(keys[0])
        for tenants in tenant_counts:
            for clients in [int(c) for c in args.clients.split(",")]:
                reset_jobs()
                if args.poll:
                    wire = [poll_request(k, held_back_job(port, k)) for k in keys[:tenants]]
                else:
                    wire = [submit_request(k) for k in keys[:tenants]]
                asyncio.run(load(port, wire, clients, args.warmup))
                web_cpu = Sampler(web_pids(web.pid))
                db_cpu = Sampler(backend_pids())
                result = asyncio.run(load(port, wire, clients, args.seconds, rate=args.rate))
                web_s = web_cpu.used(web_pids(web.pid))
                db_s = db_cpu.used(backend_pids())
                accepted = result["statuses"].get(ok, 0)
                lat = result["latencies"]
                rows.append(
                    {
                        "tenants": tenants,
                        "clients": clients,
                        "jobs/s": accepted / result["wall"],
                        "p50": statistics.median(lat) * 1000,
                        "p95": harness.percentile(lat, 0.95) * 1000,
                        "p99": harness.percentile(lat, 0.99) * 1000,
                        "web": web_s * 1000 / max(1, accepted),
                        "db": db_s * 1000 / max(1, accepted),
                        "other": sum(n for s, n in result["statuses"].items() if s != ok),
                    }
                )
                print(rows[-1], file=sys.stderr)
    what = "polls" if args.poll else "jobs"
    print(
        f"\n{args.web} web processes, {args.seconds:.0f} s per row, no workers, "
        + ("back to back" if args.rate is None else f"{args.rate:.0f} {what}/s offered")
        + "; "
        f"round trips to PostgreSQL per accepted submit (BEGIN and COMMIT included): "
        f"{sql[0]} queued, {sql[1]} held back; this machine's reference loop: "
        f"{reference_loop_ms():.0f} ms"
    )
    print(
        f"| tenants | clients | {'answered polls' if args.poll else 'accepted jobs'}/s "
        "| p50 ms | p95 ms | p99 ms "
        f"| web CPU ms/{what[:-1]} | PostgreSQL CPU ms/{what[:-1]} | refused |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['tenants']} | {r['clients']} | {r['jobs/s']:.0f} | {r['p50']:.1f} "
            f"| {r['p95']:.1f} | {r['p99']:.1f} | {r['web']:.1f} | {r['db']:.1f} "
            f"| {r['other']} |"
        )


if __name__ == "__main__":
    main()
