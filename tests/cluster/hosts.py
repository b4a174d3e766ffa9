"""A host of the test cluster: a network namespace with a hostname, a data folder
of its own and the processes it runs.

Each process starts in the host's network namespace and in a UTS namespace of
its own whose hostname is the host's name, so `socket.gethostname()` (worker
names, metrics files, "is this worker of my host") reads as on a real machine.
Nothing is shared between hosts but the switch: each host's processes get their
own data folder, and reach the database, broker and object store only over the
network.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.netns import Link

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    # Where this process's output starts in its log: a restarted service appends
    # to the same file, and a wait for "ready." must not find its predecessor's.
    log_start: int = 0

    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`: a supervisor's stop."""
        self.signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log, "rb") as log:
                log.seek(self.log_start)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Host:
    link: Link
    data_dir: Path
    services: dict[str, Service] = field(default_factory=dict)
    clock_offset_s: float = 0.0  # this host's clock runs ahead by this much (faketime)

    @property
    def name(self) -> str:
        return self.link.host

    @property
    def address(self) -> str:
        return self.link.address

    def command(self, argv: Sequence[str], *, user: str | None = None) -> list[str]:
        """`argv` as run on this host (as `user`, when given)."""
        as_user = ["runuser", "-u", user, "--"] if user else []
        return [
            "ip", "netns", "exec", self.link.namespace,
            "unshare", "--uts", "--",
            "sh", "-c", 'hostname "$0" && exec "$@"', self.name,
            *as_user, *argv,
        ]  # fmt: skip

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: Path | None = None,
    ) -> Service:
        """Start `argv` on this host; its output goes to logs/<name>.log."""
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        full_env = dict(env if env is not None else os.environ)
        if self.clock_offset_s:
            full_env.update(
                LD_PRELOAD=LIBFAKETIME,
                # A constant offset moves the monotonic clock too, which leaves
                # durations true (DONT_FAKE_MONOTONIC=1 would make libfaketime
                # answer Python's absolute-deadline sleeps with EINVAL).
                FAKETIME=f"{self.clock_offset_s:+g}s",
            )
        command = self.command(argv, user=user)
        with open(log, "ab") as out:
            log_start = out.tell()
            process = subprocess.Popen(
                command, env=full_env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd
            )
        service = Service(name, process, log, log_start)
        self.services[name] = service
        return service

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        user: str | None = None,
        cwd: Path | None = None,
        timeout: float = 120,
    ) -> str:
        """Run a command on this host to its end; its output, or an error with it."""
        command = self.command(argv, user=user)
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, cwd=cwd, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: {' '.join(argv)} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def stop_all(self) -> None:
        for service in self.services.values():
            service.stop(timeout=10)


def wait_until(predicate, *, timeout: float, what: str, interval: float = 0.2) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception as exc:  # not up yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out waiting for {what}" + (f": {last_error!r}" if last_error else "")
    )
