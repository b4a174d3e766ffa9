"""Prometheus metrics: the counters and histograms, and the hooks that feed them.

Every process of the stack (uvicorn workers, Celery workers, the sweeper) writes
its own files in one folder (`PROMETHEUS_MULTIPROC_DIR`, by default
`CHORUS_DATA_DIR/metrics`), and `/metrics` on any web process adds them up
(prometheus-client's multiprocess mode). Files are named after host and pid, not
pid alone, so processes of several containers can share the folder without two
of them writing one file. When a process starts, the files of the processes of
its host that exited are folded into one archive per type: their counts stay,
their number does not grow with every restart.

What is read at scrape time (queue depth, workers, waiting jobs) is not here but
in `synthesis.metrics`. Labels are bounded: route names, priorities, statuses and
error codes, never tenants, ids or paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from django.conf import settings
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, values
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from chorus.processes import process_alive

METRICS_DIR = Path(settings.METRICS_DIR)
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())


def _process_identifier() -> str:
    # Read at every write: a forked child (prefork pool) gets files of its own.
    return f"{_HOST}-{os.getpid()}"


@contextlib.contextmanager
def files_locked(*, exclusive: bool) -> Iterator[None]:
    """Scrapes read the folder under a shared lock; compaction rewrites it under
    an exclusive one, so no scrape sees a process's counts twice or not at all."""
    with open(METRICS_DIR / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


_OWN_FILE = re.compile(rf"_({re.escape(_HOST)}-(\d+))\.db$")

# prometheus-client creates a process's file empty and then sizes it; a process
# killed between the two (SIGKILL while a worker starts) leaves a file that holds
# no counts and that prometheus-client cannot read. Such files are passed over.
_HEADER_BYTES = 8


def _holds_counts(path: Path) -> bool:
    try:
        return path.stat().st_size >= _HEADER_BYTES
    except FileNotFoundError:
        return False


class ProcessFilesCollector(MultiProcessCollector):
    """Every process's files, added up, except the empty ones of processes
    killed while they created them: one such file must not fail every scrape."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, path=str(METRICS_DIR))

    def collect(self) -> Iterable[Metric]:
        files = [str(path) for path in METRICS_DIR.glob("*.db") if _holds_counts(path)]
        return self.merge(files, accumulate=True)


def compact_dead_processes() -> int:
    """Fold the counters and histograms of this host's exited processes into one
    archive file per type (their counts must stay: counters never go down), and
    drop their in-progress gauges. Without it every restart would leave its files
    behind and each scrape would read more of them. Returns how many went."""
    with files_locked(exclusive=True):
        dead = set()
        for path in METRICS_DIR.glob("*.db"):
            found = _OWN_FILE.search(path.name)
            if found and int(found[2]) != os.getpid() and not process_alive(int(found[2])):
                dead.add(found[1])
        for identifier in dead:
            mark_process_dead(identifier, str(METRICS_DIR))
        for kind in ("counter", "histogram"):
            files = []
            for path in (METRICS_DIR / f"{kind}_{i}.db" for i in sorted(dead)):
                if _holds_counts(path):
                    files.append(path)
                elif path.exists():  # empty: no counts to keep
                    path.unlink()
            if files:
                _fold(files, into=METRICS_DIR / f"{kind}_{_HOST}-archive.db")
        return len(dead)


def _fold(files: list[Path], *, into: Path) -> None:
    sources = [into, *files] if into.exists() else files
    # Not added up: written back as stored (histogram buckets one by one).
    merged = MultiProcessCollector.merge([str(path) for path in sources], accumulate=False)
    staging = into.with_suffix(".tmp")  # not *.db: scrapes never read it
    staging.unlink(missing_ok=True)
    out = MmapedDict(str(staging))
    try:
        for metric in merged:
            for sample in metric.samples:
                key = mmap_key(
                    metric.name,
                    sample.name,
                    list(sample.labels),
                    list(sample.labels.values()),
                    metric.documentation,
                )
                out.write_value(key, sample.value, 0.0)
    finally:
        out.close()
    os.replace(staging, into)
    for path in files:
        path.unlink()


METRICS_DIR.mkdir(parents=True, exist_ok=True)
# prometheus-client reads the folder from the environment when it opens a file.
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(METRICS_DIR)
values.ValueClass = values.MultiProcessValue(_process_identifier)
compact_dead_processes()

# --- web ------------------------------------------------------------------------

HTTP_REQUESTS = Counter(
    "chorus_http_requests",
    "HTTP requests answered, by route (URL pattern name), method and status.",
    ["route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "chorus_http_request_duration_seconds",
    "Time to the response's headers (a streamed body goes on after), by route.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
HTTP_IN_PROGRESS = Gauge(
    "chorus_http_requests_in_progress",
    "Requests being answered now, over all live web processes.",
    multiprocess_mode="livesum",
)
JOBS_ADMITTED = Counter(
    "chorus_jobs_admitted",
    "Speech jobs accepted at submit, by priority.",
    ["priority"],
)
JOBS_REFUSED = Counter(
    "chorus_jobs_refused",
    "Speech submissions answered with an error, by its code.",
    ["code"],
)

# --- jobs -------------------------------------------------------------------------

JOBS_FINISHED = Counter(
    "chorus_jobs_finished",
    "Jobs that reached an end state, by priority, status and error code.",
    ["priority", "status", "code"],
)
JOBS_REQUEUED = Counter(
    "chorus_jobs_requeued",
    "Attempts put back in their queue (storage retry, worker lost, stuck), by reason.",
    ["priority", "reason"],
)
QUEUE_WAIT = Histogram(
    "chorus_job_queue_wait_seconds",
    "Submit to the first attempt's start, by priority.",
    ["priority"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
FIRST_AUDIO = Histogram(
    "chorus_job_first_audio_seconds",
    "Submit to the first audio chunk, by priority.",
    ["priority"],
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 120),
)
TOTAL = Histogram(
    "chorus_job_total_seconds",
    "Submit to success (stored and charged), by priority.",
    ["priority"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600),
)

# --- storage and the sweeper --------------------------------------------------------

STORAGE_ERRORS = Counter(
    "chorus_storage_errors",
    "Storage operations that failed (the object store unreachable or refusing).",
    ["operation"],
)
SWEEPS = Counter("chorus_sweeps", "Sweeper passes completed.")
SWEEPER_ACTIONS = Counter(
    "chorus_sweeper_actions",
    "Repairs the sweeper made, by kind (published, released, aged, requeued, ...).",
    ["action"],
)


# --- hooks: one call where the event happens ------------------------------------------


def observe_request(*, route: str, method: str, status: int, seconds: float) -> None:
    labels = (route, method, str(status))
    HTTP_REQUESTS.labels(*labels).inc()
    HTTP_DURATION.labels(*labels).observe(seconds)


def observe_job_admitted(*, priority: str) -> None:
    JOBS_ADMITTED.labels(priority).inc()


def observe_job_refused(*, code: str) -> None:
    JOBS_REFUSED.labels(code).inc()


def observe_job_started(*, priority: str, attempt: int, waited_s: float) -> None:
    if attempt == 1:  # a retry's wait is not the client's wait in line
        QUEUE_WAIT.labels(priority).observe(max(waited_s, 0.0))


def observe_first_audio(*, priority: str, seconds: float) -> None:
    FIRST_AUDIO.labels(priority).observe(max(seconds, 0.0))


def observe_job_finished(
    *, priority: str, status: str, code: str = "", total_s: float | None = None
) -> None:
    JOBS_FINISHED.labels(priority, status, code).inc()
    if status == "succeeded" and total_s is not None:
        TOTAL.labels(priority).observe(max(total_s, 0.0))


def observe_job_requeued(*, priority: str, reason: str) -> None:
    JOBS_REQUEUED.labels(priority, reason).inc()


def observe_storage_error(*, operation: str) -> None:
    STORAGE_ERRORS.labels(operation).inc()


def observe_sweep(actions: dict[str, int]) -> None:
    SWEEPS.inc()
    for action, count in actions.items():
        if count:
            SWEEPER_ACTIONS.labels(action).inc(count)
