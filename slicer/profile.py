"""What the profile says: node times per batch size and length, preferred batch sizes, operator
diversity, and the stage latency tables measured on the built stages.

Times are milliseconds throughout. A node profile comes from a target (ONNX Runtime's profiler,
TensorRT's per-layer profiler); everything here only reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from backend.engines import Engine
from backend.manifest import LatencyTable, StageSpec, TensorSpec
from backend.sample import sample_inputs, sizes_at

# Progress callback: (what is being done, how many of how many done).
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class NodeProfile:
    """Median kernel time of every node, per padded length and batch size.

    ``lengths`` is ``(None,)`` for a model without a length axis. ``times`` has the shape
    ``(len(lengths), len(batch_sizes), len(nodes))``.
    """

    nodes: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    lengths: tuple[int | None, ...]
    times: np.ndarray
    seconds: float  # wall-clock time spent profiling

    def at(self, batch: int, length: int | None) -> np.ndarray:
        return self.times[self.lengths.index(length), self.batch_sizes.index(batch)]


def preferred_batch_size(batch_sizes: Sequence[int], times: Sequence[float], improvement: float) -> int:
    """The smallest batch size beyond which the time per query stops improving.

    That is the smallest ``b`` such that no larger batch size takes less than ``1 - improvement``
    of ``b``'s time per query. Comparing against *every* larger size, not only the next one, keeps
    one noisy measurement from ending the search early.
    """
    per_query = np.asarray(times, dtype=float) / np.asarray(batch_sizes, dtype=float)
    for i, size in enumerate(batch_sizes):
        later = per_query[i + 1:]
        if not len(later) or later.min() >= per_query[i] * (1 - improvement):
            return int(size)
    return int(batch_sizes[-1])


@dataclass(frozen=True)
class DiversityChange:
    """Between ``after_node - 1`` and ``after_node`` the preferred batch size changes."""

    after_node: int
    before: int
    after: int


def node_preferences(profile: NodeProfile, length: int | None, improvement: float,
                     min_share: float) -> list[int | None]:
    """Each node's preferred batch size at ``length``; None for nodes too cheap to judge
    (less than ``min_share`` of the model's time at the largest batch size)."""
    table = profile.times[profile.lengths.index(length)]  # (batch sizes, nodes)
    total = float(table[-1].sum()) or 1.0
    return [
        preferred_batch_size(profile.batch_sizes, table[:, i], improvement)
        if table[-1, i] >= min_share * total else None
        for i in range(len(profile.nodes))
    ]


def diversity_changes(preferences: Sequence[int | None], costs: Sequence[float],
                      min_run_share: float) -> list[DiversityChange]:
    """Where the preferred batch size changes along the node order.

    Judged nodes with the same preference form runs; a run holding less than ``min_run_share`` of
    the time is noise and joins the run before it. A change sits at the first node of a run.
    """
    total = float(sum(costs)) or 1.0
    runs: list[list] = []  # [preference, first node, time]
    for i, (pref, cost) in enumerate(zip(preferences, costs)):
        if pref is None:
            if runs:
                runs[-1][2] += cost
            continue
        if runs and runs[-1][0] == pref:
            runs[-1][2] += cost
        else:
            runs.append([pref, i, cost])
    merged: list[list] = []
    for run in runs:
        if merged and (run[2] < min_run_share * total or run[0] == merged[-1][0]):
            merged[-1][2] += run[2]
        else:
            merged.append(list(run))
    while len(merged) > 1 and merged[0][2] < min_run_share * total:  # a tiny first run joins the next
        merged[1][2] += merged[0][2]
        merged[1][1] = merged[0][1]
        merged.pop(0)
    return [DiversityChange(after_node=b[1], before=a[0], after=b[0]) for a, b in zip(merged, merged[1:])
            if a[0] != b[0]]


Timer = Callable[[Callable[[], object]], float]


def measure_stages(engines: Sequence[Engine], inputs: Sequence[TensorSpec], stages: Sequence[StageSpec],
                   batch_sizes: Sequence[int], lengths: Sequence[int | None], axis: str | None,
                   dim_sizes: dict[str, int],
                   to_device: Callable, timer: Timer, warmup: int, repeats: int,
                   progress: Progress | None = None) -> list[LatencyTable]:
    """Each stage's mean and p99 per batch size (and length), run as the executors run it.

    Every stage sees the real outputs of the stages before it on random model ``inputs``. Stages
    are timed one after another; within a stage, rounds interleave all (length, batch size) pairs
    so a slow moment on the machine spreads over the whole table instead of bending one column.
    """
    configs = [(length, batch) for length in lengths for batch in batch_sizes]
    feeds = {}
    for length, batch in configs:
        feed = sample_inputs(inputs, batch, sizes_at(dim_sizes, axis, length), seed=batch)
        current = {k: to_device(v) for k, v in feed.items()}
        per_stage = []
        for engine, stage in zip(engines, stages):
            stage_inputs = {t.name: current[t.name] for t in stage.inputs}
            per_stage.append(stage_inputs)
            for _ in range(max(warmup, 1)):  # the first run also gives the next stage its inputs
                computed = engine.run(stage_inputs)
            current = {**{n: current[n] for n in stage.carry}, **computed}
        feeds[(length, batch)] = per_stage
    samples = {(s, c): [] for s in range(len(stages)) for c in configs}
    for s, engine in enumerate(engines):  # one stage at a time: no other stage competes for the cores
        for _ in range(repeats):
            for config in configs:
                samples[(s, config)].append(timer(lambda: engine.run(feeds[config][s])))
        if progress:
            progress("stage latency tables", s + 1, len(engines))
    tables = []
    for s in range(len(stages)):
        mean = [[float(np.mean(samples[(s, (length, b))])) for b in batch_sizes] for length in lengths]
        p99 = [[float(np.percentile(samples[(s, (length, b))], 99)) for b in batch_sizes] for length in lengths]
        if axis is None:
            tables.append(LatencyTable(batch_sizes=tuple(batch_sizes), mean=_round(mean[0]), p99=_round(p99[0])))
        else:
            tables.append(LatencyTable(batch_sizes=tuple(batch_sizes), mean=tuple(_round(r) for r in mean),
                                       p99=tuple(_round(r) for r in p99), axis=axis, lengths=tuple(lengths)))
    return tables


def _round(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(round(v, 4) for v in values)


def wall_timer(synchronize: Callable[[], None]) -> Timer:
    """Milliseconds one call takes, its device work included."""
    def timed(call: Callable[[], object]) -> float:
        began = time.perf_counter()
        call()
        synchronize()
        return (time.perf_counter() - began) * 1000
    return timed
