"""The multi-entry multi-exit runtime: the wiring of the entry (``entry.py``), the stage
executors and their buffers, and the exit (``exit.py``).

``submit`` validates queries and hands them to the entry, waiting at most until stage 0 has
computed them, so Triton's ``execute`` returns while they are still in the pipeline and the next
queries can enter while earlier batches run (multi-entry). When the first executor is ready
for work the entry takes the waiting queries that stack together (after the batch window, if
any) and the scheduler makes them a new batch or stretches the latest one. Each query is
answered as soon as its own rows leave the last stage (multi-exit), wherever split or stretch
moved them. A batch may instead run through every stage in the caller's thread and be
answered before ``run`` returns (``runs_inline``): a batch that finds the pipeline empty, where
``decide.LoneRuns`` says so, and every batch while ``decide.ModeSwitch`` serves the model plain
(the pipeline drained first, so that no request overtakes one handed over before it); served
plain under a policy that holds queries back for more (``hold.py``), they are handed over and
run once it serves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .batch_table import BatchItem, BatchRow, BatchTable
from .buffers import Boundary
from .config import RuntimeConfig
from .device import CpuDevice, Device
from .engines import Engine
from .entry import CANCELLED, Entry
from .executor import BatchQueue, StageExecutor, Trace
from .exit import Exit
from .decide import LoneRuns, Mode
from .hold import Hold, batches
from .manifest import Manifest
from .metrics import EXECUTE_WAITS, IN_FLIGHT, WAITING, Family, Metrics
from .padding import Buckets, cut, stack
from .query import EXPIRED, Code, Failure, Judged, Query, Reply, Tensors, longest, refuse_invalid, rows_of
from .scheduler import Scheduler
from .whole import WholeBatch

log = logging.getLogger(__name__)
CANCEL_IN_FLIGHT_S = 0.1  # a query in the pipeline is asked once it is this old, then at most this often
BACKPRESSURE_MAX_S = 5.0  # ``submit`` waits for stage 0 to compute its queries at most this long (``wait_s``)
DRAIN_S = 0.05  # how often a switch to plain serving checks whether the pipeline has drained


class Runtime:
    def __init__(self, manifest: Manifest, engines: Sequence[Engine], config: RuntimeConfig | None = None,
                 device: Device | None = None, trace: Trace | None = None, metrics: Metrics | None = None,
                 on_death: Callable[[str], None] | None = None, buckets: Buckets = Buckets(),
                 fused: Sequence[Engine] = ()):
        """``on_death``: called once, with the reason, if an executor thread dies after all (the
        backend then has its stub replaced, as Triton cannot be told the model is not ready).
        ``fused``: the one engine of ``manifest.fused()``, which the batches run inline use where
        given (else they run the stages in turn)."""
        config = config or RuntimeConfig()
        self.dead: str | None = None
        self._on_death = on_death
        self.manifest = manifest
        self.device = device or CpuDevice()
        stages = len(manifest.stages)
        config.bind(manifest)
        self.pad_values = config.pad_values
        self.size_limits = config.size_limits(manifest)
        self.buckets = buckets
        self._judged: Judged = {}
        # Where a request's inputs show its length (``query.longest``), for ``LoneRuns``.
        self._length_at = next(((spec.name, at) for spec in manifest.inputs for at, dim in spec.named
                                if dim == manifest.length_axis), None) if manifest.length_axis else None
        self.table = BatchTable(stages, manifest.max_batch_size)
        self.metrics = metrics or Metrics()
        self.queues = [BatchQueue() for _ in range(stages - 1)]
        self.scheduler = Scheduler(self.table, config.policy, metrics=self.metrics,
                                   release=lambda stage, item: self.queues[stage - 1].put(item),
                                   left=lambda: self.entry.wake())
        window = config.batch_window_ms / 1000 if config.batch_window_ms >= 0 else None
        self.entry = Entry(self.scheduler, manifest.max_batch_size, window, config.queue)
        self._reject = config.queue.reject  # a query past its timeout is answered, not computed
        self.boundaries = [Boundary(i, config.buffer_pairs, self.device.event) for i in range(stages - 1)]
        self._layouts = {t.name: t.named for t in manifest.outputs}  # each output's named axes, read per item
        self._partial: dict[Query, dict[str, np.ndarray]] = {}
        self._filled: dict[Query, int] = {}
        self._lock = threading.Lock()
        self.exit = Exit(sent=self.metrics.answered)
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
        # Batches run inline: the whole model as one engine where it is given, else the same
        # engines, one stage after another (``serving.serve`` sets what decides when: ``lone``,
        # and ``mode`` through the ``watch``).
        self.plain = WholeBatch(manifest.fused() if fused else manifest, fused or engines, self.device, self.metrics,
                                self.pad_values, self.size_limits, config.policy.form_inline, buckets, config.policy,
                                config.queue.reject, alike_together=True)
        self.lone: LoneRuns | None = None
        self.held: Hold | None = None  # served plain, the queries the policy holds back (``serving.serve``)
        self.mode = Mode.PIPELINE
        self.watch = None  # serving.Watch, where a ModeSwitch decides the mode or EntryWait the entry's wait
        self.wait_s = 0.0  # ``submit`` returns once stage 0 has computed its queries, at most after this long
        self._drained = False  # nothing submitted since the pipeline was last seen empty

    def submit(self, queries: Sequence[Query], whole: bool = False) -> None:
        """Validate and hand over; never waits for inference. With ``wait_s``, return once stage 0
        has computed them (``Entry.wait_ready``), at most after that long. Served plain with a
        hold (``held``), they are held, and run here once the policy serves. ``whole``: they
        enter as one batch (``Entry.put``)."""
        if self.dead:
            for query in queries:
                query.answer(failure=Failure(self.dead, Code.UNAVAILABLE))
            return
        valid = refuse_invalid(self.manifest, queries, self.size_limits, self._judged)
        if self.held is not None:
            if self.mode is not Mode.PIPELINE:
                self.held.put(valid)
                return
            if len(self.held):  # held while the model served plain: they enter first
                valid = self.held.take() + valid
        self._drained = False
        self.entry.put(valid, whole)
        if self.wait_s > 0:
            self.entry.wait_ready(self.wait_s)

    def runs_inline(self, inputs: Sequence[Tensors] = ()) -> bool:
        """Asked by ``execute`` before it hands its batch (its requests' ``inputs``) over: whether
        the batch runs inside ``execute`` instead (``run``): always while the model serves plain
        (once the pipeline has drained), and a lone batch where ``lone`` says so, at its rows and
        its longest length (read only then: served plain, a call pays nothing for them).
        ``execute`` is called by one thread at a time (one instance, one stub), so once drained,
        the pipeline stays empty until the next ``submit``: while serving plain, the drain is not
        looked at again (three locks an ``execute``). Served plain with a hold, every batch is
        handed over (``submit``)."""
        if self.mode is not Mode.PIPELINE and not self.dead:
            if not self._drained:
                while (len(self.entry) or len(self.table) or self.exit.pending) and not self.dead:
                    if self.table.wait_empty(DRAIN_S):
                        self.exit.wait_sent(DRAIN_S)
                self._drained = True
            return self.held is None
        if self.lone is None:
            return False
        # Nothing waits at the entry and no batch is in the pipeline, checked in that order:
        # stage 0 admits under the entry's lock, so a batch taken from it is in the table by then.
        idle = not len(self.entry) and not len(self.table)
        if not idle:
            return self.lone.inline(False)
        inline = self.lone.inline(True, sum(map(rows_of, inputs)), longest(inputs, self._length_at))
        self.metrics.lone(inline)
        return inline

    def run(self, queries: Sequence[Query], meanwhile: Callable[[], None] | None = None) -> None:
        """Run a batch through every stage in the caller's thread and answer it before
        returning, where ``runs_inline`` said so: the executors wait meanwhile (nothing is in the
        pipeline, and only the caller submits), so the engines are the caller's. ``meanwhile``:
        as ``WholeBatch.run``'s."""
        if self.dead:
            self.submit(queries)
            if meanwhile is not None:
                meanwhile()
            return
        if self.mode is Mode.PIPELINE:  # a lone batch: the pipeline's window reads the arrival rate
            self.entry.arrived(query.arrived for query in queries)
        self.plain.run(queries, meanwhile)

    def run_straight(self, inputs: Sequence[Tensors], meanwhile: Callable[[list[Reply]], None]) -> int:
        """``WholeBatch.run_straight``, asked once ``runs_inline`` said so: while the model serves
        plain (the pipeline drained, no hold), and for a lone batch, whose requests still count in
        the arrival rate the pipeline's window reads (as a lone batch run as queries counts,
        ``run``); 0 once it cannot serve."""
        if self.dead:
            return 0
        if self.mode is not Mode.PIPELINE:
            return self.plain.run_straight(inputs, meanwhile)
        now = time.monotonic()
        rows = self.plain.run_straight(inputs, meanwhile)
        if rows:
            self.entry.arrived([now] * len(inputs))
        return rows

    def run_held(self, queries: list[Query]) -> None:
        """Run the queries a hold let go (``hold.Hold``: inside ``execute``, or on the hold's
        thread once its wait bound ended), in batches of at most the model's largest; where the
        model pipelines again by then, they enter the pipeline."""
        if self.dead or self.mode is Mode.PIPELINE:
            self.submit(queries)
            return
        for batch in batches(queries, self.manifest.max_batch_size):
            self.plain.run(batch)

    @property
    def ready(self) -> bool:
        """Whether it can serve: no executor died and every executor thread runs."""
        return self.dead is None and all(executor.is_alive() for executor in self.executors)

    def executor_died(self, stage: int, error: BaseException) -> None:
        """An executor thread ended on an error nothing could recover from: every query held
        anywhere is answered, and every later one refused, rather than left hanging."""
        with self._lock:
            if self.dead:
                return
            self.dead = (f"stage {stage}'s executor died ({type(error).__name__}: {error}); "
                         "the model must be loaded again")
        for query in [*self.entry.close(), *(self.held.take() if self.held is not None else ())]:
            query.answer(failure=Failure(self.dead, Code.UNAVAILABLE))
        for row in self.table.rows():
            if self.scheduler.discard(row.id) is not None:
                self.fail_rows(row, 0, row.bs, RuntimeError(self.dead))
        if self._on_death is not None:
            self._on_death(self.dead)

    def gauges(self) -> dict[Family, float]:
        """Queries waiting at the entry, every query handed over and not yet answered, and
        whether ``execute`` waits for stage 0 (``wait_s``)."""
        waiting = len(self.entry) + (len(self.held) if self.held is not None else 0)
        running = len({id(m.query) for row in self.table.rows() for m in row.members if not m.query.answered})
        return {WAITING: waiting, IN_FLIGHT: waiting + running, EXECUTE_WAITS: float(self.wait_s > 0)}

    def close(self, timeout: float = 60) -> None:
        """Finish what was admitted, refuse what was still waiting, stop the executors."""
        if self.watch is not None:
            self.watch.stop()
        for query in [*(self.held.close() if self.held is not None else ()), *self.entry.close()]:
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
        """The item's rows of the model's inputs, padded to the batch's sizes where it pads, and
        on to a bucket of the stages' CUDA graphs where they have them."""
        chunks = list(row.members_in(item.start, item.num))
        sizes = dict(row.shape.sizes)
        if self.buckets.sizes:
            sizes = self.buckets.pad(sizes or chunks[0][0].query.sizes)
        return {spec.name: self.device.from_host(stack([m.query.inputs[spec.name][q:q + n] for m, q, _, n in chunks],
                                                       spec, sizes, self.pad_values.get(spec.name, 0)))
                for spec in self.manifest.inputs}

    def leave(self, row: BatchRow, item: BatchItem, outputs: dict[str, Any]) -> None:
        """Rows leaving the last stage: answer every query whose rows are now all out, cut back
        to its own sizes where the batch padded it. Each output is copied once for the item (an
        answer is sent later, from the exit's threads, and must not be a view of an engine's
        array a later batch may overwrite); a query's answer is its rows of that copy."""
        host = [(name, named, np.array(self.device.to_host(outputs[name]))) for name, named in self._layouts.items()]
        held: dict[str, set[int]] = {}  # each named axis's sizes in this item's outputs
        for _, named, array in host:
            for axis, dim in named:
                held.setdefault(dim, set()).add(array.shape[axis])
        for member, query_row, batch_row, num in row.members_in(item.start, item.num):
            query = member.query
            if query.answered:
                continue
            rows = slice(batch_row - item.start, batch_row - item.start + num)
            if num == query.rows:
                self.exit.answer(query, self._own(query, host, held, rows))
                continue
            with self._lock:  # a query split across items: gather its rows
                partial = self._partial.setdefault(
                    query, {n: np.empty((query.rows, *a.shape[1:]), a.dtype) for n, _, a in host})
                for name, _, array in host:
                    partial[name][query_row:query_row + num] = array[rows]
                self._filled[query] = self._filled.get(query, 0) + num
                done = self._filled[query] == query.rows
                if done:
                    del self._partial[query], self._filled[query]
            if done:
                whole = [(name, self._layouts[name], array) for name, array in partial.items()]
                self.exit.answer(query, self._own(query, whole, held, slice(None)))

    @staticmethod
    def _own(query: Query, outputs: list[tuple[str, tuple, np.ndarray]], held: dict[str, set[int]],
             rows: slice) -> dict[str, np.ndarray]:
        """The query's ``rows`` of each output, cut back along the named axes where the batch
        held more than the query's own sizes (``held``)."""
        if all(held.get(dim, {size}) == {size} for dim, size in query.sizes.items()):
            return {name: array[rows] for name, _, array in outputs}
        return cut(outputs, query.sizes, rows)

    def boundary(self, stage: int) -> Boundary:
        return self.boundaries[stage]

    def computed(self, stage: int) -> None:
        """Stage 0 handed its item on and takes queries next: ``execute`` may return, for Triton
        to send its next batch. A later stage freed sooner or later than predicted: the entry's
        window, if it waits one, is decided again."""
        if stage == 0:
            self.entry.ready()
        else:
            self.entry.wake()

    def drop_cancelled(self, row: BatchRow, item: BatchItem) -> None:
        """At a stage boundary: answer the item's queries whose timeout expired (timeout action
        REJECT, as at the entry) or whose clients gave up, before they cost another stage (the
        executor then skips rows nobody waits for; see ``StageExecutor._compute``)."""
        now = time.monotonic()
        for member, *_ in row.members_in(item.start, item.num):
            query = member.query
            if query.answered:
                continue
            if self._reject and query.expired(now):
                self._forget(query)
                query.answer(failure=EXPIRED)
            elif query.gave_up(now, CANCEL_IN_FLIGHT_S):
                self._forget(query)
                query.answer(failure=CANCELLED)

    def fail_rows(self, row: BatchRow, start: int, num: int, error: Exception) -> None:
        for member, *_ in row.members_in(start, num):
            self._forget(member.query)
            member.query.answer(failure=Failure.of(error))

    def _forget(self, query: Query) -> None:
        """Drop the rows gathered so far for a query answered otherwise."""
        with self._lock:
            self._partial.pop(query, None)
            self._filled.pop(query, None)
