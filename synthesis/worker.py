"""A worker process's engine, prompt cache and heartbeat: set up once, at
process start, never per task."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from typing import Any, NoReturn

from celery.signals import task_postrun, task_prerun, worker_process_init, worker_process_shutdown
from django.conf import settings
from django.db import close_old_connections

from synthesis.engines import load_engine
from synthesis.engines.base import Engine
from synthesis.heartbeat import Heartbeat, report_failed_start
from synthesis.voice_cache import VoicePromptCache

log = logging.getLogger(__name__)

_engine: Engine | None = None
_heartbeat: Heartbeat | None = None
prompt_cache = VoicePromptCache(max_items=settings.VOICE_PROMPT_CACHE_SIZE)


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


def process_heartbeat() -> Heartbeat | None:
    return _heartbeat


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# How long a worker process keeps a database connection (see `_own_connections`).
CONNECTION_MAX_AGE_S = 300


def _own_connections() -> None:
    """A worker process runs one task at a time (plus its heartbeat thread), so it
    keeps one connection per thread rather than borrowing from the web tier's
    pool. A pool would not survive anyway: Celery's Django fixup closes pools at
    process start, racing the heartbeat thread's first beat."""
    database = settings.DATABASES["default"]  # the dict every connection object reads
    if database.get("OPTIONS", {}).pop("pool", None) is not None:
        database["CONN_MAX_AGE"] = CONNECTION_MAX_AGE_S


@worker_process_init.connect
def _start_process(**kwargs: Any) -> None:
    global _heartbeat
    _own_connections()
    try:
        engine = process_engine()
    except Exception as exc:
        # Celery only logs exceptions from this signal and would go on taking
        # jobs it cannot run. Stop the whole worker instead: its reserved
        # message is unacknowledged (late ack) and goes back to the queue.
        log.critical("cannot load engine %r; stopping this worker", settings.ENGINE, exc_info=True)
        report_failed_start(name=worker_name(), engine=settings.ENGINE, error=str(exc))
        stop_worker()
    slots = int(str(settings.ENGINE_OPTIONS.get("slots", 1) or 1))
    _heartbeat = Heartbeat(name=worker_name(), info=engine.info(), slots=slots)
    _heartbeat.start()


@task_prerun.connect
@task_postrun.connect
def _recycle_connection(**kwargs: Any) -> None:
    """What Django does around a request: close a connection that is past its age
    or broken, and keep the others. See `chorus.celery`."""
    close_old_connections()


def stop_worker() -> NoReturn:
    """Ask the worker's main process for a warm shutdown, then leave."""
    os.kill(os.getppid(), signal.SIGTERM)
    os._exit(1)


@worker_process_shutdown.connect
def _close_engine(**kwargs: Any) -> None:
    global _engine
    if _heartbeat is not None:
        _heartbeat.stop()
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
