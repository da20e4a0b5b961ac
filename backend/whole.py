"""Single-entry single-exit serving: what a plain Python model with Triton's batching does.

Serves a model whose policy stepped aside (``serving.Mode.FUSED``, ``IN_TURN``) and ``batching: triton``.
Triton's dynamic batcher forms the batch; it runs through every stage in one go and every query
is answered before ``run`` returns (so the backend returns the responses from ``execute``), with
the same engines and validation as the pipeline.

Requests whose inputs differ along a named axis arrive in one batch only when config.pbtxt
allows ragged batches (``allow_ragged_batch``). They are then padded to the longest in the batch
(``padding.py``), and outputs along that axis are cut back to each query's own size: the paper's
baseline for input diversity.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np

from .device import Device
from .engine import Engine, run_stages
from .manifest import Manifest
from .metrics import Metrics
from .padding import cut, pad
from .query import Failure, Query, refuse_invalid


class WholeBatch:
    """Runs each batch Triton hands over to completion and answers its queries."""

    def __init__(self, manifest: Manifest, engines: Sequence[Engine], device: Device, metrics: Metrics,
                 pad_values: Mapping[str, float] | None = None, size_limits: Mapping[str, int] | None = None):
        self.manifest, self.engines, self.device, self.metrics = manifest, engines, device, metrics
        self.pad_values = pad_values or {}
        self.size_limits = size_limits

    def run(self, queries: Sequence[Query]) -> None:
        good = refuse_invalid(self.manifest, queries, self.size_limits)
        if not good:
            return
        self.metrics.meta_operation("new")
        self.metrics.admitted(time.monotonic() - q.arrived for q in good)
        try:
            self._run(good)
        except Exception:  # noqa: BLE001 - rerun one by one: only a query that cannot run fails
            for query in good:
                try:
                    self._run([query])
                except Exception as exc:  # noqa: BLE001
                    query.answer(failure=Failure(f"inference failed: {type(exc).__name__}: {exc}"))

    def _run(self, queries: Sequence[Query]) -> None:
        sizes = [q.sizes for q in queries]
        longest = {name: max(s[name] for s in sizes) for name in sizes[0]}
        even = all(s == longest for s in sizes)  # nothing to pad or cut: the usual batch of equal shapes

        def stacked(spec) -> np.ndarray:
            if even:
                arrays = [q.inputs[spec.name] for q in queries]
            else:
                arrays = [pad(q.inputs[spec.name], spec, longest, self.pad_values.get(spec.name, 0)) for q in queries]
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

        feed = {spec.name: self.device.from_host(stacked(spec)) for spec in self.manifest.inputs}
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
