"""The multi-entry multi-exit runtime: entry, stage executors, buffers, exits.

``submit`` validates queries and hands them to the entry, waiting at most until stage 0 has
computed them, so Triton's ``execute`` returns while they are still in the pipeline and the next
queries can enter while earlier batches run (multi-entry). When the first executor is ready
for work the entry takes the waiting queries that stack together (after the batch window, if
any) and the scheduler makes them a new batch or stretches the latest one. Each query is
answered as soon as its own rows leave the last stage (multi-exit), wherever split or stretch
moved them.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .batch_table import BatchItem, BatchRow, BatchTable
from .buffers import Boundary
from .config import QueuePolicy, RuntimeConfig
from .device import CpuDevice, Device
from .engine import Engine
from .executor import BatchQueue, StageExecutor, Trace
from .manifest import Manifest
from .metrics import IN_FLIGHT, WAITING, Family, Metrics
from .padding import cut, stack
from .query import BatchShape, Code, Failure, Query, refuse_invalid
from .scheduler import Scheduler

log = logging.getLogger(__name__)
RATE_SAMPLES = 8  # arrivals before the entry trusts its estimate of the arrival rate
SCAN = 64  # waiting queries an admission looks at, from the oldest
CANCEL_AFTER_S = 0.02  # a waiting query is asked whether it was cancelled once it has waited this long
CANCEL_IN_FLIGHT_S = 0.1  # a query in the pipeline is asked once it is this old, then at most this often
CANCELLED = Failure("the request was cancelled", Code.CANCELLED)
ANSWERING_THREADS = 4


class Entry:
    """Queries waiting for the first stage; the first stage's batch queue (paper: BatchQueue_1).

    When stage 0 asks for work, the entry waits out the batch window if there is one (a fixed
    ``window_s``, else the policy's, which knows whether the pipeline is busy and how fast queries
    arrive) and the room the policy leaves for rows in flight, then lets the scheduler admit.
    Batches the policy formed beyond the first enter on the next requests, without waiting. The
    backend's ``execute`` waits on the entry too (``wait_ready``): that back-pressure is what
    keeps Triton's own batching alive in front of it."""

    def __init__(self, scheduler: Scheduler, max_batch_size: int, window_s: float | None,
                 queue: QueuePolicy | None = None):
        self._scheduler = scheduler
        self._max = max_batch_size
        self._window = window_s
        self._queue = queue or QueuePolicy()
        self._waiting: deque[Query] = deque()
        self._formed: deque[tuple[list[Query], BatchShape]] = deque()
        self._arrivals: deque[float] = deque(maxlen=32)
        self._changed = threading.Condition()
        self._closed = False
        self._ready = True  # stage 0 is done with its item, or waits here: it takes queries next
        self._windowing = False  # stage 0 waits in its batch window for more queries

    def put(self, queries: Sequence[Query]) -> None:
        """Queue the queries; those beyond ``max_queue`` are refused at once, as Triton's queue
        policy refuses them."""
        with self._changed:
            limit = self._queue.max_queue_size
            room = limit - len(self._waiting) if limit > 0 else len(queries)
            accepted, refused = queries[:max(room, 0)], queries[max(room, 0):]
            self._waiting.extend(accepted)
            self._arrivals.extend(q.arrived for q in accepted)
            self._changed.notify_all()
        for query in refused:
            query.answer(failure=Failure(f"Exceeds maximum queue size ({limit} queries waiting)", Code.UNAVAILABLE))

    def _head(self) -> list[Query]:
        """The oldest ``SCAN`` waiting queries, taken off the queue, less those whose client
        cancelled them or whose timeout expired (with Triton's REJECT timeout action), which are
        answered. Admission only looks this far, so its cost does not grow with the queue.
        Asking Triton whether a request was cancelled is a round trip to its process, so only
        the oldest batch's worth is asked, and only once it has waited ``CANCEL_AFTER_S``."""
        head = [self._waiting.popleft() for _ in range(min(SCAN, len(self._waiting)))]
        now, reject, kept = time.monotonic(), self._queue.reject, []
        for position, query in enumerate(head):
            if position < self._max and query.gave_up(now, CANCEL_AFTER_S):
                query.answer(failure=CANCELLED)
            elif reject and query.deadline is not None and query.deadline <= now:
                query.answer(failure=Failure("Request timeout expired", Code.UNAVAILABLE))
            else:
                kept.append(query)
        return kept

    def wake(self) -> None:
        """Rows left the pipeline: there may be room for more."""
        with self._changed:
            self._changed.notify_all()

    def ready(self) -> None:
        """Stage 0 finished computing its item: it takes queries next, once it has an output buffer."""
        with self._changed:
            self._ready = True
            self._changed.notify_all()

    def wait_ready(self, timeout: float) -> None:
        """Back-pressure for Triton's batcher, in the backend's ``execute``: return once stage 0
        took every waiting query and finished computing them (it takes queries next), or waits
        in its batch window for more, or the entry closed; at most after ``timeout``. Meanwhile
        Triton gathers the requests that arrive into its next batch: one ``execute`` and one
        admission for many, as a plain model batches. Returning when stage 0 finished computing,
        not when it asks (after it got an output buffer), lets that batch travel from Triton
        while stage 0 waits for the next stage; and not when its queries were taken, so that
        Triton's next batch holds everything that arrived meanwhile, not a few stragglers. (A slow
        two-stage timed pipeline emulated without Triton kept its stages 73 %, 69 % and 83 % busy
        returning when stage 0 asks, when the queries are taken, and when they are computed.)"""
        with self._changed:
            self._changed.wait_for(lambda: (self._ready and not self._waiting) or self._windowing or self._closed,
                                   timeout)

    def _hand(self, item: BatchItem) -> BatchItem:
        self._ready = False
        return item

    def get(self) -> BatchItem | None:
        """The next item for stage 0, or None once closed and drained."""
        with self._changed:
            while True:
                if not self._ready:
                    self._ready = True
                    self._changed.notify_all()
                self._changed.wait_for(lambda: self._waiting or self._formed or self._closed)
                if self._formed:
                    return self._hand(self._scheduler.new(*self._formed.popleft()))
                if not self._waiting:
                    return None
                room = self._room()
                if room < self._waiting[0].rows:
                    self._changed.wait()
                    continue
                window = self._window if self._window is not None else self._policy_window()
                deadline = self._waiting[0].arrived + window
                while (not self._closed and self._joining_rows() < room
                       and (left := deadline - time.monotonic()) > 0):
                    self._windowing = True
                    self._changed.notify_all()
                    self._changed.wait(left)
                self._windowing = False
                head = self._head()
                if not head:
                    continue
                try:
                    taken, item, formed = self._scheduler.admit(head, self._room())
                except BaseException:
                    self._waiting.extendleft(reversed(head))
                    raise
                gone = {id(q) for q in taken}
                self._waiting.extendleft(reversed([q for q in head if id(q) not in gone]))
                self._formed.extend(formed)
                return self._hand(item)

    def _joining_rows(self) -> int:
        """Rows among the oldest ``SCAN`` that can share a batch with the oldest: what the window
        waits for (rows of another shape would not fill the batch it closes for)."""
        oldest, policy = self._waiting[0], self._scheduler.policy
        try:
            return sum(q.rows for q in itertools.islice(self._waiting, SCAN) if policy.joins(oldest, q))
        except Exception:  # a policy's bug must not stop admission: count every row
            log.exception("policy %r failed to say which queries batch together", policy.name)
            return sum(q.rows for q in itertools.islice(self._waiting, SCAN))

    def _policy_window(self) -> float:
        try:
            return self._scheduler.policy.window(self._waiting[0], len(self._scheduler.table) > 0,
                                                 self._arrival_rate())
        except Exception:  # a policy's bug must not stop admission: no window then
            log.exception("policy %r failed to give a batch window", self._scheduler.policy.name)
            return 0.0

    def _room(self) -> int:
        """Rows the policy lets in now; a full batch when nothing is in flight, so that a query
        larger than the bound still runs."""
        limit, in_flight = self._scheduler.policy.max_in_flight, self._scheduler.table.rows_in_flight()
        return min(self._max, limit - in_flight) if limit > 0 and in_flight else self._max

    def _arrival_rate(self) -> float:
        """Queries per second over the latest arrivals (0 until there are ``RATE_SAMPLES``: two
        queries that happen to come close together are not a load)."""
        if len(self._arrivals) < RATE_SAMPLES:
            return 0.0
        span = self._arrivals[-1] - self._arrivals[0]
        return (len(self._arrivals) - 1) / span if span > 0 else 0.0

    def __len__(self) -> int:
        with self._changed:
            return len(self._waiting) + sum(len(queries) for queries, _ in self._formed)

    def close(self) -> list[Query]:
        """Stop waiting for more; the queries not yet admitted are returned."""
        with self._changed:
            self._closed = True
            left = [*self._waiting, *(q for queries, _ in self._formed for q in queries)]
            self._waiting, self._formed = deque(), deque()
            self._changed.notify_all()
            return left


