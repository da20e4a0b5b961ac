"""A torch stage replayed as one CUDA graph per shape bucket, captured once, off the serving path.

Why: our interpreter (``onnx_torch.py``) makes one Python call per ONNX node, some 4 ms a stage
of BERT-base whatever the batch, where the GPU's own work is a fraction of that. A CUDA graph
records the kernels of one run and replays them in one launch, so a stage then costs what its
kernels cost. A graph holds fixed shapes and fixed addresses, so:

- **buckets**: a batch of ``n`` rows runs in the graph of the smallest row bucket ``>= n``, its
  rows copied into that graph's static inputs (the rows past ``n`` keep earlier rows: real data,
  computed and thrown away, since rows never mix), and its outputs' first ``n`` rows copied out
  (one device copy each way; the outputs must outlive the next replay). The other axes must
  match a captured graph exactly: the backend pads a batch's length to a length bucket before it
  enters (``padding.Buckets``), so that every stage sees bucket lengths;
- **capture** happens while ``capturing`` is on: at load, the backend runs every bucket once
  (``engines.warm_up``) and turns it off. A shape no graph holds then runs eagerly, logged once;
  a graph that cannot be captured (an operator that reads device data on the host) too. A caller
  that cannot know its shapes ahead (the ensemble peer's steps) leaves it on, under ``limit``;
- **one memory pool per stage**, shared by its graphs: replays of one stage never overlap (an
  event orders each after the last, on whichever stream), so its graphs may reuse each other's
  intermediate memory; the largest bucket is captured first, so the others fit in its blocks;
- on the **CPU** (where CUDA graphs do not exist) the same bucketing, padding and cutting run on
  the static buffers, the graph rerun eagerly: what the tests check without a GPU.

Pure torch: no Triton, no imports from the backend (the plain peer copies this file beside
``onnx_torch.py``). The graph it replays is anything with ``run(inputs, outputs) -> dict``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

log = logging.getLogger(__name__)


class Graph(Protocol):
    device: torch.device

    def run(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, torch.Tensor]: ...


Key = tuple  # (row bucket, (input name, shape without the batch axis, dtype) ...)


@dataclass
class Captured:
    """One bucket's graph (None on the CPU) and the static tensors it reads and writes."""

    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    graph: Any = None


class ShapeGraphs:
    """``graph`` run as captured CUDA graphs, one per (row bucket, other input dims); see the
    module docstring. ``rows``: the row buckets, increasing."""

    def __init__(self, graph: Graph, rows: Sequence[int], name: str = "stage"):
        if not rows or list(rows) != sorted(set(rows)) or rows[0] < 1:
            raise ValueError(f"row buckets must be increasing positive sizes, got {list(rows)}")
        self.graph, self.rows, self.name = graph, tuple(rows), name
        self.device = graph.device
        self._cuda = self.device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self._cuda else None
        self._done = torch.cuda.Event() if self._cuda else None  # the last replay, on whichever stream
        # Captures run on one side stream: the allocator caches blocks per stream, so a stream per
        # capture kept every warm-up run's memory (a GPU's worth over a model's buckets).
        self._side = torch.cuda.Stream(self.device) if self._cuda else None
        self._captured: dict[Key, Captured | None] = {}  # None: could not be captured, runs eagerly
        self._eager: set[Key] = set()  # shapes no graph holds, logged once
        self.capturing = True
        self.limit = 1 << 30  # graphs at most: a caller that captures shapes as they come bounds them
        self.failures: dict[Key, str] = {}  # why a shape could not be captured
        self.reserved = 0  # bytes of device memory the capture took (set by ``engines.warm_up``)

    @property
    def graphs(self) -> int:
        return sum(entry is not None for entry in self._captured.values())

    def bucket(self, rows: int) -> int | None:
        """The row bucket ``rows`` run in; None past the largest."""
        return next((b for b in self.rows if b >= rows), None)

    @torch.inference_mode()
    def run(self, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        tensors = {name: _tensor(value, self.device) for name, value in inputs.items()}
        rows = len(next(iter(tensors.values())))
        bucket = self.bucket(rows)
        key = (bucket, *((name, tuple(t.shape[1:]), t.dtype) for name, t in tensors.items()))
        if key not in self._captured:
            if bucket is None or not self.capturing or self.graphs >= self.limit:
                return self._run_eagerly(key, tensors, outputs)
            self._captured[key] = self._capture(key, tensors, bucket, outputs)
        entry = self._captured[key]
        if entry is None:
            return self.graph.run(tensors, outputs)
        return self._replay(entry, tensors, rows)

    def _run_eagerly(self, key: Key, tensors: dict[str, torch.Tensor], outputs) -> dict[str, torch.Tensor]:
        if key not in self._eager:
            self._eager.add(key)
            why = "more rows than the largest bucket" if key[0] is None else "a shape captured for no bucket"
            log.warning("%s: %s runs eagerly (%s; buckets of rows %s)", self.name, _shapes(key), why, list(self.rows))
        return self.graph.run(tensors, outputs)

    def _replay(self, entry: Captured, tensors: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
        if self._cuda:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self._done)  # the static buffers are free once the last replay is done
        for name, tensor in tensors.items():
            entry.inputs[name][:rows].copy_(tensor)
        if entry.graph is not None:
            entry.graph.replay()
        else:  # the CPU: the same buffers, rerun
            for name, value in self.graph.run(entry.inputs, list(entry.outputs)).items():
                entry.outputs[name].copy_(value)
        result = {name: out[:rows].clone() for name, out in entry.outputs.items()}
        if self._cuda:
            self._done.record(stream)
        return result

    def _capture(self, key: Key, tensors: dict[str, torch.Tensor], bucket: int, outputs) -> Captured | None:
        """The bucket's graph, on static inputs holding ``tensors``' rows repeated to the bucket;
        None (logged) where it cannot be captured."""
        static = {name: _repeat_rows(t, bucket) for name, t in tensors.items()}
        if not self._cuda:
            return Captured(static, {n: o.clone() for n, o in self.graph.run(static, outputs).items()})
        current = torch.cuda.current_stream(self.device)
        side = self._side
        side.wait_stream(current)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                # One eager run first: it copies the host values to the device (``TorchGraph``
                # keeps them per shape) and sets up cuBLAS and cuDNN, which a capture cannot.
                self.graph.run(static, outputs)
                graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
                try:
                    written = self.graph.run(static, outputs)
                finally:
                    graph.capture_end()
        except Exception as exc:  # noqa: BLE001 - the stage still runs, eagerly, for this shape
            torch.cuda.synchronize(self.device)
            self.failures[key] = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.warning("%s: %s cannot be captured as a CUDA graph, runs eagerly: %s", self.name, _shapes(key),
                        self.failures[key])
            return None
        current.wait_stream(side)
        return Captured(static, dict(written), graph)


def _tensor(value: Any, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
    return tensor if tensor.device == device else tensor.to(device)


def _repeat_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``rows`` rows: ``tensor``'s, repeated from its first on (valid inputs for the padding rows)."""
    index = torch.arange(rows, device=tensor.device) % len(tensor)
    return tensor.index_select(0, index).contiguous()


def _shapes(key: Key) -> str:
    bucket, *inputs = key
    return ", ".join(f"{name} [{bucket or '>'}, {', '.join(map(str, dims))}]" for name, dims, _ in inputs)
