"""Chorus on many hosts, as an operator runs it, built from network namespaces.

    client ─▶ lb (HAProxy) ─▶ web-1, web-2 ─┬─▶ db (PgBouncer, transaction mode ─▶ PostgreSQL)
                                            ├─▶ broker-1 (Redis master) ─▶ broker-2 (replica)
                                            │   Sentinels on broker-1, broker-2, broker-3
                                            └─▶ s3 (moto's S3 server)
    gpu-1, gpu-2 (synthesis workers, an emulated T4 each), light (light worker),
    webhooks (webhook worker), sweeper-1, sweeper-2, hooks (a customer's webhook receiver)

Every Chorus process reaches the database through PgBouncer and the broker
through Sentinel (`sentinel://`), keeps its files in its host's own folder, and
serves its metrics on its host (`CHORUS_METRICS_PORT`). Nothing is on loopback:
hosts talk over the switch only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from chorus.web_server import web_server_argv
from synthesis.worker import light_worker_argv, worker_argv
from tests.cluster.hosts import Host, Service, wait_until
from tests.cluster.netns import SUBNET, Network, entered, remove_stale, run_id

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql") / sorted(os.listdir("/usr/lib/postgresql"))[-1] / "bin"

ADDRESSES = {
    "client": 2, "lb": 3, "web-1": 11, "web-2": 12, "db": 20,
    "broker-1": 31, "broker-2": 32, "broker-3": 33, "s3": 40,
    "gpu-1": 51, "gpu-2": 52, "gpu-3": 53, "gpu-4": 54, "light": 60,
    "webhooks": 61, "sweeper-1": 71, "sweeper-2": 72, "hooks": 80,
}  # fmt: skip
WEB_PORT = 8000
METRICS_PORT = 9100
PGBOUNCER_PORT = 6432
SENTINEL_MASTER = "chorus"
METRICS_TOKEN = "cluster-metrics-token"
HOOKS_PORT = 8080

# An emulated T4 (the t4-cosyvoice2 profile's curve and memory), sped up so a
# scenario's jobs last seconds: `timing` overrides its delays, as benches do.
FAST_T4 = {"first_chunk_delay_s": 0.1, "rtf": 0.2, "chunk_s": 0.25, "seconds_per_char": 0.05}


def address(host: str) -> str:
    return f"{SUBNET}.{ADDRESSES[host]}"


class Cluster:
    def __init__(self, base_dir: Path, *, gpu_hosts: int = 2, timing: dict[str, Any] | None = None):
        self.run_id = run_id()
        self.base_dir = base_dir
        self.gpu_names = [f"gpu-{n}" for n in range(1, gpu_hosts + 1)]
        self.timing = FAST_T4 if timing is None else timing
        self.secret_key = secrets.token_urlsafe(40)
        self.network: Network | None = None
        self.hosts: dict[str, Host] = {}
        self.key = ""  # the tenant's API key (tenant "acme")

    # --- the hosts ------------------------------------------------------------------

    def build_network(self) -> None:
        remove_stale()
        self.network = Network(self.run_id)
        wanted = [
            "client", "lb", "web-1", "web-2", "db", "broker-1", "broker-2", "broker-3",
            "s3", *self.gpu_names, "light", "webhooks", "sweeper-1", "sweeper-2", "hooks",
        ]  # fmt: skip
        for name in wanted:
            link = self.network.add_host(name, ADDRESSES[name])
            data_dir = self.base_dir / name
            data_dir.mkdir(parents=True, exist_ok=True)
            self.hosts[name] = Host(link=link, data_dir=data_dir)

    def host(self, name: str) -> Host:
        return self.hosts[name]

    def chorus_env(self, host: str, **extra: str) -> dict[str, str]:
        """What every Chorus process of the deployment is given, on `host`."""
        keep = {"PATH", "HOME", "LANG", "LC_ALL", "VIRTUAL_ENV", "PYTHONPATH", "TZ"}
        env = {key: value for key, value in os.environ.items() if key in keep}
        data_dir = self.hosts[host].data_dir / "chorus"
        sentinels = ",".join(
            f"{address(name)}:26379" for name in ("broker-1", "broker-2", "broker-3")
        )
        env.update(
            DATABASE_URL=f"postgres://postgres@{address('db')}:{PGBOUNCER_PORT}/chorus",
            CHORUS_DB_TRANSACTION_POOLER="true",
            REDIS_URL=f"sentinel://{sentinels}/0?master={SENTINEL_MASTER}",
            CHORUS_STORAGE="s3",
            S3_ENDPOINT_URL=f"http://{address('s3')}:5000",
            S3_ACCESS_KEY_ID="cluster",
            S3_SECRET_ACCESS_KEY="cluster-secret",
            S3_REGION="us-east-1",
            CHORUS_SECRET_KEY=self.secret_key,
            CHORUS_DATA_DIR=str(data_dir),
            CHORUS_PUBLIC_URL=f"http://{address('lb')}",
            CHORUS_ALLOWED_HOSTS=",".join(address(name) for name in ("lb", "web-1", "web-2")),
            CHORUS_WEBHOOK_ALLOWED_NETWORKS=f"{address('hooks')}/32",
            CHORUS_METRICS_TOKEN=METRICS_TOKEN,
            CHORUS_METRICS_PORT=str(METRICS_PORT),
            CHORUS_LOG_FORMAT="plain",
            CHORUS_FAST_PASSWORD_HASHER="true",
            CHORUS_ENGINE="synthetic",
            CHORUS_ENGINE_OPTIONS=json.dumps({**self.timing, "state_dir": str(data_dir / "gpu")}),
            # Every job is synthesized: a repeated text must not be answered by reuse.
            CHORUS_RESULT_REUSE="false",
            # One tenant drives the whole fleet here: room for every GPU host's streams.
            CHORUS_TENANT_BROKER_SLOTS="16",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    # --- services ---------------------------------------------------------------------

    def start_database(self) -> None:
        db = self.hosts["db"]
        pgdata = db.data_dir / "pgdata"
        socket_dir = db.data_dir / "sock"
        socket_dir.mkdir(exist_ok=True)
        shutil.chown(db.data_dir, "postgres")
        shutil.chown(socket_dir, "postgres")
        db.run(
            [str(PG_BIN / "initdb"), "-D", str(pgdata), "-A", "trust", "-U", "postgres",
             "--no-sync", "-E", "UTF8"],
            user="postgres",
        )  # fmt: skip
        with open(pgdata / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {SUBNET}.0/24 trust\n")
        db.start(
            "postgres",
            [str(PG_BIN / "postgres"), "-D", str(pgdata),
             "-c", f"listen_addresses={db.address}", "-c", f"unix_socket_directories={socket_dir}",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=300", "-c", "timezone=UTC", "-c", "shared_buffers=64MB",
             # A host that vanishes mid-transaction (power lost, link down) sends no
             # FIN: its transaction, and the rows it locked, would wait for TCP to
             # give up (hours). Chorus never idles inside a transaction, so a few
             # seconds idle there means its client is gone (docs/cluster.md).
             "-c", "idle_in_transaction_session_timeout=5s"],
            user="postgres",
        )  # fmt: skip
        wait_until(
            lambda: (
                subprocess.run(
                    [str(PG_BIN / "pg_isready"), "-q", "-h", str(socket_dir)], check=False
                ).returncode
                == 0
            ),
            timeout=30,
            what="PostgreSQL on db",
        )
        db.run([str(PG_BIN / "createdb"), "-h", str(socket_dir), "chorus"], user="postgres")
        ini = db.data_dir / "pgbouncer.ini"
        (db.data_dir / "userlist.txt").write_text('"postgres" ""\n')
        ini.write_text(
            f"""[databases]
