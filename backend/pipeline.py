"""From client queries to answered queries: validation, batching by rows, the stage chain.

This is the single-entry single-exit skeleton: each batch runs through all stages in order on
one worker thread. The multi-entry multi-exit runtime (stage executors, batch table, buffer
pairs) replaces ``Pipeline`` and keeps ``Query``, ``validate``, ``take_batch``, ``stack`` and
``run_stages``.
Nothing here imports Triton: the backend's entry file turns requests into ``Query`` objects.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .engine import Engine
from .manifest import Manifest, StageSpec

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]


@dataclass(frozen=True)
class Failure:
    """Why a query got no outputs: its own bad input, or an error while running it."""

    message: str
    bad_input: bool


# Called exactly once per query: with its outputs, or with a Failure.
Responder = Callable[[Tensors | None, Failure | None], None]


@dataclass(eq=False)  # a query is itself, whatever its tensors hold
class Query:
    """One client request: its input tensors (rows first) and how to answer it."""

    inputs: Tensors
    respond: Responder
    requested_outputs: tuple[str, ...] = ()  # empty: all outputs

    @property
    def rows(self) -> int:
        return len(next(iter(self.inputs.values())))

    def answer(self, outputs: Tensors | None = None, failure: Failure | None = None) -> None:
        """Send the response; a failure to send (a client gone) must not stop the pipeline."""
        if outputs is not None and self.requested_outputs:
            outputs = {name: outputs[name] for name in self.requested_outputs}
        try:
            self.respond(outputs, failure)
        except Exception:  # noqa: BLE001 - the response channel is outside our control
            log.exception("could not send a response")


def validate(manifest: Manifest, query: Query) -> str | None:
    """Why ``query`` cannot run, or None. Names the tensor and what was expected."""
    specs = manifest.inputs
    named: dict[str, tuple[int, str]] = {}
    rows: int | None = None
    for spec in specs:
        array = query.inputs.get(spec.name)
        if array is None:
            return f"input '{spec.name}' is missing"
        if array.dtype != np.dtype(spec.dtype):
            return f"input '{spec.name}' has dtype {array.dtype.name}, expected {spec.dtype}"
        expected = ["batch", *(str(d) for d in spec.dims)]
        if array.ndim != len(expected):
            return (f"input '{spec.name}' has shape {list(array.shape)}, expected "
                    f"[{', '.join(expected)}]")
        if rows is None:
            rows = array.shape[0]
        elif array.shape[0] != rows:
            return f"input '{spec.name}' has {array.shape[0]} rows, other inputs have {rows}"
        for axis, (size, dim) in enumerate(zip(array.shape[1:], spec.dims), start=1):
            if isinstance(dim, int) and dim >= 0 and size != dim:
                return (f"input '{spec.name}' has size {size} on axis {axis}, expected {dim} "
                        f"(shape {list(array.shape)})")
            if isinstance(dim, str):
                first = named.setdefault(dim, (size, spec.name))
                if first[0] != size:
                    return (f"input '{spec.name}' has {dim}={size} but input '{first[1]}' has "
                            f"{dim}={first[0]}")
    if not rows:
        return "the request has no rows"
    if rows > manifest.max_batch_size:
        return f"the request has {rows} rows, more than max_batch_size {manifest.max_batch_size}"
    known = {spec.name for spec in manifest.outputs}
    unknown = [name for name in query.requested_outputs if name not in known]
    if unknown:
        return f"requested outputs {unknown} do not exist; the model has {sorted(known)}"
    return None


def shape_key(query: Query) -> tuple:
    """Queries with equal keys agree on every axis but the batch axis, so their rows can stack."""
    return tuple((name, array.shape[1:]) for name, array in sorted(query.inputs.items()))


def take_batch(waiting: deque[Query], max_rows: int) -> list[Query]:
    """Remove and return the oldest query with every later one that stacks with it, in order,
    up to ``max_rows`` rows: what Triton's dynamic batcher with no delay would run next."""
    first = waiting.popleft()
    batch, rows, key = [first], first.rows, shape_key(first)
    for query in list(waiting):
        if rows + query.rows <= max_rows and shape_key(query) == key:
            waiting.remove(query)
            batch.append(query)
            rows += query.rows
    return batch


def stack(queries: Sequence[Query]) -> Tensors:
    """One buffer holding every query's rows, in order."""
    names = queries[0].inputs.keys()
    return {name: np.concatenate([q.inputs[name] for q in queries]) for name in names}


def run_stages(engines: Sequence[Engine], stages: Sequence[StageSpec], buffer: Mapping[str, np.ndarray]) -> Tensors:
    """Run ``buffer`` through the stages in order; each stage sees only the previous one's buffer."""
    current = dict(buffer)
    for engine, stage in zip(engines, stages):
        computed = engine.run({t.name: current[t.name] for t in stage.inputs})
        current = {**{name: current[name] for name in stage.carry}, **computed}
    return current


class Pipeline:
    """Validates queries and runs them, stacked into batches, on a worker thread.

    ``submit`` never blocks on inference, so the caller (Triton's ``execute``) returns at once.
    The worker takes every query waiting when it becomes free and stacks those that fit into the
    next batch, so a busy pipeline still runs full batches.
    """

    def __init__(self, manifest: Manifest, engines: Sequence[Engine]):
        self._manifest = manifest
        self._engines = list(engines)
        self._queries: queue.SimpleQueue[Query | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="dvabatch-pipeline", daemon=True)
        self._worker.start()

    def submit(self, queries: Sequence[Query]) -> None:
        for query in queries:
            error = validate(self._manifest, query)
            if error:
                query.answer(failure=Failure(error, bad_input=True))
            else:
                self._queries.put(query)

    def close(self) -> None:
        """Finish the queries already submitted, then stop the worker."""
        self._queries.put(None)
        self._worker.join()

    def _work(self) -> None:
        waiting: deque[Query] = deque()
        closing = False
        while waiting or not closing:
            block = not waiting
            while not closing:
                try:
                    query = self._queries.get(block=block)
                except queue.Empty:
                    break
                block = False
                if query is None:
                    closing = True
                else:
                    waiting.append(query)
            if waiting:
                self._run(take_batch(waiting, self._manifest.max_batch_size))

    def _run(self, batch: list[Query]) -> None:
        try:
            outputs = run_stages(self._engines, self._manifest.stages, stack(batch))
        except Exception as exc:  # noqa: BLE001 - an engine error must cost only its own queries
            if len(batch) > 1:
                # Rerun the queries one by one so only the one that cannot run gets an error.
                for query in batch:
                    self._run([query])
                return
            batch[0].answer(failure=Failure(f"inference failed: {type(exc).__name__}: {exc}", bad_input=False))
            return
        start = 0
        for query in batch:
            end = start + query.rows
            query.answer({name: array[start:end] for name, array in outputs.items()})
            start = end
