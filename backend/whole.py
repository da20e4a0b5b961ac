"""Single-entry single-exit serving: what a plain Python model with Triton's batching does.

Serves a model whose policy stepped aside (``serving.Mode.FUSED``, ``IN_TURN``), ``batching:
triton``, and a pipeline's batches run inside ``execute`` (``Runtime.plain``: while its mode
switch serves plain, and its lone batches). Triton's dynamic batcher forms the batch; it runs
through every stage in one go and every query is answered before ``run`` returns (so the
backend returns the responses from ``execute``), with the same validation as the pipeline.
Where the engines run ahead of the host (a GPU; timed), the queries are answered with the
arrays their results land in before the host waits for them, and ``run``'s caller builds its
responses meanwhile.

Requests whose inputs differ along the length axis arrive in one of Triton's batches (the slicer
writes ``allow_ragged_batch`` on that axis). A ``Former`` decides how they run: stages on the
host's cores (ONNX Runtime; torch on a CPU instance) where the policy stepped aside run them as
its ``form`` groups them (Policy I clusters them by length, each group padded only to its own
longest, which on a CPU costs far less than padding all to the longest; without input
diversity, equal shapes run together); engines that overlap (a GPU; timed) run them as one
batch or, where the tables say two runs take less in all, two (``Policy.form_inline``); and
``batching: triton`` runs them all padded to the longest (``together``: the paper's baseline
for input diversity; see ``serving.serve``). Outputs along the axis are cut back to each
query's own size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter

from .device import Device
from .engines import Engine, run_stages
from .manifest import Manifest
from .metrics import Metrics
from .padding import Buckets, cut, stack
from .policy import Policy
from .query import (BatchShape, Failure, Judged, Query, Reply, Tensors, each_alone, refuse_hopeless, refuse_invalid,
                    signature, valid_before, waited)

log = logging.getLogger(__name__)

_ROWS = itemgetter(0)  # a run's rows (``runs``: each batch run, its rows and its clock)

# The batches to run, in order, from queries that arrived together; may leave some for another call.
Former = Callable[[Sequence[Query]], list[list[Query]]]


def together(queries: Sequence[Query]) -> list[list[Query]]:
    """All in one batch, padded to the longest."""
    return [list(queries)]


def _alike(signatures: set[tuple]) -> bool:
    """Whether inputs of these signatures differ in their rows alone."""
    return len({tuple([(name, dtype, shape[1:]) for name, dtype, shape in key]) for key in signatures}) == 1


class WholeBatch:
    """Runs each batch Triton hands over to completion and answers its queries. A batch is
    padded along each named axis to its longest query (none where they agree, the usual case,
    which costs no more than the plain model's concatenation), and on up to a bucket of its CUDA
    graphs where it has them (``buckets``). Its engines' work goes on one stream of its own,
    waited for once at the end of ``run``. With ``reject`` (Triton's REJECT timeout action), a
    query the policy finds cannot meet its deadline (``Policy.hopeless``: by default, whose
    timeout expired; ``policy: slo``'s rule), or that running with the others would make late
    (``Policy.late_together``), is answered with Triton's timeout error and not run. A call
    that ran one batch tells a policy that learns how long it took (``Policy.observe``:
    ``policy: slo`` learns how long queries take)."""

    def __init__(self, manifest: Manifest, engines: Sequence[Engine], device: Device, metrics: Metrics,
                 pad_values: Mapping[str, float] | None = None, size_limits: Mapping[str, int] | None = None,
                 form: Former = together, buckets: Buckets = Buckets(), policy: Policy | None = None,
                 reject: bool = True, alike_together: bool = False):
        self.manifest, self.engines, self.device, self.metrics = manifest, engines, device, metrics
        self.pad_values = pad_values or {}
        self.buckets = buckets
        self.size_limits = size_limits
        self.form = form
        self.policy = policy or Policy()
        self.reject = reject
        self._judged: Judged = {}
        self._stream = device.stream()
        self._columns = [(spec, itemgetter(spec.name), self.pad_values.get(spec.name, 0)) for spec in manifest.inputs]
        # One engine (fused, or a model of one stage) that takes the model's inputs and gives its outputs: run
        # directly, without the chain's bookkeeping (at 1 in flight a model served plain pays it every call).
        one = manifest.stages[0]
        self._one = engines[0] if len(engines) == 1 and not one.carry and (one.inputs, one.outputs) == \
            (manifest.inputs, manifest.outputs) else None
        # Requests without a deadline need no Query where the policy neither learns from their run
        # nor refuses one without a deadline, and no bucket pads them (``run_straight``); several
        # only where ``form`` runs requests of one shape as one batch (``together``;
        # ``Policy.form_inline``; on the host's cores, ``Policy.forms_alike_whole``), which
        # ``alike_together`` says.
        self._straight = not buckets.sizes and not self.policy.learns and not (reject and self.policy.may_refuse(()))
        self._alike_together = alike_together

    ready = True  # no threads to lose

    def runs_inline(self, inputs: Sequence[Tensors] = ()) -> bool:
        """Every batch runs inside ``execute`` (``serving.Server``)."""
        return True

    def submit(self, queries: Sequence[Query]) -> None:
        self.run(queries)

    def gauges(self) -> dict:
        return {}

    def close(self) -> None:
        """Nothing runs once ``execute`` has returned."""

    def run(self, queries: Sequence[Query], meanwhile: Callable[[], None] | None = None) -> None:
        """Run and answer ``queries``; return once the engines are done. ``meanwhile`` is called
        once, when every query is answered and before the host waits for the engines: on
        engines that run ahead of the host (a GPU; timed), the answers' arrays are filled by
        the time this returns, so the caller may build its responses on them meanwhile (the
        backend's entry file does: at TensorRT speed a batch's responses cost the host about as
        long as the engines take to answer it, and that time no longer adds up). An error that
        only the wait reveals (a GPU's asynchronous fault, which leaves its context unusable
        anyway) is raised from here, for the whole call."""
        if len(queries) == 1 and not self.buckets.sizes:
            self._run_lone(queries[0], meanwhile)
            return
        runs: list[tuple[int, list[float]]] = []  # each batch run: its rows, and the clock before and after each stage
        called = time.monotonic()
        with self.device.running_on(self._stream):
            ran, admitted, waited_s, batches = self._run_formed(queries, runs)
        if meanwhile is not None:
            meanwhile()
        self._ended(runs, called, admitted, waited_s, batches, ran)

    def run_straight(self, inputs: Sequence[Tensors], meanwhile: Callable[[list[Reply]], None]) -> int:
        """Run the requests of one call Triton handed over, given as their inputs, where nothing
        about them needs a ``Query``: the caller found none has a deadline (no timeout of its own,
        none by the queue policy), the policy neither learns nor refuses one without a deadline,
        no bucket pads them, inputs of each one's signature were judged valid before, and, where
        there are several, they are of one shape but for their rows and ``form`` runs such
        requests as one batch: stacked, nothing to pad or cut. Their replies, in order, go to
        ``meanwhile`` before the host waits for the engines, as ``run``'s ``meanwhile`` is called.
        Returns the rows run (for ``arrival.TritonQueue.called``), or 0, with nothing done, where
        they need more: the caller takes the way of ``run``, which judges a signature first seen
        and answers an invalid query. Served plain at TensorRT speed, one request in flight, the
        stub's CPU a request fell from 270 to 236 us and from 302 to 280 (the plain model's 239
        and 258); at near-zero compute by 0-16 us in five runs, once 18 more, within this host's
        noise (docs/results/lone-request-straight). With calls of several requests taken too,
        near-zero compute under 1,200 and 2,400 Poisson requests/s answered in 1.01x and 1.20x
        the plain model's mean, against 1.17x and 1.47x (docs/results/check-auto-pause-handoff);
        with the arrival spread left to queries and a cheaper fold of the counters, the stub's
        CPU over the plain model's at 2,400/s went from 15 to 7 us a request
        (docs/results/served-plain-bookkeeping)."""
        if not self._straight:
            return 0
        runs: list[tuple[int, list[float]]] = []
        if len(inputs) == 1:  # (most calls: one request, judged without a set of signatures)
            if not valid_before(self._judged, signature(inputs[0])):
                return 0
            called = time.monotonic()
            replies = [self._one_query(inputs[0], runs)]
        else:
            signatures = {signature(each) for each in inputs}
            if not (self._alike_together and all(valid_before(self._judged, key) for key in signatures)
                    and (len(signatures) == 1 or _alike(signatures))):
                return 0
            called = time.monotonic()
            replies = self._run_alike(inputs, runs)
        meanwhile(replies)
        self._ended(runs, called, len(inputs), 0.0, 1, None)
        return sum(map(_ROWS, runs)) or len(inputs)  # (runs: none where every request failed)

    def _run_alike(self, inputs: Sequence[Tensors], runs: list) -> list[Reply]:
        """The replies of requests of one shape, run as one batch; where the engines fail on it,
        each runs as its own (``_one_query``), so that only a request that cannot run fails."""
        device = self.device
        try:
            with device.running_on(self._stream):
                feed = {spec.name: device.from_host(stack(list(map(column, inputs)), spec, {}))
                        for spec, column, _ in self._columns}
                outputs = self._stages(feed, len(next(iter(feed.values()))), runs)
                host = [(spec.name, device.copy_out(outputs[spec.name])) for spec in self.manifest.outputs]
        except Exception:  # noqa: BLE001 - rerun one by one: only a request that cannot run fails
            return [self._one_query(each, runs) for each in inputs]
        replies, start = [], 0
        for each in inputs:
            end = start + len(next(iter(each.values())))
            replies.append(({name: array[start:end] for name, array in host}, None))
            start = end
        return replies

    def _run_lone(self, query: Query, meanwhile: Callable[[], None] | None) -> None:
        """``run`` for one query, the usual call at low load, admitted and run as its own batch
        (``_one_query``). Inside a stub each call and frame on the way costs several times what a
        warm loop shows: going through ``_run_formed`` and ``_run`` cost the stub 13 us more CPU a
        request served plain at near-zero compute (docs/results/zero-poisson-stub-cpu)."""
        runs: list[tuple[int, list[float]]] = []
        called = time.monotonic()
        admitted = self._admit((query,))
        if admitted:
            query.answer(*self._one_query(query.inputs, runs))
        if meanwhile is not None:
            meanwhile()
        self._ended(runs, called, len(admitted), waited(admitted, called), len(admitted),
                    admitted if runs else None)

    def _one_query(self, inputs: Tensors, runs: list) -> Reply:
        """One query's reply, run as its own batch at its own sizes, with nothing to form, stack,
        pad or cut. A query the engines fail on fails alone."""
        device, specs = self.device, self.manifest.inputs
        with device.running_on(self._stream):
            try:
                outputs = self._stages({spec.name: device.from_host(inputs[spec.name]) for spec in specs},
                                       len(inputs[specs[0].name]), runs)
                return {spec.name: device.copy_out(outputs[spec.name]) for spec in self.manifest.outputs}, None
            except Exception as exc:  # noqa: BLE001 - its own failure, answered
                return None, Failure.of(exc)

    def _ended(self, runs: list, called: float, admitted: int, waited_s: float, batches: int,
               ran: list[Query] | None) -> None:
        """After the engines were given a call's batches and its responses were built (``meanwhile``):
        the wait for the engines (the last stage launched saw it end), the counters, and what a
        policy that learns hears."""
        began = time.monotonic()
        self.device.finish(self._stream)
        ended = time.monotonic()
        if runs:  # the wait belongs to the stages launched last, which it saw finish
            runs[-1][1][-1] += ended - began
        if admitted:
            self.metrics.ran_inline(admitted, waited_s, batches, runs)
        if ran is not None and self.policy.learns:  # one batch run as one: from the call to the engines' end
            self._observe(ran, ended - called)

    def _observe(self, batch: list[Query], seconds: float) -> None:
        try:
            self.policy.observe(range(len(self.engines)), sum(q.rows for q in batch),
                                BatchShape.of(batch, pads=True), batch[0], seconds)
        except Exception:  # a policy's bug must not fail the answered batch
            log.exception("policy %r failed to observe a batch", self.policy.name)

    def _run_formed(self, queries: Sequence[Query], runs: list) -> tuple[list[Query] | None, int, float, int]:
        """Run ``queries`` as the former says; the batch, where it ran them as one, the queries
        admitted, the seconds they waited in all and the batches they ran in."""
        pending = self._admit(queries)
        if not pending:
            return None, 0, 0.0, 0
        admitted, waited_s = len(pending), waited(pending, time.monotonic())
        batches, whole = 0, None
        while pending:
            try:  # whatever a former says, a lone query runs alone
                formed = [pending] if len(pending) == 1 else self.form(pending)
            except Exception:  # a policy's bug must not fail the batch: pad them together
                log.exception("forming batches failed; running them padded to the longest")
                formed = []
            taken = sum(map(len, formed))
            if not taken:
                formed, taken = together(pending), len(pending)
            batches += len(formed)
            for batch in formed:
                whole = batch if self._run_or_alone(batch, runs) else None
            if taken < len(pending):
                chosen = {id(q) for batch in formed for q in batch}
                pending = [q for q in pending if id(q) not in chosen]
            else:
                pending = []
        return (whole if batches == 1 else None), admitted, waited_s, batches

    def _admit(self, queries: Sequence[Query]) -> list[Query]:
        """The queries that may run: each other one is answered with why not (invalid; with
        ``reject``, one the policy finds cannot meet its deadline)."""
        pending = refuse_invalid(self.manifest, queries, self.size_limits, self._judged)
        if self.reject and self.policy.may_refuse(pending):
            pending = refuse_hopeless(pending, self.policy.hopeless, self.policy.late_together)
        return pending

    def _run_or_alone(self, queries: list[Query], runs: list) -> bool:
        """Whether the batch ran as one (else its queries ran one by one)."""
        try:
            self._run(queries, runs)
            return True
        except Exception:  # noqa: BLE001 - rerun one by one: only a query that cannot run fails
            each_alone(queries, lambda query: self._run([query], runs),
                       lambda query, exc: query.answer(failure=Failure.of(exc)))
            return False

    def _run(self, queries: Sequence[Query], runs: list) -> None:
        sizes = [q.sizes for q in queries]
        first = sizes[0]
        longest = first if sizes.count(first) == len(sizes) else {name: max(s[name] for s in sizes) for name in first}
        pad_to = self.buckets.pad(longest)
        even = longest is first and pad_to == first  # one shape, a bucket's if any: nothing to pad or cut
        pad_to = {} if even else pad_to
        inputs = [q.inputs for q in queries]
        feed = {spec.name: self.device.from_host(stack(list(map(column, inputs)), spec, pad_to, pad))
                for spec, column, pad in self._columns}
        outputs = self._stages(feed, len(next(iter(feed.values()))), runs)
        host = [(spec.name, spec.named, self.device.copy_out(outputs[spec.name])) for spec in self.manifest.outputs]
        start = 0
        for query, own in zip(queries, sizes):
            end = start + query.rows
            query.answer({name: array[start:end] for name, _, array in host} if even
                         else cut(host, own, slice(start, end)))
            start = end

    def _stages(self, feed: dict, rows: int, runs: list) -> dict:
        """The stages' outputs for ``feed``; the run, its rows and the clock around each stage, go in ``runs``."""
        clock = [time.monotonic()]
        if self._one is not None:
            outputs = self._one.run(feed)
            clock.append(time.monotonic())
        else:
            outputs = run_stages(self.engines, self.manifest.stages, feed, clock)
        runs.append((rows, clock))
        return outputs
