"""Stage executors: one thread per stage, with the four states of the paper's Figure 11.

- ``ACTIVE``: holds a legitimate output buffer (an available one, or the one where a batch keeps
  rows for its late queries; the last stage needs none) and waits for the next batch item.
- ``CHECKING``: pulled an item; checks that its buffer pair is legitimate for it.
- ``WORKING``: runs the stage on exactly the item's rows and writes them to the same rows of
  the output buffer, then lets the scheduler decide what goes on (Figure 12).
- ``INACTIVE``: no legitimate output buffer; waits until the next stage releases one.

Entering ``ACTIVE`` releases the input boundary (rows read become available to the previous
executor), which is what makes one buffer pair serial and two or more parallel (see
``buffers.py``). The loop is the paper's Figure 12, lines 2-11.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from .batch_table import BatchItem, BatchRow
from .buffers import Boundary, Buffer, BufferState
from .device import Device
from .engines import Engine
from .manifest import StageSpec
from .query import each_alone
from .scheduler import Scheduler

log = logging.getLogger(__name__)


class ExecutorState(Enum):
    ACTIVE = "active"
    CHECKING = "checking"
    WORKING = "working"
    INACTIVE = "inactive"


class Inbox(Protocol):
    def get(self) -> BatchItem | None: ...  # None: stop


class BatchQueue:
    """The queue of batch items between two stages."""

    def __init__(self):
        self._items: deque[BatchItem | None] = deque()
        self._ready = threading.Condition()

    def put(self, item: BatchItem | None) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify()

    def get(self) -> BatchItem | None:
        with self._ready:
            self._ready.wait_for(lambda: self._items)
            return self._items.popleft()


class Stage(Protocol):
    """What an executor needs from the runtime around it."""

    def stage_inputs(self, row: BatchRow, item: BatchItem) -> dict[str, Any]: ...  # stage 0's rows from queries
    def leave(self, row: BatchRow, item: BatchItem, outputs: dict[str, Any]) -> None: ...  # last stage
    def fail_rows(self, row: BatchRow, start: int, num: int, error: Exception) -> None: ...
    def executor_died(self, stage: int, error: BaseException) -> None: ...  # answer all, refuse more
    def drop_cancelled(self, row: BatchRow, item: BatchItem) -> None: ...  # answer queries given up on
    def computed(self, stage: int) -> None: ...  # ``stage`` finished an item and handed it on
    def boundary(self, stage: int) -> Boundary: ...  # the buffers after ``stage``


Trace = Callable[[int, BatchItem, float, float], None]


@dataclass
class Work:
    """An item in an executor's hands, with the buffers it holds (what a failure must return)."""

    item: BatchItem
    source: Buffer | None = None
    target: Buffer | None = None
    out: list[BatchItem] = field(default_factory=list)  # what the scheduler made of it (split parts)


