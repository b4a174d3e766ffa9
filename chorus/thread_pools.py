"""Thread pools made where they are used, never inherited across a fork.

A module that hands work to threads of its own keeps one pool per process. It
is made at its first use, in the process that uses it: a web or worker process
imports the module long before it forks (uvicorn's workers, a prefork pool's
children), and a forked child has none of its parent's threads, so a pool made
in the parent would hold work that no thread ever takes up. A child forgets the
parent's pool and makes its own.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor


class ForkSafeThreads:
    """A `ThreadPoolExecutor` of at most `max_workers` threads named after
    `name`, made at its first `get()` in each process."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._max_workers, thread_name_prefix=self._name)
        return self._executor

    @property
    def made(self) -> bool:
        """Whether this process has made its pool."""
        return self._executor is not None

    def _forget(self) -> None:
        self._executor = None