class Exit:
    """Answers queries off the last stage's thread, from ``ANSWERING_THREADS`` threads. A response
    sent through its response sender is a round trip to Triton's process that blocks the sending
    thread (the GIL released) for 130-200 us here, far longer than a cheap stage computes: the
    last stage must not wait for it, and one thread sending one answer after another became a
    queue (the hand-off wait grew to 1.4-6.8 ms at 8-32 requests in flight). Four senders
    answered 1.4-1.7x as many requests per second as one (issue 20's measurements). Answers are
    copies, never views of buffers a later batch may overwrite."""

    def __init__(self, threads: int = ANSWERING_THREADS):
        self._answers: queue.SimpleQueue[tuple[Query, dict[str, np.ndarray]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"dvabatch-exit-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def answer(self, query: Query, outputs: dict[str, np.ndarray]) -> None:
        self._answers.put((query, {name: np.array(array) for name, array in outputs.items()}))

    def _run(self) -> None:
        while (item := self._answers.get()) is not None:
            query, outputs = item
            query.answer(outputs)

    def close(self, timeout: float) -> None:
        for _ in self._threads:
            self._answers.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))


class Runtime:
    def __init__(self, manifest: Manifest, engines: Sequence[Engine], config: RuntimeConfig | None = None,
                 device: Device | None = None, trace: Trace | None = None, metrics: Metrics | None = None,
                 on_death: Callable[[str], None] | None = None):
        """``on_death``: called once, with the reason, if an executor thread dies after all (the
        backend then has its stub replaced, as Triton cannot be told the model is not ready)."""
        config = config or RuntimeConfig()
        self.dead: str | None = None
        self._on_death = on_death
        self.manifest = manifest
        self.device = device or CpuDevice()
        stages = len(manifest.stages)
        config.bind(manifest)
        self.pad_values = config.pad_values
        self.size_limits = config.size_limits(manifest)
        self.table = BatchTable(stages, manifest.max_batch_size)
        self.metrics = metrics or Metrics()
        self.queues = [BatchQueue() for _ in range(stages - 1)]
        self.scheduler = Scheduler(self.table, config.policy, metrics=self.metrics,
                                   release=lambda stage, item: self.queues[stage - 1].put(item),
                                   left=lambda: self.entry.wake())
        window = config.batch_window_ms / 1000 if config.batch_window_ms >= 0 else None
        self.entry = Entry(self.scheduler, manifest.max_batch_size, window, config.queue)
        self.boundaries = [Boundary(i, config.buffer_pairs, self.device.event) for i in range(stages - 1)]
        self._outputs = {t.name: t for t in manifest.outputs}
        self._partial: dict[Query, dict[str, np.ndarray]] = {}
        self._filled: dict[Query, int] = {}
        self._lock = threading.Lock()
        self.exit = Exit()
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

    def submit(self, queries: Sequence[Query], wait_s: float = 0.0) -> None:
        """Validate and hand over; never waits for inference. With ``wait_s``, return once stage 0
        has computed them (``Entry.wait_ready``), at most after that long."""
        if self.dead:
            for query in queries:
                query.answer(failure=Failure(self.dead, Code.UNAVAILABLE))
            return
        self.entry.put(refuse_invalid(self.manifest, queries, self.size_limits))
        if wait_s > 0:
            self.entry.wait_ready(wait_s)

    def executor_died(self, stage: int, error: BaseException) -> None:
        """An executor thread ended on an error nothing could recover from: every query held
        anywhere is answered, and every later one refused, rather than left hanging."""
        with self._lock:
            if self.dead:
                return
            self.dead = (f"stage {stage}'s executor died ({type(error).__name__}: {error}); "
                         "the model must be loaded again")
        for query in self.entry.close():
            query.answer(failure=Failure(self.dead, Code.UNAVAILABLE))
        for row in self.table.rows():
            if self.scheduler.discard(row.id) is not None:
                self.fail_rows(row, 0, row.bs, RuntimeError(self.dead))
        if self._on_death is not None:
            self._on_death(self.dead)

    def gauges(self) -> dict[Family, float]:
        """Queries waiting at the entry, and every query handed over and not yet answered."""
        waiting = len(self.entry)
        running = len({id(m.query) for row in self.table.rows() for m in row.members if not m.query.answered})
        return {WAITING: waiting, IN_FLIGHT: waiting + running}

    def close(self, timeout: float = 60) -> None:
        """Finish what was admitted, refuse what was still waiting, stop the executors."""
        for query in self.entry.close():
            query.answer(failure=Failure("the model is unloading", Code.UNAVAILABLE))
        if self.dead:  # nothing in flight will finish: do not wait for it
            timeout = min(timeout, 1.0)
        self.executors[0].join(timeout)
        if not self.table.wait_empty(timeout):
            log.error("unloading with %d batches still running", len(self.table))
            for row in self.table.rows():
                self.fail_rows(row, 0, row.bs, RuntimeError("the model is unloading"))
        for batch_queue in self.queues:
            batch_queue.put(None)
        for boundary in self.boundaries:
            boundary.close()
        for executor in self.executors[1:]:
            executor.join(timeout)
        self.exit.close(timeout)

    # What the executors need from around them (executor.Stage).

    def stage_inputs(self, row: BatchRow, item: BatchItem) -> dict[str, Any]:
        """The item's rows of the model's inputs, padded to the batch's sizes where it pads."""
        chunks = list(row.members_in(item.start, item.num))
        sizes = dict(row.shape.sizes)
        return {spec.name: self.device.from_host(stack([m.query.inputs[spec.name][q:q + n] for m, q, _, n in chunks],
                                                       spec, sizes, self.pad_values.get(spec.name, 0)))
                for spec in self.manifest.inputs}

    def leave(self, row: BatchRow, item: BatchItem, outputs: dict[str, Any]) -> None:
        """Rows leaving the last stage: answer every query whose rows are now all out, cut back
        to its own sizes where the batch padded it."""
        host = {name: self.device.to_host(outputs[name]) for name in self._outputs}
        for member, query_row, batch_row, num in row.members_in(item.start, item.num):
            query = member.query
            rows = slice(batch_row - item.start, batch_row - item.start + num)
            if query.answered:
                continue
            if num == query.rows:
                self.exit.answer(query, self._own(query, {name: array[rows] for name, array in host.items()}))
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
                self.exit.answer(query, self._own(query, partial))

    def _own(self, query: Query, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if not query.sizes:
            return outputs
        return {name: cut(array, self._outputs[name], query.sizes) for name, array in outputs.items()}

    def boundary(self, stage: int) -> Boundary:
        return self.boundaries[stage]

    def computed(self, stage: int) -> None:
        """Stage 0 handed its item on and takes queries next: ``execute`` may return, for Triton
        to send its next batch."""
        if stage == 0:
            self.entry.ready()

    def drop_cancelled(self, row: BatchRow, item: BatchItem) -> None:
        """At a stage boundary: answer the item's queries whose clients gave up (the executor then
        skips rows nobody waits for; see ``StageExecutor._compute``)."""
        now = time.monotonic()
        for member, *_ in row.members_in(item.start, item.num):
            if not member.query.answered and member.query.gave_up(now, CANCEL_IN_FLIGHT_S):
                self._forget(member.query)
                member.query.answer(failure=CANCELLED)

    def fail_rows(self, row: BatchRow, start: int, num: int, error: Exception) -> None:
        for member, *_ in row.members_in(start, num):
            self._forget(member.query)
            member.query.answer(failure=Failure(f"inference failed: {type(error).__name__}: {error}"))

    def _forget(self, query: Query) -> None:
        """Drop the rows gathered so far for a query answered otherwise."""
        with self._lock:
            self._partial.pop(query, None)
            self._filled.pop(query, None)
