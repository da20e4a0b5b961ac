"""What is decided when a model loads, from its tables and the host's measured costs: whether
``auto`` pipelines at all (``choose``), whether a served-plain batch runs the whole model as one
engine (``fuses``), whether a pipeline's ``execute`` waits for stage 0 (``waits``), and each way's
capacity for the log and the metrics (``capacities``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..manifest import LatencyTable, Manifest
from .costs import HostCosts, Mode, device_s, middle_length

SPLIT_GAIN = 0.05  # how much sooner a split must answer, in sum, for ``auto`` to keep a CPU pipeline
CPU_BOUND = 0.5  # the share of the stub's interpreter serving would take at the engines' capacity: the CPU caps
# A whole model's table measured apart and its stages' summed, this close, are taken as equal
# (the TensorRT-speed profile's differ by 0.02 %: the tables' rounding).
FUSED_NOISE = 0.01


@dataclass(frozen=True)
class Choice:
    """Whether a model pipelines, why, whether the ``ModeSwitch`` may change that while it
    serves, and the requests/s predicted for each way of serving (``plain``, ``pipeline``) where
    the choice compared them: for the log and the metrics."""

    pipeline: bool
    why: str
    capacity: dict[str, float] = field(default_factory=dict)
    switches: bool = False


def capacities(tables: Sequence[LatencyTable], costs: HostCosts, cores: float, statistic: str = "mean",
               shared_host: bool = False) -> dict[str, float]:
    """Requests/s each way can answer at most, at a typical length (the middle tabulated one) and
    its best batch size: the engines (``device_s``), the stub's interpreter (one core's time, and
    less where the host lends fewer ``cores``) each hold it back (tritonserver's own share is
    only seen while serving: ``ModeSwitch``)."""
    length = middle_length(tables)

    def rate(mode: Mode, rows: int) -> float:
        stub = costs.stub_s(mode, rows)
        bound = max(device_s(tables, mode, rows, length, statistic, shared_host), stub,
                    stub / cores)
        return rows / bound if bound > 0 else math.inf

    top = tables[0].batch_sizes[-1]
    return {"plain": max(rate(Mode.IN_TURN, r) for r in range(1, top + 1)),
            "pipeline": max(rate(Mode.PIPELINE, r) for r in range(1, top + 1))}


def interpreted(manifest: Manifest) -> bool:
    """Whether every stage runs on our torch interpreter node by node: one Python call per node,
    all under the one lock of the process's interpreter, so stages running at once take turns for
    their host time even where their kernels overlap on a GPU. Not where they replay CUDA graphs
    (``Manifest.as_graphs``): a replay is one launch."""
    return all(s.engine == "torch" for s in manifest.stages) and not manifest.graphs


def choose(manifest: Manifest, auto: bool, on_cores: bool, statistic: str = "mean") -> Choice:
    """Pipeline, or serve as a plain model does? Every policy but ``auto`` always pipelines (the
    user asked for its batching). ``auto`` steps aside on stages that share the host's cores
    (``on_cores``) unless a split after a stage pays (``split_pays``), and on engines that
    overlap pipelines with the ``ModeSwitch`` free to serve plain while the load says so (and from
    the start, where loading's costs do: ``ModeSwitch.begin``)."""
    tables = [s.latency for s in manifest.stages]
    if not auto:
        return Choice(True, "the configured policy always pipelines")
    if any(t is None for t in tables):
        return Choice(True, "auto pipelines a model without latency tables")
    if on_cores:
        if len(tables) == 1:
            return Choice(False, "a model of one stage has nothing to overlap on the CPU's cores")
        if split_pays(tables, statistic):
            return Choice(True, "splitting a batch after a stage answers its rows sooner (Policy II)")
        return Choice(False, "the stages share the CPU's cores and no split after a stage pays")
    return Choice(True, "the stages overlap: pipelined, and served plain while that answers the load sooner "
                        "(decide.ModeSwitch)", switches=True)


def fuses(manifest: Manifest, statistic: str = "mean") -> bool:
    """Whether the whole model as one engine (``Manifest.fused``) is predicted to take no longer
    than its stages one after another (within ``FUSED_NOISE``), at every tabulated batch size
    and length: served plain, it then runs as one. A profile's ``whole`` measured apart may take
    longer (BERT-base unsliced on an H100 under torch's interpreter: 10.6 ms for one row,
    against 9.5 for its stages). A model of one stage already runs as one engine: a fused copy
    would only load it again (for torch stages, capture their CUDA graphs twice)."""
    tables = [s.latency for s in manifest.stages]
    whole = manifest.fused().stages[0].latency
    if len(tables) < 2 or whole is None or any(t is None for t in tables):
        return False
    return all(whole.predict(rows, length, statistic)
               <= (1 + FUSED_NOISE) * sum(t.predict(rows, length, statistic) for t in tables)
               for rows in tables[0].batch_sizes for length in tables[0].lengths or (None,))


def split_pays(tables: Sequence[LatencyTable], statistic: str = "mean") -> bool:
    """Whether splitting a batch after some stage answers its rows sooner, in sum, than both the
    whole batch and its two halves formed at the entry, by ``SPLIT_GAIN``."""
    for length in tables[0].lengths or (None,):
        def took(stages: Sequence[LatencyTable], rows: int) -> float:
            return sum(t.predict(rows, length, statistic) for t in stages)

        for bs in (b for b in tables[0].batch_sizes if b > 1):
            big, small = bs - bs // 2, bs // 2
            whole = bs * took(tables, bs)
            at_entry = big * took(tables, big) + small * (took(tables, big) + took(tables, small))
            for stage in range(1, len(tables)):
                early, late = took(tables[:stage], bs), tables[stage:]
                split = big * (early + took(late, big)) + small * (early + took(late, big) + took(late, small))
                if split < (1 - SPLIT_GAIN) * min(whole, at_entry):
                    return True
    return False


def waits(manifest: Manifest, setting: str, costs: HostCosts) -> tuple[bool, str]:
    """Whether a pipeline's ``execute`` waits until stage 0 has computed the queries it handed
    over (``Entry.wait_ready``), and why. Waiting keeps Triton's batching alive: the requests
    that arrive meanwhile come in one ``execute``, and the responses ready by then go back in
    its list, not one ``send()`` each: where the host's CPU caps the pipeline (at the engines'
    capacity, serving would take ``CPU_BOUND`` of the stub's interpreter), that is what keeps
    up. Where the engines cap it, the requests waiting unseen in Triton's queue meanwhile are
    what costs: they miss the batch stage 0 forms next; returning at once lets the entry see
    every query as it arrives (two slow stages on RTE: 0.72x the ensemble's mean latency at
    medium load against 0.92x waiting; docs/results/sim-slow-rte-nowait). ``execute_waits``
    true or false decides instead; without latency tables it waits. (Stages on the host's cores
    are not measured: their compute is the CPU's, and the engines cap them.)"""
    if setting != "auto":
        return setting == "true", f"execute_waits is {setting}"
    tables = [stage.latency for stage in manifest.stages]
    if any(table is None for table in tables):
        return True, "execute waits: no latency tables to tell whether the engines or the CPU cap the pipeline"
    length, top = middle_length(tables), tables[0].batch_sizes[-1]
    shared = interpreted(manifest)

    def rate(rows: int) -> float:
        took = device_s(tables, Mode.PIPELINE, rows, length, shared_host=shared)
        return rows / took if took > 0 else math.inf
    rows = max(range(1, top + 1), key=rate)
    capacity = rate(rows)
    share = capacity * costs.stub_s(Mode.PIPELINE, rows) / rows if costs.stub_s(Mode.PIPELINE, rows) else 0.0
    cpu = share >= CPU_BOUND
    return cpu, (f"execute {'waits for stage 0: the CPU caps' if cpu else 'returns at once: the engines cap'} the "
                 f"pipeline (the engines' {capacity:.0f} requests/s would take {share:.0%} of the stub's "
                 "interpreter)")
