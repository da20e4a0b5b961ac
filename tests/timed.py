"""Timed models for schedule tests: stages that take a tabulated time and pass rows through."""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np

from backend.config import RuntimeConfig
from backend.device import make_device
from backend.engines import load_engines
from backend.manifest import LatencyTable, Manifest, StageSpec, TensorSpec
from backend.query import Query
from backend.runtime import Runtime

BATCH_SIZES = [1, 2, 4, 8]
# DVABATCH_TEST_DEVICE=GPU runs the timed schedules on CUDA streams and events (a GPU machine only).
DEVICE = os.environ.get("DVABATCH_TEST_DEVICE", "CPU")


def timed_manifest(tables: list[dict], dims: tuple = ("sequence",), max_batch_size: int = 8) -> Manifest:
    """A model of ``len(tables)`` timed stages passing ``x`` (float32, ``dims``) through."""
    x = (TensorSpec("x", "float32", dims),)
    stages = tuple(StageSpec(i, "", "timed", x, x, latency=LatencyTable.from_json(table))
                   for i, table in enumerate(tables))
    return Manifest("timed.onnx", "", max_batch_size, x, x, stages)


def with_tables(manifest: Manifest, tables: list[dict]) -> Manifest:
    """``manifest`` with its stage latency tables replaced (same batch sizes)."""
    stages = tuple(dataclasses.replace(s, latency=LatencyTable.from_json(t)) for s, t in zip(manifest.stages, tables))
    return dataclasses.replace(manifest, stages=stages)


def flat(ms: float) -> dict:
    """A stage taking ``ms`` at every batch size."""
    return {"batch_sizes": BATCH_SIZES, "mean": [ms] * len(BATCH_SIZES)}


class Clock:
    """Runs a timed model and records, relative to its start, when each query was answered and
    what each stage ran."""

    def __init__(self, manifest: Manifest, config: RuntimeConfig):
        self.answers: dict[int, tuple[float, object, object]] = {}
        self.runs: list[tuple[int, int, int, int, float, float]] = []  # stage, batch, start, num, t0, t1
        self._done = threading.Condition()
        self._started, self.t0 = False, time.monotonic()
        device = make_device(DEVICE)
        self.runtime = Runtime(manifest, load_engines(manifest, ".", device), config, device, trace=self._trace)

    def _trace(self, stage, item, began, ended) -> None:
        self.runs.append((stage, item.batch_id, item.start, item.num, self.ms(began), self.ms(ended)))

    def ms(self, t: float) -> float:
        return (t - self.t0) * 1000

    def query(self, key: int, length: int = 8, rows: int = 1, deadline_ms: float | None = None) -> Query:
        """Query ``key``: ``rows`` rows of ``length`` values that only it has, wanting its answer
        within ``deadline_ms`` of now."""
        def respond(outputs, failure):
            with self._done:
                assert key not in self.answers, f"query {key} answered twice"
                self.answers[key] = (self.ms(time.monotonic()), outputs, failure)
                self._done.notify_all()
        value = (np.arange(rows * length).reshape(rows, length) + 1000 * key).astype(np.float32)
        deadline = time.monotonic() + deadline_ms / 1000 if deadline_ms is not None else None
        return Query({"x": value}, respond, deadline=deadline)

    def submit(self, *queries: Query) -> None:
        """Hand queries over; the clock starts at the first submission."""
        if not self._started:
            self._started, self.t0 = True, time.monotonic()
        self.runtime.submit(list(queries))

    def wait(self, count: int) -> dict[int, float]:
        with self._done:
            assert self._done.wait_for(lambda: len(self.answers) >= count, timeout=30)
        self.runtime.close()
        return {key: at for key, (at, _, _) in sorted(self.answers.items())}