class StageExecutor(threading.Thread):
    def __init__(self, spec: StageSpec, engine: Engine, device: Device, scheduler: Scheduler, inbox: Inbox,
                 outbox: BatchQueue | None, input: Boundary | None, output: Boundary | None, runtime: Stage,
                 trace: Trace | None = None):
        super().__init__(name=f"dvabatch-stage-{spec.index}", daemon=True)
        self.spec, self.engine, self.device, self.scheduler = spec, engine, device, scheduler
        self.inbox, self.outbox, self.input, self.output = inbox, outbox, input, output
        self.runtime, self.trace = runtime, trace
        self.stream = device.stream()
        self.history: deque[ExecutorState] = deque(maxlen=256)
        self._set(ExecutorState.INACTIVE)

    @property
    def state(self) -> ExecutorState:
        return self.history[-1]

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # what even _recover could not keep: say so, answer all
            log.critical("stage %d's executor died", self.spec.index, exc_info=True)
            self.runtime.executor_died(self.spec.index, exc)

    def _loop(self) -> None:
        while self._become_active():
            try:
                item = self.inbox.get()
            except Exception:  # the entry's queries stay waiting; try again
                log.exception("stage %d could not take its next item", self.spec.index)
                time.sleep(0.01)
                continue
            if item is None:
                return
            work = Work(item)
            try:
                self._process(work)
            except Exception as exc:  # a fault must cost its batch, never the thread
                log.exception("stage %d failed on %s", self.spec.index, item)
                self._recover(work, exc)

    def _recover(self, work: Work, error: Exception) -> None:
        """After a fault outside the engine (the runtime's, a policy's, the device's): the buffers
        the item held go back, and its whole batch (or the parts it was split into) leaves the
        table with every query in it answered, so nothing waits for rows that will never come."""
        try:
            if work.source is not None and work.source.state is BufferState.INREADING:
                self.input.done_reading(work.source)
            elif work.source is None and self.input is not None and work.item.buffer is not None:
                self.input.drop(work.item.buffer)
            if work.target is not None and work.target.state is BufferState.INWRITING:
                self.output.abandon(work.target)
            for batch_id in dict.fromkeys([work.item.batch_id, *(part.batch_id for part in work.out)]):
                row = self.scheduler.discard(batch_id)
                if row is None:
                    continue
                self.runtime.fail_rows(row, 0, row.bs, RuntimeError(f"internal error in stage {self.spec.index}: "
                                                                    f"{type(error).__name__}: {error}"))
                for stage, held in row.held.items():  # rows kept for late ones hold one claim
                    self.runtime.boundary(stage).drop(held[0].buffer)
        except Exception:  # keep the thread; what could not be returned is logged
            log.exception("stage %d could not recover from the failure on %s", self.spec.index, work.item)

    def _become_active(self) -> bool:
        """ACTIVE once a legitimate output buffer exists (INACTIVE until then); then release the
        input boundary so the previous executor may reuse what this one has read."""
        keeps_rows = self.scheduler.table.holds_rows(self.spec.index)
        if self.output is not None and not self.output.has_available() and not keeps_rows:
            self._set(ExecutorState.INACTIVE)
            if not self.output.wait_available():
                return False
        self._set(ExecutorState.ACTIVE)
        if self.input is not None:
            self.input.release()
        return True

    def _process(self, work: Work) -> None:
        self._set(ExecutorState.CHECKING)
        item, table = work.item, self.scheduler.table
        row = table.find(item.batch_id)
        if row is None:  # its batch failed meanwhile: its rows will never be read
            if self.input is not None and item.buffer is not None:
                self.input.drop(item.buffer)
            return
        if self.input is not None:  # stage 0's queries were just asked at the entry
            self.runtime.drop_cancelled(row, item)
        source = work.source = self.input.start_reading(item.buffer) if self.input is not None else None
        target = work.target = self._claim_output(table.kept_buffer(self.spec.index, item.batch_id))
        self._set(ExecutorState.WORKING)
        began = time.monotonic()
        table.begin(self.spec.index, item.batch_id, began)
        with self.device.running_on(self.stream):
            for buffer in (source, target):
                if buffer is not None:
                    self.device.after(buffer.event, self.stream)
            whole = self._compute(row, item, source, target)
            if source is not None:
                self.device.record(source.event, self.stream)
                self.input.done_reading(source)
            if target is not None:
                self.device.record(target.event, self.stream)
        self.device.finish(self.stream)  # the table must say where the batch really is
        if whole and self.scheduler.policy.learns:
            self._observe(row, item.num, time.monotonic() - began)
        # From the table's update to the hand-over nothing can fail: the claims on the output
        # buffer always match the items and held rows the table says read it.
        keeps = target is not None and target.claims > 0  # written beside rows kept there
        reads, out = self.scheduler.schedule(self.spec.index, item, target.index if target else None)
        work.out = out
        if target is not None:
            # Every part reads the buffer once (held ones later); rows kept for late ones count as one.
            self.output.written(target, max(reads, 1) - keeps)
        for part in out:
            if self.outbox is not None:
                self.outbox.put(part)
        ended = time.monotonic()
        self.scheduler.metrics.stage_ran(self.spec.index, item.num, ended - began)
        if self.trace:
            self.trace(self.spec.index, item, began, ended)
        self.runtime.computed(self.spec.index)

    def _observe(self, row: BatchRow, rows: int, seconds: float) -> None:
        try:
            self.scheduler.policy.observe(range(self.spec.index, self.spec.index + 1), rows, row.shape,
                                          row.members[0].query if row.members else None, seconds)
        except Exception:  # a policy's bug must not fail the batch
            log.exception("policy %r failed to observe a stage run", self.scheduler.policy.name)

    def _claim_output(self, kept: int | None) -> Buffer | None:
        if self.output is None:
            return None
        if kept is None and not self.output.has_available():
            self._set(ExecutorState.INACTIVE)  # the pair is not legitimate for this batch yet
            self.output.wait_available()
        return self.output.claim_output(kept)

    def _compute(self, row: BatchRow, item: BatchItem, source: Buffer | None, target: Buffer | None) -> bool:
        """Run the stage on the item's rows; rerun query by query if that fails, so only the rows
        of a query that cannot run are lost (and that query is answered with the error). Rows
        whose queries are all answered already (cancelled, or failed elsewhere) are skipped: the
        item still passes on, so buffers and table move as usual, but nobody reads its rows.
        Whether the rows ran as one run (what a policy may learn a run's time from)."""
        if row.answered(item.start, item.num):
            return False
        try:
            self._run_rows(row, item.start, item.num, source, target)
            return True
        except Exception as exc:  # noqa: BLE001 - an engine error must cost only its own queries
            chunks = [(start, num) for _, _, start, num in row.members_in(item.start, item.num)]
            if len(chunks) == 1:
                self.runtime.fail_rows(row, item.start, item.num, exc)
                return False
            each_alone([(s, n) for s, n in chunks if not row.answered(s, n)],  # (not those failed elsewhere)
                       lambda chunk: self._run_rows(row, *chunk, source, target),
                       lambda chunk, error: self.runtime.fail_rows(row, *chunk, error))
            return False

    def _run_rows(self, row: BatchRow, start: int, num: int, source: Buffer | None, target: Buffer | None) -> None:
        first = row.offset + start
        if source is None:
            inputs = self.runtime.stage_inputs(row, BatchItem(row.id, start, num))
        else:
            inputs = {name: tensor[first:first + num] for name, tensor in source.tensors.items()}
        computed = self.engine.run({t.name: inputs[t.name] for t in self.spec.inputs})
        for name, value in computed.items():
            if len(value) != num:
                raise RuntimeError(f"stage {self.spec.index} computed {len(value)} rows of '{name}' for {num} rows")
        outputs = {**{name: inputs[name] for name in self.spec.carry}, **computed}
        if target is None:
            self.runtime.leave(row, BatchItem(row.id, start, num), outputs)
            return
        capacity = self.scheduler.table.max_batch_size
        for name, value in outputs.items():
            kept = target.tensors.get(name) if target.claims > 0 else None  # late rows go beside kept ones
            if (kept is not None and tuple(kept.shape[1:]) != tuple(value.shape[1:])
                    and not row.answered(0, start)):  # (rows that all failed kept nothing to match)
                raise RuntimeError(f"late rows of '{name}' have shape {list(value.shape[1:])} per row, "
                                   f"the batch they join has {list(kept.shape[1:])}")
            target.rows(name, value, capacity, self.device.empty)[first:first + num] = value

    def _set(self, state: ExecutorState) -> None:
        self.history.append(state)
