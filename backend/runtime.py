"""The multi-entry multi-exit runtime: entry, stage executors, buffers, exits.

``submit`` validates queries and hands them to the entry without waiting, so Triton's
``execute`` returns at once and the next queries can enter while earlier batches run (multi-
entry). When the first executor is ready for work the entry takes the waiting queries that stack
together (after the batch window, if any) and the scheduler makes them a new batch or stretches
the latest one. Each query is answered as soon as its own rows leave the last stage (multi-
exit), wherever split or stretch moved them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .batch_table import BatchItem, BatchRow, BatchTable
from .buffers import Boundary
from .config import RuntimeConfig
from .device import CpuDevice, Device
from .engine import Engine
from .executor import BatchQueue, StageExecutor, Trace
from .manifest import Manifest
from .metrics import IN_FLIGHT, WAITING, Family, Metrics
from .query import Failure, Query, refuse_invalid
from .scheduler import Scheduler

log = logging.getLogger(__name__)


class Entry:
    """Queries waiting for the first stage; the first stage's batch queue (paper: BatchQueue_1)."""

    def __init__(self, scheduler: Scheduler, max_batch_size: int, window_s: float):
        self._scheduler = scheduler
        self._max = max_batch_size
        self._window = window_s
        self._waiting: deque[Query] = deque()
        self._changed = threading.Condition()
        self._closed = False

    def put(self, queries: Sequence[Query]) -> None:
        with self._changed:
            self._waiting.extend(queries)
            self._changed.notify_all()

    def get(self) -> BatchItem | None:
        """The next item for stage 0 (admitting queries as new or stretch), or None once closed
        and drained. With a batch window, waits until the oldest query has waited that long or
        a full batch is there."""
        with self._changed:
            self._changed.wait_for(lambda: self._waiting or self._closed)
            if not self._waiting:
                return None
            if self._window > 0:
                deadline = self._waiting[0].arrived + self._window
                while (not self._closed and sum(q.rows for q in self._waiting) < self._max
                       and (left := deadline - time.monotonic()) > 0):
                    self._changed.wait(left)
            return self._scheduler.admit(self._waiting)

    def __len__(self) -> int:
        with self._changed:
            return len(self._waiting)

    def close(self) -> list[Query]:
        """Stop waiting for more; the queries still waiting are returned, not admitted."""
        with self._changed:
            self._closed = True
            left, self._waiting = list(self._waiting), deque()
            self._changed.notify_all()
            return left


class Runtime:
    def __init__(self, manifest: Manifest, engines: Sequence[Engine], config: RuntimeConfig | None = None,
                 device: Device | None = None, trace: Trace | None = None, metrics: Metrics | None = None):
        config = config or RuntimeConfig()
        self.manifest = manifest
        self.device = device or CpuDevice()
        stages = len(manifest.stages)
        self.table = BatchTable(stages, manifest.max_batch_size)
        self.metrics = metrics or Metrics()
        self.scheduler = Scheduler(self.table, config.policy, metrics=self.metrics)
        self.entry = Entry(self.scheduler, manifest.max_batch_size, config.batch_window_ms / 1000)
        self.boundaries = [Boundary(i, config.buffer_pairs, self.device.event) for i in range(stages - 1)]
        self.queues = [BatchQueue() for _ in range(stages - 1)]
        self._outputs = [t.name for t in manifest.outputs]
        self._partial: dict[Query, dict[str, np.ndarray]] = {}
        self._filled: dict[Query, int] = {}
        self._lock = threading.Lock()
        self.executors = [
            StageExecutor(spec, engine, self.device, self.scheduler,
                          inbox=self.entry if i == 0 else self.queues[i - 1],
                          outbox=self.queues[i] if i < stages - 1 else None,
                          input=self.boundaries[i - 1] if i > 0 else None,
                          output=self.boundaries[i] if i < stages - 1 else None,
                          runtime=self, trace=trace)
            for i, (spec, engine) in enumerate(zip(manifest.stages, engines))
        ]
        for executor in self.executors:
            executor.start()

    def submit(self, queries: Sequence[Query]) -> None:
        """Validate and hand over; never waits for inference."""
        self.entry.put(refuse_invalid(self.manifest, queries))

    def gauges(self) -> dict[Family, float]:
        """Queries waiting at the entry, and every query handed over and not yet answered."""
        waiting = len(self.entry)
        running = len({id(m.query) for row in self.table.rows() for m in row.members if not m.query.answered})
        return {WAITING: waiting, IN_FLIGHT: waiting + running}

    def close(self, timeout: float = 60) -> None:
        """Finish what was admitted, refuse what was still waiting, stop the executors."""
        for query in self.entry.close():
            query.answer(failure=Failure("the model is unloading", bad_input=False))
        self.executors[0].join(timeout)
        if not self.table.wait_empty(timeout):
            log.error("unloading with %d batches still running", len(self.table))
            for row in self.table.rows():
                self.fail_rows(row, 0, row.bs, RuntimeError("the model is unloading"))
        for queue in self.queues:
            queue.put(None)
        for boundary in self.boundaries:
            boundary.close()
        for executor in self.executors[1:]:
            executor.join(timeout)

    # What the executors need from around them (executor.Stage).

    def stage_inputs(self, row: BatchRow, item: BatchItem) -> dict[str, Any]:
        chunks = list(row.members_in(item.start, item.num))
        return {spec.name: self.device.from_host(np.concatenate(
                    [m.query.inputs[spec.name][q:q + n] for m, q, _, n in chunks]))
                for spec in self.manifest.inputs}

    def leave(self, row: BatchRow, item: BatchItem, outputs: dict[str, Any]) -> None:
        """Rows leaving the last stage: answer every query whose rows are now all out."""
        host = {name: self.device.to_host(outputs[name]) for name in self._outputs}
        for member, query_row, batch_row, num in row.members_in(item.start, item.num):
            query = member.query
            rows = slice(batch_row - item.start, batch_row - item.start + num)
            if query.answered:
                continue
            if num == query.rows:
                query.answer({name: array[rows] for name, array in host.items()})
                continue
            with self._lock:  # a query split across items: gather its rows
                partial = self._partial.setdefault(
                    query, {n: np.empty((query.rows, *a.shape[1:]), a.dtype) for n, a in host.items()})
                for name, array in host.items():
                    partial[name][query_row:query_row + num] = array[rows]
                self._filled[query] = self._filled.get(query, 0) + num
                done = self._filled[query] == query.rows
                if done:
                    del self._partial[query], self._filled[query]
            if done:
                query.answer(partial)

    def fail_rows(self, row: BatchRow, start: int, num: int, error: Exception) -> None:
        for member, *_ in row.members_in(start, num):
            with self._lock:
                self._partial.pop(member.query, None)
                self._filled.pop(member.query, None)
            member.query.answer(failure=Failure(f"inference failed: {type(error).__name__}: {error}", bad_input=False))
