"""How a service sends work to the broker without importing a task module.

A task module imports the services it calls; a service that imported the task
module back to enqueue one would close a cycle (once held by imports inside
functions). Each task module registers its sender here when it is imported
(`synthesis.tasks`, `batches.tasks`: each app's `ready`), as `webhooks.tasks`
does for deliveries, and a service calls the publisher by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, ParamSpec

P = ParamSpec("P")


class Publisher(Generic[P]):
    def __init__(self, name: str) -> None:
        self.name = name
        self._send: Callable[P, object] | None = None

    def register(self, send: Callable[P, object]) -> None:
        self._send = send

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        assert self._send is not None, f"{self.name}: its tasks module registers it when ready"
        self._send(*args, **kwargs)


# A job's message to its priority's queue: (job id, epoch, priority, countdown s,
# further headers: `synthesis.prestart`'s on a job's first message).
send_synthesis: Publisher[[str, int, str, float, dict[str, Any]]] = Publisher("synthesis")
# A long text's split of the rest after segment 0: (parent id, after, max chars).
send_longform_split: Publisher[[str, int, int]] = Publisher("longform split")
# A long text's join, once every segment is made: (parent id).
send_longform_join: Publisher[[str]] = Publisher("longform join")
