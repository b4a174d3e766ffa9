"""`make test` runs the suite in three processes (pytest-xdist, `-n 3`): each gets a
Redis database and a data folder (and so a SQLite file and a metrics folder) of
its own, so that one's workers never take the other's jobs and neither clears or
counts another's keys and files. PostgreSQL test databases are told apart by
pytest-django itself (`_gw0`, `_gw1`, `_gw2`).

Loaded with `-p tests.parallel` (the Makefile's pytest command): a plugin named
there is imported before pytest-django sets Django up, and Django's settings read
these variables once, when they are first imported.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def _own_redis_db(url: str, n: int) -> str:
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) + n
    if db > 15:
        raise RuntimeError(f"REDIS_URL {url}: no Redis database {db} for pytest-xdist worker {n}")
    return urlunsplit(parts._replace(path=f"/{db}"))


def _apply(worker: str) -> None:
    n = int(worker.removeprefix("gw"))
    if os.environ.get("REDIS_URL"):
        os.environ["REDIS_URL"] = _own_redis_db(os.environ["REDIS_URL"], n)
    base = Path(os.environ.get("CHORUS_DATA_DIR") or Path(__file__).resolve().parents[1] / "var")
    data_dir = base / worker
    data_dir.mkdir(parents=True, exist_ok=True)
    os.environ["CHORUS_DATA_DIR"] = str(data_dir)
    # The controller process set this from its own data folder (chorus.metrics),
    # and the workers inherit its environment: the metrics files of each
    # worker's processes go to its own folder, not one the two share.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(data_dir / "metrics")
    database_url = os.environ.get("DATABASE_URL", "")
    if database_url.startswith("sqlite:"):
        os.environ["DATABASE_URL"] = f"sqlite:///{data_dir / 'chorus.sqlite3'}"


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    _apply(_worker)
