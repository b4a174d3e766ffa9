"""Where a worker sends audio chunks while it synthesizes (live streaming).

`sink_for(job)` gives the job's sink: a no-op for jobs nobody streams.
"""

from __future__ import annotations

from typing import Protocol

from synthesis.engines.base import Samples
from synthesis.models import Job


class ChunkSink(Protocol):
    def chunk(self, samples: Samples, sample_rate: int) -> None: ...

    def finish(self) -> None:
        """The job succeeded and its file is stored."""

    def fail(self, *, code: str, message: str) -> None:
        """The job ended without audio (failed, cancelled, superseded)."""


class NullSink:
    def chunk(self, samples: Samples, sample_rate: int) -> None:
        return None

    def finish(self) -> None:
        return None

    def fail(self, *, code: str, message: str) -> None:
        return None


def sink_for(job: Job) -> ChunkSink:
    return NullSink()
