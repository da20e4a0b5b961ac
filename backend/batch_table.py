"""The batch table, batch queue items and the three meta operations (paper, section 5.2).

A row of the table is an ongoing batch: its id, current size ``bs`` (in rows; a query may bring
several rows), creation time, ``status`` (rows each stage has completed) and whether it may
still be stretched. Items in the batch queues name rows of a batch as ``(batch_id, start, num)``.

Rows, not base addresses: every row of a batch has a fixed position in the stage buffers,
``offset + row``. A stretch appends rows after the batch's last one, so late rows are written
beside the early ones and the merge needs no copy; split parts keep the positions they had. An
executor therefore computes on exactly its item's rows wherever the batch came from.

- **new**: queries become a batch whose single item enters stage 0.
- **stretch**: queries join the latest batch as an item ``(id, bs, rows)`` at stage 0; at every
  stage the batch's items are held until ``status`` reaches ``bs`` and then pushed on as one
  merged item, so the late rows catch up with the early ones (paper, Figure 8b).
- **split**: a finished item covering a whole batch becomes several batches, pushed one by one;
  each leaves the pipeline on its own. Split batches and their parts are never stretched.

The entry reads the table as ``Flight`` snapshots (where each batch is, since when) to predict
when each stage frees, so that a policy can time the next batch (``DiversityPolicy.window_end``).

Pure bookkeeping, thread-safe, no Triton or CUDA.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from .query import BatchShape, Query


@dataclass(frozen=True)
class BatchItem:
    """An entry of a batch queue: rows ``start .. start+num-1`` of batch ``batch_id``, found in
    buffer ``buffer`` of the boundary before the stage (None before stage 0)."""

    batch_id: int
    start: int
    num: int
    buffer: int | None = None


@dataclass(frozen=True)
class Member:
    """Rows ``query_row .. query_row+rows-1`` of ``query`` are rows ``row ..`` of their batch."""

    query: Query
    query_row: int
    row: int
    rows: int


@dataclass
class BatchRow:
    """One ongoing batch (a row of the paper's batch table)."""

    id: int
    bs: int
    created: float
    status: list[int]
    stretchable: bool
    offset: int
    members: list[Member]
    shape: BatchShape
    held: dict[int, list[BatchItem]] = field(default_factory=dict)  # stage -> items waiting there
    began: dict[int, float] = field(default_factory=dict)  # stage -> when it began on the batch's latest item

    def members_in(self, start: int, num: int) -> Iterator[tuple[Member, int, int, int]]:
        """(member, first query row, first batch row, rows) for each member overlapping the rows."""
        for member in self.members:
            lo, hi = max(start, member.row), min(start + num, member.row + member.rows)
            if lo < hi:
                yield member, member.query_row + lo - member.row, lo, hi - lo

    def answered(self, start: int, num: int) -> bool:
        """Whether every query with rows among these has been answered (a failure elsewhere)."""
        return all(member.query.answered for member, *_ in self.members_in(start, num))


@dataclass(frozen=True)
class Flight:
    """A batch in the pipeline as the entry sees it: ``rows``, its ``sizes`` on the named axes,
    the first ``stage`` that has not finished all of its rows, and when that stage began on it
    (None: it waits in that stage's queue)."""

    rows: int
    sizes: dict[str, int]
    stage: int
    began: float | None


class BatchTable:
    """The ongoing batches, updated by the entry (new, stretch) and by the executors."""

    def __init__(self, stages: int, max_batch_size: int):
        self.stages = stages
        self.max_batch_size = max_batch_size
        self._rows: dict[int, BatchRow] = {}
        self._ids = itertools.count()
        self._latest: int | None = None
        self.lock = threading.RLock()  # held across a decision and its meta operation, to make them atomic
        self._empty = threading.Condition(self.lock)

    def __len__(self) -> int:
        with self.lock:
            return len(self._rows)

    def __contains__(self, batch_id: int) -> bool:
        with self.lock:
            return batch_id in self._rows

    def rows_in_flight(self) -> int:
        with self.lock:
            return sum(row.bs for row in self._rows.values())

    def rows(self) -> list[BatchRow]:
        with self.lock:
            return list(self._rows.values())

    def flights(self) -> list[Flight]:
        """The batches in flight, oldest first (the order in which the stages take them)."""
        with self.lock:
            flights = []
            for row in self._rows.values():
                stage = next((s for s, done in enumerate(row.status) if done < row.bs), None)
                if stage is None or not row.members:
                    continue
                sizes = dict(row.shape.sizes) if row.shape.pads else row.members[0].query.sizes
                flights.append(Flight(row.bs, sizes, stage, row.began.get(stage)))
            return flights

    def begin(self, stage: int, batch_id: int, now: float) -> None:
        """``stage`` began computing an item of the batch (what ``flights`` reports)."""
        with self.lock:
            row = self._rows.get(batch_id)
            if row is not None:
                row.began[stage] = now

    def get(self, batch_id: int) -> BatchRow:
        with self.lock:
            return self._rows[batch_id]

    def find(self, batch_id: int) -> BatchRow | None:
        with self.lock:
            return self._rows.get(batch_id)

    def discard(self, batch_id: int) -> BatchRow | None:
        """Take a failed batch out of the table (its rows will never leave); the row, or None if
        it was already gone."""
        with self.lock:
            row = self._rows.get(batch_id)
            if row is not None:
                self._remove(row)
            return row

    def wait_empty(self, timeout: float | None = None) -> bool:
        with self.lock:
            return self._empty.wait_for(lambda: not self._rows, timeout)

    def new(self, queries: Sequence[Query], now: float, stretchable: bool = True,
            shape: BatchShape | None = None) -> BatchItem:
        """A batch of ``queries`` (of ``shape``: by default, their exact one)."""
        with self.lock:
            shape = shape or BatchShape.of(queries)
            if not all(shape.admits(q) for q in queries):
                raise ValueError(f"queries do not fit the batch shape {shape}")
            row = BatchRow(id=next(self._ids), bs=0, created=now, status=[0] * self.stages,
                           stretchable=stretchable, offset=0, members=[], shape=shape)
            self._append(row, queries)
            self._rows[row.id] = row
            self._latest = row.id
            return BatchItem(row.id, 0, row.bs)

    def stretch_candidate(self, query: Query) -> BatchRow | None:
        """The batch ``query`` may join: the latest one, if it is still stretchable, has room for
        the query's rows, stacks with it and has not begun to leave the pipeline."""
        with self.lock:
            row = self._rows.get(self._latest) if self._latest is not None else None
            if (row is None or not row.stretchable or row.bs + query.rows > self.max_batch_size
                    or not row.shape.admits(query) or row.status[-1] > 0):
                return None
            return row

    def stretch(self, batch_id: int, queries: Sequence[Query]) -> BatchItem:
        with self.lock:
            row = self._rows[batch_id]
            if (row is not self.stretch_candidate(queries[0])
                    or not all(row.shape.admits(q) for q in queries)):
                raise ValueError(f"batch {batch_id} cannot be stretched by these queries")
            start = row.bs
            self._append(row, queries)
            return BatchItem(row.id, start, row.bs - start)

    def complete(self, stage: int, item: BatchItem, buffer: int | None) -> list[BatchItem]:
        """Record that ``stage`` finished ``item``, whose rows are now in ``buffer`` of the next
        boundary; return what goes on: nothing while the batch waits for late rows, else one
        item with every row that reached this stage. At the last stage each item leaves at once,
        and a batch whose rows all left is removed."""
        with self.lock:
            row = self._rows[item.batch_id]
            row.status[stage] += item.num
            row.began.pop(stage, None)
            if stage == self.stages - 1:
                if row.status[stage] == row.bs:
                    self._remove(row)
                return [item]
            waiting = row.held.setdefault(stage, [])
            waiting.append(BatchItem(item.batch_id, item.start, item.num, buffer))
            if row.status[stage] < row.bs:
                return []
            del row.held[stage]
            start = min(i.start for i in waiting)
            if sum(i.num for i in waiting) != row.bs - start or {i.buffer for i in waiting} != {buffer}:
                raise RuntimeError(f"batch {row.id} cannot merge {waiting} at stage {stage}")
            return [BatchItem(row.id, start, row.bs - start, buffer)]

    def holds_rows(self, stage: int) -> bool:
        """Whether some batch keeps rows after ``stage`` for its late ones (a legitimate output)."""
        with self.lock:
            return any(stage in row.held for row in self._rows.values())

    def kept_buffer(self, stage: int, batch_id: int) -> int | None:
        """The buffer after ``stage`` where the batch keeps rows waiting for its late ones."""
        with self.lock:
            row = self._rows.get(batch_id)
            waiting = row.held.get(stage) if row else None
            return waiting[0].buffer if waiting else None

    def split(self, stage: int, item: BatchItem, sizes: Sequence[int]) -> list[BatchItem]:
        """Divide the batch of ``item`` (which must cover all of it) into batches of ``sizes`` rows."""
        with self.lock:
            row = self._rows[item.batch_id]
            if item.start != 0 or item.num != row.bs or sum(sizes) != row.bs or min(sizes) < 1:
                raise ValueError(f"cannot split batch {row.id} of {row.bs} rows into {list(sizes)}")
            del self._rows[row.id]
            parts, start = [], 0
            for size in sizes:
                part = BatchRow(
                    id=next(self._ids), bs=size, created=row.created,
                    status=[size if s <= stage else 0 for s in range(self.stages)], stretchable=False,
                    offset=row.offset + start, shape=row.shape,
                    members=[Member(m.query, q, b - start, n) for m, q, b, n in row.members_in(start, size)])
                self._rows[part.id] = part
                parts.append(BatchItem(part.id, 0, size, item.buffer))
                start += size
            return parts

    def _append(self, row: BatchRow, queries: Sequence[Query]) -> None:
        for query in queries:
            row.members.append(Member(query, 0, row.bs, query.rows))
            row.bs += query.rows
        if row.bs > self.max_batch_size:
            raise ValueError(f"batch {row.id} would have {row.bs} rows, more than {self.max_batch_size}")

    def _remove(self, row: BatchRow) -> None:
        del self._rows[row.id]
        if self._latest == row.id:
            self._latest = None
        if not self._rows:
            self._empty.notify_all()
