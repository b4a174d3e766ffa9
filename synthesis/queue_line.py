"""The order in which one priority's waiting jobs will start, under fair admission.

Only `queued` jobs are in the broker, at most a tenant's slots each, in publish
order. A worker takes the head; that claim releases the tenant's oldest
`pending` job of the priority to the back of the queue. So each queued job heads
a chain of its tenant's jobs: the tenant's i-th waiting job (its queued jobs in
queue order, then its pending ones oldest first) follows in chain i mod w, in
round i div w, where w is how many of its jobs the broker holds. Every round's
jobs start after all jobs of earlier rounds, and within a round in queue order.

Nothing here reads the database: `synthesis.selectors` builds a line from two
aggregate queries (waiting and queued jobs per tenant, and the queue's heads).
Aging and jobs submitted later reorder the line; it holds for the jobs there are.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable


class Line:
    def __init__(
        self,
        *,
        waiting: dict[int, int],
        queued: Iterable[tuple[uuid.UUID, int]],
        slots_per_tenant: int,
    ) -> None:
        """`waiting`: per tenant, its pending plus queued jobs of this priority;
        `queued`: (job, tenant) of the queued ones, in the broker's order."""
        self.waiting = waiting
        self._rank: dict[uuid.UUID, int] = {}  # a queued job's place among its tenant's
        in_broker: Counter[int] = Counter()
        chains: list[tuple[int, int]] = []  # (tenant, chain) in queue order
        for job_id, tenant_id in queued:
            self._rank[job_id] = in_broker[tenant_id]
            chains.append((tenant_id, in_broker[tenant_id]))
            in_broker[tenant_id] += 1
        # A tenant with free slots and pending jobs is about to have them released
        # (on commit of the job that freed the slot, or by the sweeper): they join
        # the back of the queue.
        self.width: dict[int, int] = {}
        for tenant_id, n in waiting.items():
            self.width[tenant_id] = max(in_broker[tenant_id], min(slots_per_tenant, n), 1)
            chains += [(tenant_id, c) for c in range(in_broker[tenant_id], self.width[tenant_id])]
        self.in_broker = in_broker
        self._chains = chains
        self._chain_index = {chain: i for i, chain in enumerate(chains)}

    def queued_rank(self, job_id: uuid.UUID) -> int | None:
        """A queued job's place among its tenant's queued jobs (None: not queued here)."""
        return self._rank.get(job_id)

    def ahead(self, *, tenant_id: int, index: int) -> int:
        """Jobs of this line that start before the tenant's `index`-th waiting job."""
        if tenant_id not in self.width:  # it left the line meanwhile: at its back
            return sum(self.waiting.values())
        round_, chain = divmod(index, self.width[tenant_id])
        before = sum(min(n, round_ * self.width[t]) for t, n in self.waiting.items())
        mine = self._chain_index[(tenant_id, chain)]
        for t, c in self._chains[:mine]:
            if c + round_ * self.width[t] < self.waiting[t]:
                before += 1
        return before