chorus = host={db.address} port=5432 dbname=chorus
[pgbouncer]
listen_addr = {db.address}
listen_port = {PGBOUNCER_PORT}
unix_socket_dir =
auth_type = trust
auth_file = {db.data_dir / "userlist.txt"}
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 60
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
idle_transaction_timeout = 5
"""
        )
        shutil.chown(ini, "postgres")
        db.start("pgbouncer", ["/usr/sbin/pgbouncer", str(ini)], user="postgres")
        wait_until(lambda: self.query("SELECT 1", via_pooler=True), timeout=20, what="PgBouncer")

    def start_broker(self) -> None:
        master = self.hosts["broker-1"]
        for name in ("broker-1", "broker-2"):
            host = self.hosts[name]
            argv = [
                "redis-server", "--bind", host.address, "--port", "6379", "--save", "",
                "--appendonly", "no", "--protected-mode", "no", "--dir", str(host.data_dir),
            ]  # fmt: skip
            if name != "broker-1":
                argv += ["--replicaof", master.address, "6379"]
            host.start("redis", argv)
        for name in ("broker-1", "broker-2", "broker-3"):
            host = self.hosts[name]
            conf = host.data_dir / "sentinel.conf"
            conf.write_text(
                f"""port 26379
bind {host.address}
protected-mode no
dir {host.data_dir}
sentinel monitor {SENTINEL_MASTER} {master.address} 6379 2
sentinel down-after-milliseconds {SENTINEL_MASTER} 5000
sentinel failover-timeout {SENTINEL_MASTER} 10000
sentinel parallel-syncs {SENTINEL_MASTER} 1
"""
            )
            host.start("sentinel", ["redis-sentinel", str(conf)])
        wait_until(self._replica_in_sync, timeout=30, what="the Redis replica's first sync")

    def _replica_in_sync(self) -> bool:
        info = self.redis_cli("broker-2", "INFO", "replication")
        return "master_link_status:up" in info

    def redis_master(self) -> str:
        """The broker host the Sentinels name as master now (broker-3's Sentinel)."""
        answer = self.redis_cli(
            "broker-3", "SENTINEL", "get-master-addr-by-name", SENTINEL_MASTER, port=26379
        ).split()
        return next(
            name for name in ("broker-1", "broker-2") if answer and answer[0] == address(name)
        )

    def broker_settled(self) -> bool:
        """A master the Sentinels agree on, and its replica in sync with it."""
        master = self.redis_master()
        replica = "broker-2" if master == "broker-1" else "broker-1"
        return "master_link_status:up" in self.redis_cli(replica, "INFO", "replication")

    def start_object_store(self) -> None:
        s3 = self.hosts["s3"]
        s3.start("moto", [sys.executable, "-m", "moto.server", "-H", s3.address, "-p", "5000"])
        wait_until(
            lambda: httpx.get(f"http://{s3.address}:5000/", timeout=2).status_code < 500,
            timeout=30,
            what="the S3 server",
        )

    def start_hooks(self) -> None:
        hooks = self.hosts["hooks"]
        hooks.start(
            "receiver",
            [sys.executable, "-m", "tests.cluster.receiver", "--host", hooks.address,
             "--port", str(HOOKS_PORT), "--out", str(hooks.data_dir / "received.jsonl")],
            cwd=ROOT,
        )  # fmt: skip
        wait_until(
            lambda: httpx.get(f"http://{hooks.address}:{HOOKS_PORT}/", timeout=2),
            timeout=20,
            what="the webhook receiver",
        )

    def migrate_and_make_tenant(self) -> None:
        """What a deployment's migration Job does, then an operator's first tenant."""
        web = self.hosts["web-1"]
        env = self.chorus_env("web-1")
        web.run([sys.executable, "manage.py", "migrate", "--noinput"], env=env, cwd=ROOT)
        web.run(
            [sys.executable, "manage.py", "shell", "-c",
             "from tenants.models import Plan; Plan.objects.create(name='fleet', "
             "monthly_characters=50_000_000, requests_per_minute=100_000, "
             "max_concurrent_jobs=10_000, voice_slots=100, max_longform_chars=20_000, "
             "allowed_priorities=['high', 'normal', 'low'])"],
            env=env, cwd=ROOT,
        )  # fmt: skip
        self.key = (
            web.run(
                [sys.executable, "manage.py", "create_tenant", "acme", "--plan", "fleet"],
                env=env,
                cwd=ROOT,
            )
            .strip()
            .splitlines()[-1]
        )

    def start_web(self, name: str) -> Service:
        host = self.hosts[name]
        service = host.start(
            "web",
            web_server_argv(host=host.address, port=WEB_PORT),
            env=self.chorus_env(name),
            cwd=ROOT,
        )
        wait_until(
            lambda: (
                httpx.get(f"http://{host.address}:{WEB_PORT}/healthz", timeout=2).status_code == 200
            ),
            timeout=90,
            what=f"the web process on {name}:\n{service.tail()}",
        )
        return service

    def start_lb(self) -> None:
        lb = self.hosts["lb"]
        conf = lb.data_dir / "haproxy.cfg"
        servers = "\n".join(
            f"    server {name} {address(name)}:{WEB_PORT} check" for name in ("web-1", "web-2")
        )
        error_503 = lb.data_dir / "503.http"
        # When no web process answers, the client still gets the API's envelope.
        error_503.write_text(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            "Retry-After: 2\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
            '{"error": {"code": "service_unavailable", "message": "No web server is '
            'answering; retry shortly.", "details": {}}}\n'
        )
        conf.write_text(
            f"""global
    maxconn 4000
defaults
    mode http
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout queue 10s
    retries 3
    option redispatch
    errorfile 503 {error_503}
frontend api
    bind {lb.address}:80
    default_backend web
backend web
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    # One request per server connection: a web process that stops closes no
    # connection under a request on its way (a rolling restart loses none).
    option http-server-close
    retry-on conn-failure empty-response response-timeout
    timeout check 3s
    default-server inter 1s fall 3 rise 2
{servers}
"""
        )
        lb.start("haproxy", ["/usr/sbin/haproxy", "-f", str(conf), "-db"])
        wait_until(
            lambda: httpx.get(f"http://{lb.address}/healthz", timeout=2).status_code == 200,
            timeout=30,
            what="HAProxy",
        )

    def start_gpu_worker(self, name: str, *, timing: dict[str, Any] | None = None) -> Service:
        """`timing`: the emulated device's, for this worker only."""
        host = self.hosts[name]
        env = self.chorus_env(name)
        if timing is not None:
            state_dir = str(host.data_dir / "chorus" / "gpu")
            env["CHORUS_ENGINE_OPTIONS"] = json.dumps({**timing, "state_dir": state_dir})
        service = host.start("worker", worker_argv(hostname="gpu@%h"), env=env, cwd=ROOT)
        wait_until(
            lambda: "ready." in service.tail(200),
            timeout=90,
            what=f"the worker on {name}:\n{service.tail()}",
        )
        return service

    def start_light_worker(self) -> Service:
        host = self.hosts["light"]
        service = host.start(
            "worker", light_worker_argv(hostname="light@%h"), env=self.chorus_env("light"), cwd=ROOT
        )
        wait_until(lambda: "ready." in service.tail(200), timeout=90, what="the light worker")
        return service

    def start_webhook_worker(self) -> Service:
        """Deliveries run on workers of their own (a stalled receiver must not
        hold the threads that split long texts): here a host of their own."""
        host = self.hosts["webhooks"]
        argv = light_worker_argv(queue=settings.WEBHOOK_QUEUE, hostname="webhooks@%h")
        service = host.start("worker", argv, env=self.chorus_env("webhooks"), cwd=ROOT)
        wait_until(lambda: "ready." in service.tail(200), timeout=90, what="the webhook worker")
        return service

    def start_sweeper(self, name: str) -> Service:
        return self.hosts[name].start(
            "sweeper",
            [sys.executable, "manage.py", "sweeper", "--interval", "2"],
            env=self.chorus_env(name),
            cwd=ROOT,
        )

    def start_services(self) -> None:
        """Everything, in the order a deployment comes up (the network built first)."""
        started = time.monotonic()
        self.start_database()
        self.start_broker()
        self.start_object_store()
        self.start_hooks()
        self.migrate_and_make_tenant()
        for name in ("web-1", "web-2"):
            self.start_web(name)
        self.start_lb()
        for name in self.gpu_names:
            self.start_gpu_worker(name)
        self.start_light_worker()
        self.start_webhook_worker()
        for name in ("sweeper-1", "sweeper-2"):
            self.start_sweeper(name)
        print(f"cluster up in {time.monotonic() - started:.1f} s", file=sys.stderr)

    def close(self, *, keep_logs: Path | None = None) -> None:
        for host in self.hosts.values():
            host.stop_all()
        if self.network is not None:
            self.network.teardown()
        if keep_logs is not None:
            for host in self.hosts.values():
                logs = host.data_dir / "logs"
                if logs.exists():
                    shutil.copytree(logs, keep_logs / host.name, dirs_exist_ok=True)
        shutil.rmtree(self.base_dir, ignore_errors=True)

    # --- looking in -----------------------------------------------------------------

    def api(self, timeout: float = 60) -> httpx.Client:
        """The tenant's client, through the load balancer."""
        return httpx.Client(
            base_url=f"http://{address('lb')}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=timeout,
        )

    def query(
        self, sql: str, params: tuple[Any, ...] = (), *, via_pooler: bool = False
    ) -> list[Any]:
        import psycopg

        port = PGBOUNCER_PORT if via_pooler else 5432
        with psycopg.connect(
            f"host={address('db')} port={port} dbname=chorus user=postgres", connect_timeout=3
        ) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def redis_cli(self, host: str, *args: str, port: int = 6379) -> str:
        return subprocess.run(
            ["redis-cli", "-h", address(host), "-p", str(port), *args],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout

    def scrape(self, host: str, port: int) -> str:
        response = httpx.get(
            f"http://{address(host)}:{port}/metrics",
            headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
            timeout=5,
        )
        response.raise_for_status()
        return response.text


@contextmanager
def running_cluster(
    base_dir: Path, *, keep_logs_if: Callable[[], bool] = lambda: False, **options: Any
) -> Iterator[Cluster]:
    """A started cluster, this thread inside the `client` host; torn down after,
    however the body ends. Its hosts' logs are kept under var/cluster-logs when
    it fails, or when `keep_logs_if()` says so (a test failed)."""
    if base_dir.exists():
        shutil.rmtree(base_dir)
    base_dir.mkdir(parents=True, mode=0o755)
    cluster = Cluster(base_dir, **options)
    failed = True
    try:
        cluster.build_network()
        with entered(cluster.hosts["client"].link.namespace):
            cluster.start_services()
            yield cluster
        failed = False
    finally:
        keep = ROOT / "var" / "cluster-logs" if failed or keep_logs_if() else None
        cluster.close(keep_logs=keep)
