"""A worker process's engine, prompt cache, stream limits and heartbeat: set up
once, at process start, never per task.

A GPU worker is one process with one loaded engine that runs several jobs at
once as threads (Celery's threads pool), as many as its stream limits allow
(`synthesis.stream_limits`, `synthesis.lanes`). A prefork pool (`--pool
prefork`) still works: each child loads its own engine and runs one job.

A light worker (`light_worker_argv`) consumes one queue of work that needs no
GPU: `light` (splitting and joining long texts, building archives) or `webhooks`
(deliveries), each its own processes. It loads no engine, sizes no streams and
writes no heartbeat row, so it neither takes a GPU's memory nor counts as
synthesis capacity; its pool is a fixed number of threads
(`CHORUS_LIGHT_WORKER_CONCURRENCY`, `CHORUS_WEBHOOK_WORKER_CONCURRENCY`).

On SIGTERM a GPU worker drains (`synthesis.drain`): nothing new starts, its
running jobs get `CHORUS_WORKER_DRAIN_S` to finish, the rest go back to their
queues. A light worker keeps Celery's plain warm shutdown.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from celery.concurrency import get_implementation
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
    worker_shutting_down,
)
from django.conf import settings

from chorus.db import recycle_connections
from synthesis.audio_out import warm_up_output
from synthesis.calibration.services import worker_limits_record
from synthesis.drain import drain_report, drain_start
from synthesis.engines import build_engine, load_engine
from synthesis.engines.base import Engine
from synthesis.heartbeat import Heartbeat, report_failed_start
from synthesis.services.recovery import jobs_recover_on_start
from synthesis.stream_limits import LimitsChoice, StreamLimits, limits_without_engine
from synthesis.voice_cache import VoicePromptCache

log = logging.getLogger(__name__)

_engine: Engine | None = None
_heartbeat: Heartbeat | None = None
_second_look: threading.Timer | None = None  # for lost messages (`jobs_recover_on_start`)
_limits: StreamLimits | None = None
_light = False  # this process is a light worker (or a pool child of one)
# A prefork child stops its worker by signalling the parent; a threaded worker
# is the main process itself.
_in_pool_child = False
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


def process_stream_limits() -> StreamLimits | None:
    """This worker's stream limits; None where a process runs one job at a time."""
    return _limits


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# How long a worker process keeps a database connection (see `_own_connections`).
CONNECTION_MAX_AGE_S = 300


def _own_connections() -> None:
    """A worker keeps one connection per thread (a stream or its heartbeat) rather
    than borrowing from the web tier's pool. A pool would not survive anyway:
    Celery's Django fixup closes pools at process start, racing the heartbeat
    thread's first beat."""
    database = settings.DATABASES["default"]  # the dict every connection object reads
    if database.get("OPTIONS", {}).pop("pool", None) is not None:
        database["CONN_MAX_AGE"] = CONNECTION_MAX_AGE_S
    # Checked between jobs without a query (`recycle_connections`), not by a
    # `SELECT 1` before each job's claim.
    database["CONN_HEALTH_CHECKS"] = False


@worker_init.connect
def _start_threaded_worker(sender: Any, **kwargs: Any) -> None:
    """Sent before the pool exists: a threads pool gets one thread per stream the
    device may run, and the engine is loaded before any message is taken."""
    global _limits, _light
    queues = _consumed_queues(sender.app)
    if is_light_worker(queues):
        _light = True
        _own_connections()
        log.info("light worker on %s: no engine loaded", ",".join(queues))
        return
    if issubclass(get_implementation(sender.pool_cls), PreforkPool):
        return  # each pool child loads its own engine (`_start_pool_child`)
    try:
        choice = (limits_without_engine() or _calibrated_choice()).serving(queues)
    except ValueError as exc:  # a bad CHORUS_WORKER_STREAMS or device profile
        log.critical("cannot size this worker's streams: %s", exc)
        report_failed_start(name=worker_name(), engine=settings.ENGINE, error=str(exc))
        stop_worker()
    _limits = choice.limits
    sender.concurrency = _limits.high
    _start_process(capacity=_limits.high, node=sender.hostname, queues=queues)
    worker_limits_record(
        worker=worker_name(),
        limits=choice.limits,
        source=choice.source,
        profile_name=choice.profile_name,
        profile_key=choice.profile_key,
    )
    log.info(
        "stream limits %s (%s%s)",
        choice.limits.as_text(),
        choice.source,
        f" {choice.profile_name}" if choice.profile_name else "",
    )


def _calibrated_choice() -> LimitsChoice:
    """`CHORUS_DEVICE_PROFILE=auto` on an engine the device limits: the card's
    stored profile, or measured now with this process's engine (see
    `synthesis.calibration`); its failure stops the worker as a failed load does."""
    global _engine
    from synthesis.calibration.choose import calibrated_limits

    try:
        engine = build_engine(settings.ENGINE, settings.ENGINE_OPTIONS)
        choice = calibrated_limits(engine, worker=worker_name())
        engine.load()  # already loaded where it calibrated
    except Exception as exc:
        log.critical("cannot calibrate this worker's card; stopping", exc_info=True)
        report_failed_start(name=worker_name(), engine=settings.ENGINE, error=str(exc))
        stop_worker()
    _engine = engine
    return choice


