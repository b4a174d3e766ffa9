"""`chorus.thread_pools`: a pool made at its first use, and made again, not
inherited, in a forked child."""

from __future__ import annotations

import os
import threading

from chorus.thread_pools import ForkSafeThreads


def test_a_pool_is_made_at_its_first_use_and_kept() -> None:
    threads = ForkSafeThreads(2, "kept")
    assert not threads.made
    pool = threads.get()
    assert threads.get() is pool
    names = pool.submit(lambda: threading.current_thread().name).result(timeout=5)
    assert names.startswith("kept")
    pool.shutdown()


def test_a_forked_child_makes_a_pool_of_its_own_that_runs_its_work() -> None:
    threads = ForkSafeThreads(2, "forked")
    threads.get().submit(lambda: None).result(timeout=5)  # the parent's pool, with a thread
    pid = os.fork()
    if pid == 0:  # the child: its own pool runs work; then out without cleanup
        fresh = not threads.made
        done = threads.get().submit(lambda: 42).result(timeout=5) == 42
        os._exit(0 if fresh and done else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert threads.made  # the parent keeps its own
    threads.get().shutdown()
