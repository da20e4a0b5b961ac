"""DVAScheduler: applies the meta operations to the batch table as a policy decides (Figure 12).

``admit`` runs when the first stage is ready for more queries (stretch, or new batches formed by
the policy); ``schedule`` runs after every stage finishes an item (update the table, merge
caught-up rows, maybe split, otherwise pass on). Split parts that must run in the serial manner
are chained: each enters the next stage when the part before it has left the pipeline. Pure
logic: no Triton, no CUDA, no threads of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from .batch_table import BatchItem, BatchRow, BatchTable
from .metrics import Metrics
from .policy import Outlook, Policy
from .query import BatchShape, Query, take_batch, waited

log = logging.getLogger(__name__)

# Hands a held split part to the queue of a stage: (stage, item).
Release = Callable[[int, BatchItem], None]
Formed = list[tuple[list[Query], BatchShape]]


class Scheduler:
    def __init__(self, table: BatchTable, policy: Policy, clock: Callable[[], float] = time.monotonic,
                 metrics: Metrics | None = None, release: Release | None = None,
                 left: Callable[[], None] | None = None):
        self.table = table
        self.policy = policy
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.release = release  # hands a held split part to a stage's queue
        self.left = left  # hears that a batch has left the pipeline
        self._after: dict[int, tuple[int, BatchItem]] = {}  # batch id -> (stage, part entering when it leaves)

    def admit(self, waiting: Sequence[Query], room: int, outlook: Outlook = Outlook()
              ) -> tuple[list[Query], BatchItem, Formed]:
        """Admit waiting queries, at most ``room`` rows: they stretch the latest batch if it
        admits them and the policy wants (atomically with the table, so the batch cannot leave
        or split meanwhile), else the policy forms new batches from them, and the first enters
        now. Returns the queries taken, the item for stage 0 and the batches formed to enter
        next (the caller removes all taken queries from ``waiting``)."""
        try:
            return self._admit(waiting, room, outlook)
        except Exception:  # a policy's bug must not stop admission: batch as Triton would
            log.exception("policy %r failed at admission; admitting a plain new batch", self.policy.name)
            batch = take_batch(waiting, room)
            now = self.clock()
            item = self.table.new(batch, now, stretchable=False)
            self._admitted("new", batch, now)
            return batch, item, []

    def _admit(self, waiting: Sequence[Query], room: int, outlook: Outlook) -> tuple[list[Query], BatchItem, Formed]:
        now = self.clock()
        with self.table.lock:
            candidate = self.table.stretch_candidate(waiting[0])
            if candidate is not None:
                joining, rows, backlog = [], 0, 0  # backlog: the rows left queued behind
                fits = min(room, self.table.max_batch_size - candidate.bs)
                for query in waiting:
                    if rows + query.rows <= fits and candidate.shape.admits(query):
                        joining.append(query)
                        rows += query.rows
                    else:
                        backlog += query.rows
                if joining and self.policy.stretch(candidate, joining, now, backlog):
                    item = self.table.stretch(candidate.id, joining)
                    self._admitted("stretch", joining, now)
                    return joining, item, []
        formed = self.policy.form(waiting, room, now, outlook)
        (batch, shape), rest = formed[0], formed[1:]
        item = self.new(batch, shape)
        return [q for queries, _ in formed for q in queries], item, rest

    def new(self, queries: list[Query], shape: BatchShape) -> BatchItem:
        now = self.clock()
        try:
            stretchable = self.policy.stretchable(queries, now)
        except Exception:  # a policy's bug costs the batch its stretching, nothing more
            log.exception("policy %r failed to say whether a batch may be stretched", self.policy.name)
            stretchable = False
        item = self.table.new(queries, now, stretchable=stretchable, shape=shape)
        self._admitted("new", queries, now)
        return item

    def _admitted(self, kind: str, queries: list[Query], now: float) -> None:
        self.metrics.admitted(len(queries), waited(queries, now), kind)

    def schedule(self, stage: int, item: BatchItem, buffer: int | None) -> tuple[int, list[BatchItem]]:
        """After ``stage`` finished ``item`` (its rows now in ``buffer``): how many items will
        read that buffer, and which to push to the next stage now. Whoever hears of a batch
        leaving is told after the table's lock is released (the entry takes that lock under its
        own)."""
        gone, following = False, None
        with self.table.lock:
            out = self.table.complete(stage, item, buffer)
            if stage == self.table.stages - 1:
                gone = item.batch_id not in self.table
                following = self._after.pop(item.batch_id, None) if gone else None
                reads = len(out)
            else:
                reads, out = self._maybe_split(stage, out)
        if following is not None:
            self.release(*following)
        if gone and self.left is not None:
            self.left()
        return reads, out

    def discard(self, batch_id: int) -> BatchRow | None:
        """Take a failed batch out of the table; a split part chained after it enters now, and
        the entry hears that rows left. The row, or None if it was gone already."""
        with self.table.lock:
            row = self.table.discard(batch_id)
            following = self._after.pop(batch_id, None)
        if following is not None:
            self.release(*following)
        if row is not None and self.left is not None:
            self.left()
        return row

    def _maybe_split(self, stage: int, out: list[BatchItem]) -> tuple[int, list[BatchItem]]:
        """Split a whole batch if the policy says so; serial parts are chained (table lock held)."""
        if len(out) != 1 or out[0].start != 0 or out[0].num != self.table.get(out[0].batch_id).bs:
            return len(out), out
        row = self.table.get(out[0].batch_id)
        try:
            sizes = self.policy.split(row, stage, self.clock())
            parts = self.table.split(stage, out[0], sizes) if sizes and len(sizes) > 1 else None
        except Exception:  # a policy's bug costs the split, not the batch
            log.exception("policy %r failed to split batch %d after stage %d; passing it on whole",
                          self.policy.name, row.id, stage)
            parts = None
        if parts is None:
            return len(out), out
        self.metrics.meta_operation("split")
        if not self.policy.split_serially:
            return len(parts), parts
        for part, following in zip(parts, parts[1:]):
            self._after[part.batch_id] = (stage + 1, following)
        if row.id in self._after:  # the part this batch was: its successor now follows the last part
            self._after[parts[-1].batch_id] = self._after.pop(row.id)
        return len(parts), parts[:1]