@worker_init.connect
def _no_heartbeat_events_unless_monitored(sender: Any, **kwargs: Any) -> None:
    """Celery's own heartbeat is an event for monitors (Flower), published through
    the broker every two seconds; with events off nothing reads it (a worker's
    liveness is its heartbeat row), so it is not sent. Decided here, by the
    worker's own settings, not on its command line: that is built elsewhere."""
    if not settings.CELERY_EVENTS:
        sender.options["without_heartbeat"] = True


@worker_process_init.connect
def _start_pool_child(**kwargs: Any) -> None:
    global _in_pool_child
    _in_pool_child = True
    if _light:  # forked from a light worker's main process
        _own_connections()
        return
    _start_process(capacity=1)


def _consumed_queues(app: Any) -> list[str]:
    """The queues this worker takes, in its order (`-Q`)."""
    return list(app.amqp.queues.consume_from or app.amqp.queues)


def is_light_worker(queues: Sequence[str]) -> bool:
    """A worker that takes no synthesis queue has no use for an engine."""
    return bool(queues) and not set(queues) & set(settings.SYNTH_QUEUES)


def is_light_process() -> bool:
    return _light


def _start_process(*, capacity: int, node: str = "", queues: Sequence[str] = ()) -> None:
    global _heartbeat, _second_look
    _own_connections()
    try:
        engine = process_engine()
    except Exception as exc:
        # Celery only logs exceptions from these signals and would go on taking
        # jobs it cannot run. Stop the whole worker instead: a reserved message
        # is unacknowledged (late ack) and goes back to the queue.
        log.critical("cannot load engine %r; stopping this worker", settings.ENGINE, exc_info=True)
        report_failed_start(name=worker_name(), engine=settings.ENGINE, error=str(exc))
        stop_worker()
    warm_up_output(engine.sample_rate)
    # Jobs a dead predecessor on this host left go back to their queue now, not
    # when the sweeper notices its heartbeat stopped.
    _second_look = jobs_recover_on_start(host=socket.gethostname())
    _heartbeat = Heartbeat(
        name=worker_name(),
        info=engine.info(),
        slots=capacity,
        limits=_limits,
        node=node,
        queues=queues,
    )
    _heartbeat.start()


@task_prerun.connect
@task_postrun.connect
def _recycle_connection(**kwargs: Any) -> None:
    """What Django does around a request: close a connection that is past its age
    or broken, and keep the others. See `chorus.celery`."""
    recycle_connections()


def stop_worker() -> NoReturn:
    """Ask the worker's main process for a warm shutdown, then leave."""
    if _in_pool_child:
        os.kill(os.getppid(), signal.SIGTERM)
    os._exit(1)


@worker_shutting_down.connect
def _drain_on_warm_shutdown(how: str = "", **kwargs: Any) -> None:
    """SIGTERM (a warm shutdown) to a GPU worker: drain (`synthesis.drain`). A
    light worker has no heartbeat and keeps Celery's plain warm shutdown."""
    if how == "Warm" and _heartbeat is not None and not _in_pool_child:
        drain_start(worker=worker_name(), heartbeat=_heartbeat, drain_s=settings.WORKER_DRAIN_S)


@worker_process_shutdown.connect
@worker_shutdown.connect
def _close_engine(**kwargs: Any) -> None:
    global _engine
    drain_report()  # the pool has stopped: every job has ended or was handed back
    if _second_look is not None:
        _second_look.cancel()  # no publish from a worker on its way out
    if _heartbeat is not None:
        _heartbeat.stop()
    if _engine is not None:
        _engine.close()
        _engine = None


def worker_argv(
    *, queues: tuple[str, ...] | None = None, hostname: str = "", loglevel: str = "INFO"
) -> list[str]:
    """The command that starts one worker process: one engine, strict queue order,
    one thread per stream its device may run (set by the worker itself)."""
    return _celery_worker_argv(
        queues=",".join(queues or settings.SYNTH_QUEUES), hostname=hostname, loglevel=loglevel
    )


def light_worker_argv(*, queue: str = "", hostname: str = "", loglevel: str = "INFO") -> list[str]:
    """The command that starts one light worker: one queue only, a pool of threads
    (its tasks wait on the network and the disk, not the CPU), no engine.

    `queue` is the `light` queue (splitting and joining long texts, archives) or
    the `webhooks` queue (deliveries), each on worker processes of its own. Not one
    worker taking both: a Celery worker has one pool for all its queues, so eight
    stalled receivers would hold every thread a split or join needs (and a
    per-queue prefetch does not change who gets the threads)."""
    queue = queue or settings.LIGHT_QUEUE
    concurrency = {
        settings.LIGHT_QUEUE: settings.LIGHT_WORKER_CONCURRENCY,
        settings.WEBHOOK_QUEUE: settings.WEBHOOK_WORKER_CONCURRENCY,
    }[queue]
    return _celery_worker_argv(
        queues=queue, concurrency=concurrency, hostname=hostname, loglevel=loglevel
    )


def _celery_worker_argv(
    *, queues: str, hostname: str, loglevel: str, concurrency: int | None = None
) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "chorus", "worker", "-Q", queues]
    argv += ["--pool", "threads"]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    # Nothing here uses what mingle and gossip synchronise between workers;
    # without them a worker starts a second sooner and spends no CPU on them.
    argv += ["--without-mingle", "--without-gossip", "--loglevel", loglevel]
    return [*argv, "--hostname", hostname] if hostname else argv
