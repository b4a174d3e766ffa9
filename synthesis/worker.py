"""The engine of this worker process: loaded once, at process start, never per task."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Any, NoReturn

from celery.signals import worker_process_init, worker_process_shutdown
from django.conf import settings

from synthesis.engines import load_engine
from synthesis.engines.base import Engine

log = logging.getLogger(__name__)

_engine: Engine | None = None


def process_engine() -> Engine:
    """This process's engine, loading it if the start-up hook has not run (eager tools)."""
    global _engine
    if _engine is None:
        _engine = load_engine(settings.ENGINE, settings.ENGINE_OPTIONS)
        info = _engine.info()
        log.info(
            "engine %s loaded on %s (%d Hz, %.1f MiB)",
            info.name,
            info.device,
            info.sample_rate,
            info.memory_bytes / 2**20,
        )
    return _engine


def worker_name() -> str:
    return socket.gethostname()


@worker_process_init.connect
def _load_engine_at_start(**kwargs: Any) -> None:
    try:
        process_engine()
    except Exception:
        # Celery only logs exceptions from this signal and would go on taking
        # jobs it cannot run. Stop the whole worker instead: its reserved
        # message is unacknowledged (late ack) and goes back to the queue.
        log.critical("cannot load engine %r; stopping this worker", settings.ENGINE, exc_info=True)
        stop_worker()


def stop_worker() -> NoReturn:
    """Ask the worker's main process for a warm shutdown, then leave."""
    os.kill(os.getppid(), signal.SIGTERM)
    os._exit(1)


@worker_process_shutdown.connect
def _close_engine(**kwargs: Any) -> None:
    global _engine
    if _engine is not None:
        _engine.close()
        _engine = None


def worker_argv(
    *, queues: tuple[str, ...] | None = None, hostname: str = "", loglevel: str = "INFO"
) -> list[str]:
    """The command that starts one worker process: one engine, strict queue order."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "chorus",
        "worker",
        "-Q",
        ",".join(queues or settings.SYNTH_QUEUES),
        "--concurrency",
        "1",
        "--loglevel",
        loglevel,
    ]
    return [*argv, "--hostname", hostname] if hostname else argv
