"""Single-entry single-exit serving: what a plain Python model with Triton's batching does.

Serves a model whose policy stepped aside (``serving.Mode.FUSED``, ``IN_TURN``) and ``batching:
triton``. Triton's dynamic batcher forms the batch; it runs through every stage in one go and
every query is answered before ``run`` returns (so the backend returns the responses from
``execute``), with the same engines and validation as the pipeline.

Requests whose inputs differ along the length axis arrive in one of Triton's batches (the slicer
writes ``allow_ragged_batch`` on that axis). A ``Former`` decides how they run: stages on the
host's cores (ONNX Runtime; torch on a CPU instance) where the policy stepped aside run them as
its ``form`` groups them (Policy I clusters
them by length, each group padded only to its own longest, which on a CPU costs far less than
padding all to the longest; without input diversity, equal shapes run together); other engines
and ``batching: triton`` run them all padded to the longest (``padded_to_longest``: the paper's
baseline for input diversity, and the fewest runs where the host's CPU, not the engine, is what
is dear; see ``serving.serve``). Outputs along the axis are cut back to each query's own size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from .device import Device
from .engine import Engine, run_stages
from .manifest import Manifest
from .metrics import Metrics
from .padding import cut, stack
from .query import BatchShape, Failure, Judged, Query, each_alone, refuse_invalid

log = logging.getLogger(__name__)

# The batches to run, in order, from queries that arrived together; may leave some for another call.
Former = Callable[[Sequence[Query]], list[tuple[list[Query], BatchShape]]]


def padded_to_longest(queries: Sequence[Query]) -> list[tuple[list[Query], BatchShape]]:
    return [(list(queries), BatchShape.of(queries, pads=True))]


class WholeBatch:
    """Runs each batch Triton hands over to completion and answers its queries."""

    def __init__(self, manifest: Manifest, engines: Sequence[Engine], device: Device, metrics: Metrics,
                 pad_values: Mapping[str, float] | None = None, size_limits: Mapping[str, int] | None = None,
                 form: Former = padded_to_longest):
        self.manifest, self.engines, self.device, self.metrics = manifest, engines, device, metrics
        self.pad_values = pad_values or {}
        self.size_limits = size_limits
        self.form = form
        self._judged: Judged = {}

    def run(self, queries: Sequence[Query]) -> None:
        pending = refuse_invalid(self.manifest, queries, self.size_limits, self._judged)
        if pending:
            self.metrics.admitted(time.monotonic() - q.arrived for q in pending)
        while pending:
            try:
                formed = self.form(pending)
            except Exception:  # a policy's bug must not fail the batch: pad them together
                log.exception("forming batches failed; running them padded to the longest")
                formed = []
            taken = {id(q) for batch, _ in formed for q in batch}
            if not taken:
                formed, taken = padded_to_longest(pending), {id(q) for q in pending}
            for batch, shape in formed:
                self.metrics.meta_operation("new")
                self._run_or_alone(batch, shape)
            pending = [q for q in pending if id(q) not in taken]

    def _run_or_alone(self, queries: list[Query], shape: BatchShape) -> None:
        try:
            self._run(queries, shape)
        except Exception:  # noqa: BLE001 - rerun one by one: only a query that cannot run fails
            each_alone(queries, lambda query: self._run([query], BatchShape.of([query])),
                       lambda query, exc: query.answer(failure=Failure.of(exc)))

    def _run(self, queries: Sequence[Query], shape: BatchShape) -> None:
        sizes = [q.sizes for q in queries]
        target = dict(shape.sizes) if shape.pads else sizes[0]
        even = all(s == target for s in sizes)  # nothing to pad or cut: the usual batch of equal shapes

        feed = {spec.name: self.device.from_host(stack([q.inputs[spec.name] for q in queries], spec, target,
                                                       self.pad_values.get(spec.name, 0)))
                for spec in self.manifest.inputs}
        rows = sum(q.rows for q in queries)
        outputs = run_stages(self.engines, self.manifest.stages, feed,
                             ran=lambda stage, seconds: self.metrics.stage_ran(stage, rows, seconds))
        host = {spec: self.device.to_host(outputs[spec.name]) for spec in self.manifest.outputs}
        start = 0
        for query, own in zip(queries, sizes):
            part = slice(start, start + query.rows)
            query.answer({spec.name: array[part] if even else cut(array[part], spec, own)
                          for spec, array in host.items()})
            start += query.rows
