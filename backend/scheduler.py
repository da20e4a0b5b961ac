"""DVAScheduler: applies the meta operations to the batch table as a policy decides (Figure 12).

``admit`` runs when the first stage is ready for more queries (new or stretch); ``schedule``
runs after every stage finishes an item (update the table, merge caught-up rows, maybe split,
otherwise pass on). Pure logic: no Triton, no CUDA, no threads of its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from .batch_table import BatchItem, BatchTable
from .metrics import Metrics
from .policy import Policy
from .query import Query, take_batch


class Scheduler:
    def __init__(self, table: BatchTable, policy: Policy, clock: Callable[[], float] = time.monotonic,
                 metrics: Metrics | None = None):
        self.table = table
        self.policy = policy
        self.clock = clock
        self.metrics = metrics or Metrics()

    def admit(self, waiting: deque[Query]) -> BatchItem:
        """Take the oldest waiting query and those that stack with it: they join the latest
        batch (stretch, as many as it has room for) if the policy wants, else start a new batch
        of up to ``max_batch_size`` rows."""
        now = self.clock()
        candidate = self.table.stretch_candidate(waiting[0])
        if candidate is not None:
            joining = take_batch(deque(waiting), self.table.max_batch_size - candidate.bs)
            if self.policy.stretch(candidate, joining, now):
                for query in joining:
                    waiting.remove(query)
                return self._admitted("stretch", joining, now, self.table.stretch(candidate.id, joining))
        batch = take_batch(waiting, self.table.max_batch_size)
        item = self.table.new(batch, now, stretchable=self.policy.stretchable(batch, now))
        return self._admitted("new", batch, now, item)

    def _admitted(self, kind: str, queries: list[Query], now: float, item: BatchItem) -> BatchItem:
        self.metrics.meta_operation(kind)
        self.metrics.admitted(now - q.arrived for q in queries)
        return item

    def schedule(self, stage: int, item: BatchItem, buffer: int | None) -> list[BatchItem]:
        """What ``stage`` pushes on after finishing ``item`` (its rows now in ``buffer``)."""
        out = self.table.complete(stage, item, buffer)
        if len(out) == 1 and stage < self.table.stages - 1:
            row = self.table.get(out[0].batch_id)
            if out[0].start == 0 and out[0].num == row.bs:
                sizes = self.policy.split(row, stage, self.clock())
                if sizes and len(sizes) > 1:
                    parts = self.table.split(stage, out[0], sizes)
                    self.metrics.meta_operation("split")
                    return parts
        return out
