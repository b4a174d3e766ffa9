"""Several web processes on one port, each with a listening socket of its own.

uvicorn's `--workers N` binds one socket and hands it to every process. They all
wait on it, and the first to wake accepts every connection that is pending (an
asyncio server accepts in a loop until the backlog is empty): 32 keep-alive
connections opened together landed on one process while the other idled, and
a proxy's keep-alive pool in front of the web tier does the same. One core then
did the work of two (`bench/admission.py`).

Here each process binds its own socket to the port with SO_REUSEPORT, and the
kernel spreads new connections over the sockets by a hash of their addresses.
Linux lets only sockets of the same user join such a group, so another user's
program cannot take a share of the port. The supervisor holds the port with a
bound socket that never listens (a socket receives connections only once it
listens): a bind error shows before any process starts, and the port stays ours
while a process is replaced.

The supervisor replaces a process that dies (one that cannot start stops it
all, as uvicorn does), replaces them one by one on SIGHUP (the new one listens
before the old one stops, so no connection is refused), and on SIGTERM or SIGINT
asks each to finish its requests and waits for them. A connection still in a
dying process's queue, not yet accepted, is reset: the client retries it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

logger = logging.getLogger("uvicorn.error")

# How long a stopping process may take to finish its requests before it is killed.
STOP_GRACE_S = 30.0
# A process that dies this soon after starting is restarted only after this long,
# so that a crash at every start does not spin.
RESTART_BACKOFF_S = 1.0
# How long a replacement has to start serving during a rolling restart.
READY_TIMEOUT_S = 60.0

_spawn = multiprocessing.get_context("spawn")  # a fresh interpreter, as uvicorn's own


def port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) in the port's SO_REUSEPORT group."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto TCP, so that asyncio sets TCP_NODELAY on the connections it accepts
    # (it checks the proto; uvicorn's own socket has 0: see chorus.web_server).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def serve_one(options: dict[str, Any], port: int, ready: Connection) -> None:
    """A web process: bind its own socket, then serve until told to stop."""
    config = uvicorn.Config(**options, port=port)
    try:
        sock = port_socket(config.host, port)
    except OSError as exc:
        logger.error("cannot listen on %s:%s: %s", config.host, port, exc)
        sys.exit(STARTUP_FAILURE)
    server = uvicorn.Server(config)
    supervisor = os.getppid()

    def tell_when_serving_then_watch_the_supervisor() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            # A supervisor gone while this process started: no one to tell, and
            # the watch below stops this process.
            with contextlib.suppress(OSError):
                ready.send(True)
        # A supervisor killed outright (SIGKILL, OOM) cannot stop its processes:
        # they stop themselves rather than serve on, orphaned, holding the port.
        while not server.should_exit:
            if os.getppid() != supervisor:
                logger.warning("the web supervisor is gone; stopping")
                server.should_exit = True
            time.sleep(1.0)

    threading.Thread(target=tell_when_serving_then_watch_the_supervisor, daemon=True).start()
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(STARTUP_FAILURE)


@dataclass
class _Child:
    process: BaseProcess
    ready: Connection  # the process writes to it once it serves
    started_at: float
    served: bool = False

    def has_served(self, wait_s: float = 0.0) -> bool:
        """Whether the process has said it serves (waiting up to wait_s for it)."""
        if not self.served:
            # poll() is also true at end of file (it died without saying so):
            # recv() tells them apart.
            with contextlib.suppress(OSError, EOFError):
                self.served = bool(self.ready.poll(wait_s) and self.ready.recv())
        return self.served


class WebSupervisor:
    def __init__(self, options: dict[str, Any], *, workers: int) -> None:
        self.options = options
        self.workers = workers
        self.children: list[_Child] = []
        self.stop = threading.Event()
        self.signals: list[int] = []

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit status for the command."""
        host, port = self.options["host"], int(self.options.pop("port"))
        try:
            holder = port_socket(host, port)
        except OSError as exc:
            logger.error("cannot listen on %s:%s: %s", host, port, exc)
            return STARTUP_FAILURE
        self.port = holder.getsockname()[1]  # port 0 picks one, the same for all
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        logger.info(
            "serving on http://%s:%s with %s processes, one socket each (SO_REUSEPORT)",
            host,
            self.port,
            self.workers,
        )
        status = 0
        try:
            self.children = [self._start() for _ in range(self.workers)]
            while not self.stop.wait(0.5):
                self._handle_signals()
                if not self._replace_dead():
                    status = STARTUP_FAILURE
                    break
        finally:
            for child in self.children:
                self._end(child)
            holder.close()
        return status

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)
        if signum != signal.SIGHUP:
            self.stop.set()

    def _handle_signals(self) -> None:
        while self.signals:
            if self.signals.pop(0) == signal.SIGHUP and not self.stop.is_set():
                logger.info("SIGHUP: replacing the web processes one by one")
                self._restart_all()

    def _start(self) -> _Child:
        # A pipe, not an Event: an Event is a named semaphore, and the helper
        # process that cleans those up dies with the supervisor's process group.
        ready, told = _spawn.Pipe(duplex=False)
        process = _spawn.Process(
            target=serve_one, args=(dict(self.options), self.port, told), daemon=False
        )
        process.start()
        told.close()
        return _Child(process=process, ready=ready, started_at=time.monotonic())

    def _replace_dead(self) -> bool:
        """Start a new process for each that died; False if one could not start."""
        for index, child in enumerate(self.children):
            if child.process.is_alive():
                continue
            child.process.join()
            if child.process.exitcode == STARTUP_FAILURE and not child.has_served():
                logger.error("web process %s could not start; stopping", child.process.pid)
                return False
            logger.warning(
                "web process %s died (exit %s); starting another",
                child.process.pid,
                child.process.exitcode,
            )
            if time.monotonic() - child.started_at < RESTART_BACKOFF_S:
                time.sleep(RESTART_BACKOFF_S)
            self.children[index] = self._start()
        return True

    def _restart_all(self) -> None:
        for index, old in enumerate(self.children):
            new = self._start()
            if not new.has_served(READY_TIMEOUT_S):
                logger.error("a new web process did not start; keeping the old ones")
                self._end(new)
                return
            self.children[index] = new
            self._end(old)

    def _end(self, child: _Child) -> None:
        """Ask a process to finish its requests and exit; kill it past the grace."""
        if child.process.is_alive() and child.process.pid is not None:
            os.kill(child.process.pid, signal.SIGTERM)
        child.process.join(STOP_GRACE_S)
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
        child.ready.close()
