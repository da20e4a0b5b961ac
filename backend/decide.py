"""How a model serves, decided in one place, from what is measured where it runs.

Three questions, each answered from the stage latency tables and the host's serving costs
(``HostCosts``: measured when the model loads, ``calibrate.py``; corrected while it serves by
what serving shows), never from a cost measured on another machine:

- **Pipeline or plain** (``choose``; ``ModeSwitch`` while serving). Stages that compute on the
  host's cores (ONNX Runtime; torch on a CPU instance) only take turns on them, so the pipeline
  pays there only where splitting a batch after a stage answers its rows sooner (Policy II):
  otherwise the stages run fused, as a plain model does, decided once. Stages on engines that
  overlap (a GPU; timed) start pipelined, the paper's multi-entry; the ``ModeSwitch`` then
  watches each second of serving and runs every batch inside ``execute`` (as a plain model
  does: the whole model as one engine where it fuses, ``fuses``, else the stages in turn)
  while that answers the load seen sooner (the
  pipeline's own cost, the stub's one interpreter, the host's cores, the bottleneck stage,
  weighed against the waits its multi-entry saves), and pipelines again when it does not.
- **Whether a pipeline's ``execute`` waits** until stage 0 computed its queries (``waits``): where
  the host's CPU caps the pipeline, so that Triton batches what arrives meanwhile; under ``auto``
  decided again from each window served pipelined (``EntryWait``).
- **Whether a lone batch runs inside ``execute``** (``LoneRuns``): only under ``auto`` (or where
  ``lone_inline`` asks), and only while the looks say a request rarely arrives during one, by
  what the pipeline's hand-offs cost here against what such a request would wait.

Nothing here imports Triton, so every rule can be tested directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from .manifest import LatencyTable, Manifest

SPLIT_GAIN = 0.05  # how much sooner a split must answer, in sum, for ``auto`` to keep a CPU pipeline
# How much sooner another way of serving must predict to answer (or, both overloaded, how much
# less busy its nearest limit) for the switch.
SWITCH_GAIN = 0.15
CPU_BOUND = 0.5  # the share of the stub's interpreter serving would take at the engines' capacity: the CPU caps
# Answers a window needs for the stub's measured costs to be corrected by it, and for what it shows
# tritonserver's CPU cost a request to be kept: over fewer, work that is not this model's
# requests weighs in them (the metrics' export; in a server shared with other models, theirs: a
# window in which this model's load stopped and another's began once read 2,656 us a request
# pipelined, against 1,111 served plain, and kept a closed loop plain that the pipeline served
# 1.6x faster).
CORRECT_AFTER = 200
# A window may show a way's stub at less than loading measured (a host faster than when the model
# loaded), but it is never taken below this share of it. There is no most: what loading leaves out
# was 4-9 times plain's own cost (docs/results/served-cost-lines). A window that holds other work
# (a drain) speaks for itself alone: the next window's excess replaces its own, lines take medians
# (``ServedLine``), and a switch needs two windows in a row agreeing.
LEAST_SHARE = 0.5
# Windows served one way whose batch sizes lie this far apart (the largest mean rows a run over the
# least) give that way's stub costs a line of their own (``ServedLine``), which replaces loading's.
LINE_SPREAD = 2.0
LINE_KEEPS = 3  # windows a line keeps of each half octave of batch sizes (the latest)
# A pipelined window in which more than this share of the batches ran inline (``LoneRuns``) shows
# plain serving's costs as much as the pipeline's: it corrects neither.
MIXED_INLINE = 0.1
# A whole model's table measured apart and its stages' summed, this close, are taken as equal
# (the TensorRT-speed profile's differ by 0.02 %: the tables' rounding).
FUSED_NOISE = 0.01
MIN_ANSWERS = 20  # a window with fewer answers shows too little to decide on: the mode stays
# A pipelined ``execute`` that returns at once starts waiting for stage 0 once the host is this
# busy in two windows in a row: its CPU then caps the pipeline (``EntryWait``).
HOST_SATURATED = 0.95
TRIAL_WINDOWS = 2  # windows a trial runs (``EntryWait``: of returning at once; ``ModeSwitch``: of the other way)
TRIAL_GAIN = 0.05  # and how many more answers/s than the way before it must show to be kept


class Mode(Enum):
    PIPELINE = "pipeline"
    FUSED = "fused"  # the stages as one engine, inside ``execute``
    IN_TURN = "in_turn"  # the stages one after another, inside ``execute``


@dataclass(frozen=True)
class HostCosts:
    """CPU seconds the model's stub spends serving, per batch and per request, for each way of
    serving (``pipeline``: handed to the stage executors, answered by ``send()``; ``plain``: run
    inside ``execute``, answered in its list). The stub is one Python interpreter: its work runs
    on one core's worth of time whatever the host has, which is what caps serving at engine speed.
    ``handoff_s``: the wall seconds the pipeline's hand-offs add to a lone batch beyond that CPU
    (threads woken, on other cores where the host has them): latency, which occupies nothing."""

    pipeline_batch_s: float = 0.0
    pipeline_request_s: float = 0.0
    plain_batch_s: float = 0.0
    plain_request_s: float = 0.0
    handoff_s: float = 0.0
    # What answering a plain request by a ``send()`` adds to it, as a hold does (``hold.py``): a
    # round trip to tritonserver (in ``pipeline_request_s`` already; 0 where every plain answer
    # is sent anyway: a decoupled model).
    send_s: float = 0.0
    how: str = "not measured"

    def stub_s(self, mode: Mode, requests: float) -> float:
        """The stub's seconds for one batch of ``requests`` served ``mode`` (what a request's rows
        cost beyond its first is in its request's cost: loading measures requests of one row, and
        serving a line through the windows a client sends, ``ServedLine``)."""
        if mode is Mode.PIPELINE:
            return self.pipeline_batch_s + requests * self.pipeline_request_s
        return self.plain_batch_s + requests * self.plain_request_s

    def plus(self, pipeline_s: float, plain_s: float) -> HostCosts:
        """Each way's stub seconds a request with what serving showed beyond loading's added (a
        request never below ``LEAST_SHARE`` of loading's)."""
        return replace(self, pipeline_request_s=max(self.pipeline_request_s + pipeline_s,
                                                    LEAST_SHARE * self.pipeline_request_s),
                       plain_request_s=max(self.plain_request_s + plain_s, LEAST_SHARE * self.plain_request_s))

    def served(self, mode: Mode, batch_s: float, request_s: float) -> HostCosts:
        """These costs with ``mode``'s stub costs as serving showed them (``ServedLine``)."""
        if mode is Mode.PIPELINE:
            return replace(self, pipeline_batch_s=batch_s, pipeline_request_s=request_s)
        return replace(self, plain_batch_s=batch_s, plain_request_s=request_s)

    @property
    def measured(self) -> bool:
        return self.how != HostCosts.how

    def describe(self) -> str:
        return (f"stub {self.pipeline_batch_s * 1e6:.0f} us a batch + {self.pipeline_request_s * 1e6:.0f} a request "
                f"pipelined (+ {self.handoff_s * 1e6:.0f} us of hand-offs), {self.plain_batch_s * 1e6:.0f} + "
                f"{self.plain_request_s * 1e6:.0f} plain ({self.how})")


@dataclass(frozen=True)
class Choice:
    """Whether a model pipelines, why, whether the ``ModeSwitch`` may change that while it
    serves, and the requests/s predicted for each way of serving (``plain``, ``pipeline``) where
    the choice compared them: for the log and the metrics."""

    pipeline: bool
    why: str
    capacity: dict[str, float] = field(default_factory=dict)
    switches: bool = False


def middle_length(tables: Sequence[LatencyTable]) -> int | None:
    lengths = tables[0].lengths
    return lengths[len(lengths) // 2] if lengths else None


def device_s(tables: Sequence[LatencyTable], mode: Mode, rows: int, length: int | None, statistic: str = "mean",
             shared_host: bool = False) -> float:
    """Seconds the engines take per batch of ``rows``: a plain model runs the stages one after
    another, a pipeline is held by its slowest stage. With ``shared_host`` (torch stages run node
    by node by one interpreter: ``interpreted``) a pipelined batch also waits for every stage's
    host time, the same at every batch size: taken as each stage's least time over its batch
    sizes, where the GPU has least to do (BERT-base's two interpreted stages on an H200: 5.4 and
    4.0 ms for one row, 5.4 and 4.4 for 16: nearly all of it the interpreter's)."""
    times = [t.predict(rows, length, statistic) / 1000 for t in tables]
    if mode is not Mode.PIPELINE:
        return sum(times)
    host = sum(min(t.predict(r, length, statistic) for r in t.batch_sizes) for t in tables) / 1000 \
        if shared_host else 0.0
    return max(max(times), host)


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
    overlap starts pipelined with the ``ModeSwitch`` free to serve plain while the load says so."""
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


@dataclass
class LoneRuns:
    """Whether a batch that finds the pipeline empty runs through every stage inside ``execute``.

    Alone in the pipeline, a query pays for what overlapping batches would hide: the hand-offs
    between the executor threads and a ``send()`` of its answer (``saved_s``, measured at load: the
    pipeline's CPU for a lone batch less the plain path's, and the hand-offs' latency beyond it).
    Inside ``execute`` it is answered in its list, as a plain model answers; but meanwhile
    ``execute`` holds Triton's instance: a request arriving during the run waits unseen in Triton's
    queue until the run ends, where the pipeline would have let it into stage 0 once that was free.
    What each waits more, on average, and how many arrive, both grow with the run: a batch is
    judged at its own rows and length (``runs_s``: by the tables, at each tabulated length, None
    where the model has none, a lone batch's seconds through every stage and through stage 0, the
    i-th for i + 1 rows, the last for more). Inline pays while the arrivals expected during a run,
    times what each waits more, stay under ``saved_s``.

    Only the pipeline shows whether a request arrived during a lone batch: the next ``execute``
    finds it still busy; inline, nothing tells. So a lone batch enters the pipeline to look whenever
    inline does not pay, and, while it does, after ``every`` inline runs, twice as many after each
    look that saw nothing (up to ``longest``), ``every`` again once one saw an arrival. ``share`` is
    the part of the looks that saw one; it starts at 1 (nothing seen yet: the pipeline's
    multi-entry until the looks show that arrivals are rare), and each look weighs ``weight`` in
    it, and its batch's run in ``looked_s``: the mean run the looks watched for arrivals. A look
    tells only whether any arrived: at random arrivals, a share ``p`` of runs with one at least
    means ``-ln(1 - p)`` a run of ``looked_s`` (taken as ``p``, a share of 0.6 counted 0.6 arrivals
    where 0.92 came), and a run of another length as many more as it is longer."""

    saved_s: float
    runs_s: dict[int | None, tuple[tuple[float, float], ...]]
    weight: float = 0.25
    every: int = 4
    longest: int = 16
    share: float = 1.0
    looked_s: float = 0.0  # the run of the batches the looks saw (0: none yet: taken as any run's)
    _lengths: tuple[int | None, ...] = field(default=(), init=False)  # ``runs_s``' lengths, shortest first
    _interval: int = field(default=0, init=False)  # inline runs between two looks now
    _inline_runs: int = field(default=0, init=False)  # inline since the last lone batch entered the pipeline
    _looking: float | None = field(default=None, init=False)  # the run of a lone batch that looks, no ``execute`` since
    _due: bool = field(default=False, init=False)  # ... because the interval was up (not because inline did not pay)

    def __post_init__(self) -> None:
        self._interval = self.every
        self._lengths = tuple(self.runs_s) if None in self.runs_s else tuple(sorted(self.runs_s))

    @classmethod
    def of(cls, manifest: Manifest, costs: HostCosts) -> LoneRuns:
        """The rule for ``manifest``'s stages at the costs measured here, by the tables at each
        row count up to the model's largest batch and each tabulated length: a client may send
        several rows in a request (TensorRT-speed BERT-base's two stages take 0.96 ms at 8 rows of
        64 tokens where the tables at one row say 0.56; judged at one row, 26-39 % of the lone
        batches of 8 rows ran inline under a Poisson load of 888 requests/s, the mean 1.35-1.50x the
        forced pipeline's in three rounds of four; docs/results/request-rows), and queries of
        diverse lengths (there, 8 rows of 128 tokens take 1.42 ms, 1.5x what 8 of 64 take)."""
        tables = [s.latency for s in manifest.stages]

        def run(rows: int, length: int | None) -> tuple[float, float]:
            times = [t.predict(rows, length) / 1000 for t in tables]
            return sum(times), times[0]

        top = max(manifest.max_batch_size, 1)
        return cls(saved_s=costs.stub_s(Mode.PIPELINE, 1) - costs.stub_s(Mode.IN_TURN, 1) + costs.handoff_s,
                   runs_s={length: tuple(run(rows, length) for rows in range(1, top + 1))
                           for length in tables[0].lengths or (None,)})

    def run_s(self, rows: int, length: int | None = None) -> tuple[float, float]:
        """A lone batch's seconds through every stage and through stage 0, by the tables at its
        ``rows`` and its ``length`` rounded up to a tabulated one (the middle one where it has none)."""
        lengths = self._lengths
        if length is None or lengths[0] is None:
            at = lengths[len(lengths) // 2]
        else:
            at = next((n for n in lengths if n >= length), lengths[-1])
        by_rows = self.runs_s[at]
        return by_rows[min(max(rows, 1), len(by_rows)) - 1]

    def waits_s(self, rows: int, length: int | None = None) -> float:
        """What the requests arriving during an inline run of ``rows`` of ``length`` wait more,
        expected: an arrival at a random moment of a run of ``total`` waits for the rest of it
        inline, on average ``total / 2``, and in the pipeline only for the rest of stage 0 where it
        falls in it, ``t0^2 / (2 total)``."""
        total, t0 = self.run_s(rows, length)
        if total <= t0:
            return 0.0
        if self.share >= 1:
            return math.inf
        arrivals = -math.log1p(-self.share) * (total / self.looked_s if self.looked_s > 0 else 1.0)
        return arrivals * (total * total - t0 * t0) / (2 * total)

    def inline(self, idle: bool, rows: int = 1, length: int | None = None) -> bool:
        """At the start of ``execute`` (``idle``: nothing waits at the entry and no batch is in
        the pipeline; ``rows``, ``length``: the call's, its longest): whether this batch runs inside it."""
        if self._looking is not None:
            arrived = not idle
            self.share += self.weight * (arrived - self.share)
            self.looked_s = self._looking if self.looked_s <= 0 else \
                self.looked_s + self.weight * (self._looking - self.looked_s)
            if arrived:
                self._interval = self.every
            elif self._due:
                self._interval = min(2 * self._interval, self.longest)
            self._looking = None
        if not idle:
            return False
        calm = self.waits_s(rows, length) < self.saved_s
        if calm and self._inline_runs < self._interval:
            self._inline_runs += 1
            return True
        self._inline_runs, self._looking, self._due = 0, self.run_s(rows, length)[0], calm
        return False


@dataclass
class Trial:
    """A trial of another way of serving against the answers/s the way before it served at
    (``baseline``): ``TRIAL_WINDOWS`` windows at rates within ``SWITCH_GAIN`` of each other, the
    way tried kept where they answered ``TRIAL_GAIN`` more (``EntryWait``, ``ModeSwitch``), or,
    where both ways' latency was measured (``baseline_s``, ``measured_s``), answered as many
    within ``TRIAL_GAIN`` in ``TRIAL_GAIN`` less time: under an open load each way answers what
    arrives, and only the time says which serves it sooner (BERT-base's three FP16 stages from
    an H100 under Poisson 1,800/s, served plain 100 % busy in calls whose time barely grows with
    their rows, read as a loop at capacity; the pipeline tried answered as many and was left,
    at 1.10x its forced mean: docs/results/check-held-out-runs)."""

    baseline: float
    baseline_s: float | None = None
    rates: list[float] = field(default_factory=list)
    took_s: list[float | None] = field(default_factory=list)

    def moved(self, rate: float) -> bool:
        """Whether a window's answers/s moved from the window before: a load that stopped or
        changed says nothing of either way, and the trial ends."""
        return bool(self.rates) and moved(rate, self.rates[-1])

    def take(self, rate: float, took_s: float | None = None) -> bool | None:
        """A window's answers/s and its requests' measured latency (``measured_s``): None while
        the trial runs, else whether the way tried is kept.
        A window ``SWITCH_GAIN`` short of the baseline ends it at once: the way tried carries
        less, or the load fell, and either way a second window would cost as much again
        (TensorRT speed under a Poisson load at 0.6 of plain's peak, 1,836/s, tried a pipeline that
        answered 1,203/s for two windows, the requests it left queued by then some 1,300)."""
        self.rates.append(rate)
        self.took_s.append(took_s)
        if rate < (1 - SWITCH_GAIN) * self.baseline:
            return False
        if len(self.rates) < TRIAL_WINDOWS:
            return None
        return (self.answered >= (1 + TRIAL_GAIN) * self.baseline and not self.slower) or self.sooner

    @property
    def answered(self) -> float:
        return sum(self.rates) / len(self.rates)

    @property
    def took(self) -> float | None:
        """The mean measured latency of the way tried; None where a window could not measure it."""
        took = [t for t in self.took_s if t is not None]
        return sum(took) / len(took) if took and len(took) == len(self.took_s) else None

    @property
    def took_share(self) -> float | None:
        """The way tried's measured latency over the way before's; None where either went unmeasured."""
        took = self.took
        return None if took is None or self.baseline_s is None else took / self.baseline_s

    @property
    def sooner(self) -> bool:
        """Whether the way tried carried the load the way before did and answered it sooner."""
        share = self.took_share
        return share is not None and share <= 1 - TRIAL_GAIN and self.answered >= (1 - TRIAL_GAIN) * self.baseline

    @property
    def slower(self) -> bool:
        """Whether the way tried answered ``TRIAL_GAIN`` later than the way before, as measured:
        then answers/s that read more are an open load's noise (a closed loop answered more
        is answered sooner), as 1,861/s returning at once against 1,764 waiting for stage 0
        under Poisson 1,800/s, each request 8.2 ms where waiting took 7.4."""
        share = self.took_share
        return share is not None and share >= 1 + TRIAL_GAIN

    @property
    def refused(self) -> str:
        """Why the way tried was not kept, for the log."""
        return f"{TRIAL_GAIN:.0%} later or more" if self.slower else f"not {TRIAL_GAIN:.0%} more"

    def said(self, tried: str, before: str) -> str:
        said = f"{tried} answered {self.answered:.0f}/s where {before} answered {self.baseline:.0f}"
        if self.took_share is None:
            return said
        return f"{said}, in {_ms(self.took)} a request where {before} took {_ms(self.baseline_s)} (measured_s)"


@dataclass
class EntryWait:
    """Whether a pipelined ``execute`` waits until stage 0 computed its queries, decided again
    from every window served pipelined (``auto`` on engines that overlap, ``execute_waits:
    auto``). At load ``waits`` can only weigh the engines' capacity at their best batch, which
    a lighter load may never reach: there, on three 0.7 ms stages at 16 in flight, waiting held
    the model to 1,630 answers/s where returning at once answered 1,834, the host 70 % busy
    waiting and 83 % at once (stage 0 idles while Triton hands the next call over). But under an
    open load at 0.6 of the pipeline's peak, waiting answered in 7.3 ms where returning at once
    took 7.8-9.3 (what Triton batches during a call saves the stages' fixed cost), and where the
    host's CPU caps the pipeline waiting is what keeps up (fewer, fuller calls; near-zero compute
    at 16 in flight: 3,346 answers/s waiting against 2,462 at once, the host saturated either way).
    No reading of the host tells those apart, so it is tried: where waiting leaves the host clear
    room (under ``1 - SWITCH_GAIN`` busy), the entry returns at once for ``TRIAL_WINDOWS``, and
    keeps doing so only where that answered ``TRIAL_GAIN`` more than waiting did (clients that
    wait on their answers send more when answered sooner; an open load's rate is the same either
    way), or, as many within ``TRIAL_GAIN``, in ``TRIAL_GAIN`` less time, as measured
    (``measured_s``; none kept that took ``TRIAL_GAIN`` more, ``Trial.slower``), else it waits
    again and tries no more until the load moves by ``SWITCH_GAIN``. Returning
    at once, it waits again once the host is ``HOST_SATURATED`` busy, and tries no more at that
    load or a heavier one; and where a trial kept returning at once, once the load moves by more
    than ``SWITCH_GAIN`` from the trial's: a trial speaks for its load alone (six timed 1 ms
    stages kept returning at once from a trial at 1 in flight, 145 answers/s against 136, and at
    16 in flight, the host unsaturated, answered 0.87x the forced pipeline, which waited). A
    change needs two windows in a row agreeing (a window may hold a
    load starting or stopping), and a trial two at rates within ``SWITCH_GAIN`` of each other
    (where a load started, a first window's answers once made the trial's 657/s look like more
    than waiting's 381 under an open load of 700/s); a trial whose load stops or moves (its
    windows' rates apart by more) is abandoned, waiting again, free to try again. ``host``: the
    host's utilisation as ``ModeSwitch.host_busy`` reads it, ``rate`` the window's answers/s,
    ``took_s`` its requests' latency as measured (``measured_s``; None where it cannot be); None
    for a window not served pipelined or with too few answers to go by."""

    waits: bool
    last: str = ""  # why the entry does what it does now: for the log
    _wanted: tuple[bool, float] | None = field(default=None, init=False)  # the window before: its wish, its rate
    _saturated_at: float = field(default=math.inf, init=False)  # answers/s at which returning at once saturated
    _refused_at: float = field(default=-math.inf, init=False)  # answers/s a trial at once did not raise
    _trial: Trial | None = field(default=None, init=False)  # of returning at once, against waiting
    _kept_at: float | None = field(default=None, init=False)  # answers/s of the trial that kept returning at once

    def observe(self, host: float | None, rate: float = 0.0, took_s: float | None = None) -> bool | None:
        """Take a window; whether the entry waits from now on where that changes or a trial
        ends, else None."""
        if host is None:
            self._wanted = None
            return None if self._trial is None else self._abandon()
        if self._trial is not None and host < HOST_SATURATED:
            return self._take(rate, took_s)
        if self.waits:
            wanted = not (host < 1 - SWITCH_GAIN and rate < (1 - SWITCH_GAIN) * self._saturated_at
                           and moved(rate, self._refused_at))
        else:
            kept = self._kept_at
            wanted = host >= HOST_SATURATED or (kept is not None and moved(rate, kept))
        before, self._wanted = self._wanted, (wanted, rate)
        if wanted is self.waits or before is None or before[0] is not wanted:
            return None
        if not wanted and moved(rate, before[1]):
            return None  # a trial compares with waiting at a steady load: not one starting or stopping
        self.waits, self._wanted, self._trial = wanted, None, None
        if wanted and host >= HOST_SATURATED:
            self._saturated_at, self._kept_at = rate, None
            self.last = (f"the host {host:.0%} busy returning at once at {rate:.0f} answers/s, at or past "
                         f"{HOST_SATURATED:.0%}")
        elif wanted:
            self.last = (f"returning at once was kept at {self._kept_at:.0f} answers/s and the load moved to "
                         f"{rate:.0f}: a trial speaks for its load alone")
            self._kept_at = None
        else:
            self._trial = Trial((before[1] + rate) / 2, took_s)
            self.last = (f"a trial: the host {host:.0%} busy waiting for stage 0 at {rate:.0f} answers/s, under "
                         f"{1 - SWITCH_GAIN:.0%}")
        return wanted

    @property
    def trying(self) -> bool:
        """Whether the entry returns at once on trial now (``ModeSwitch.observe``'s ``trial``)."""
        return self._trial is not None

    def _take(self, rate: float, took_s: float | None) -> bool | None:
        """A window of a trial at once: after ``TRIAL_WINDOWS``, keep it (False) or wait again (True)."""
        trial = self._trial
        if trial.moved(rate):
            return self._abandon()
        kept = trial.take(rate, took_s)
        if kept is None:
            return None
        self._trial, self._wanted = None, None
        self.last = trial.said("returning at once", "waiting for stage 0")
        if kept:
            self._kept_at = trial.answered
            return False
        self.waits, self._refused_at = True, trial.baseline
        self.last += f": {trial.refused}"
        return True

    def _abandon(self) -> bool:
        """A trial whose load stopped or moved says nothing: wait again, free to try once more."""
        self.waits, self._trial, self._wanted = True, None, None
        self.last = "a trial of returning at once ended with its load"
        return True


@dataclass(frozen=True)
class Window:
    """What one window of serving showed: its length, the requests answered, the stub's CPU
    seconds, tritonserver's (None where it cannot be read), each stage's busy seconds, the
    mean rows of a stage's run, the ``execute`` calls: their wall seconds, the idle before
    each (since the previous call ended) summed and the longest (0 where not counted), and the
    CPU seconds other processes spent on the cores serving has (``others_s``: a load generator
    on the server's cores, other models' stubs; 0 where not read), served pipelined, the lone
    batches run inline (``inline``) and the calls that found the pipeline empty (``lone``), and
    the mean rows a request brought (``rows_a_request``: a client may send several in one, as an
    image classifier's often does), and the answers sent from the pipeline with their seconds
    from arriving in ``execute`` in all (``piped``, ``piped_s``: what the log sets beside the
    latency predicted pipelined). The engines' time goes by rows; the stub's, tritonserver's
    and a closed loop's round trip go by requests."""

    seconds: float
    answered: int
    stub_s: float
    server_s: float | None
    busy_s: tuple[float, ...]
    rows: float
    execute_s: float = 0.0
    executes: int = 0
    idle_s: float = 0.0
    longest_idle_s: float = 0.0
    others_s: float = 0.0
    inline: int = 0  # served pipelined, the lone batches that ran inside ``execute`` (``LoneRuns``)
    lone: int = 0  # ... and the calls that found the pipeline empty (inline or not; 0 where ``LoneRuns`` is off)
    rows_a_request: float = 1.0
    piped: int = 0
    piped_s: float = 0.0

    @property
    def requests(self) -> float:
        """The mean requests a run: its rows over a request's (one at least). Taken as its rows,
        a closed loop of 8 requests of 8 rows at TensorRT speed had the switch count a run of 36
        rows as 36 requests' stub work and the runs as an eighth of what they were, and serve
        plain and pipelined in turn every 2.5 s, each predicting the other sooner."""
        return max(max(self.rows, 1.0) / max(self.rows_a_request, 1.0), 1.0)


def round_trip_s(window: Window, delay_s: float = 0.0) -> float:
    """Served plain, the seconds each request held the next batch back beyond what arrivals that
    do not wait on the answers explain: the instance's idle time between two ``execute`` calls,
    less what an open (Poisson) load at the window's rate leaves idle (none arrived during a call
    of the mean length: ``exp(-rate took) / rate``) and what Triton's batcher may wait for more
    (its ``delay_s``, a call), spread over the requests. The longest idle of the window is left
    out: where a load stopped and another started, the gap between them is no client's round
    trip (one such gap, read as one, once had a window at the start of 16 in flight read 1.2 ms
    a request in series and send near-zero compute to the pipeline for the rest of the check:
    docs/results/lone-request-straight); in a steady loop it is one of many alike. Where the clients
    wait on their answers (a closed loop: perf_analyzer's concurrency) and every request in flight
    fits in one batch, the next batch cannot form until tritonserver has sent this one's answers
    and taken the clients' next requests: that round trip runs in series with the engines (64 in
    flight on the slower engine's two stages, served plain on a one-core server: the engines 73 %
    busy at 670 answers/s, where the pipeline, whose next batch enters while this one runs,
    answered 1,027; docs/results/check-auto-fused-plain). Under an open load it is about none."""
    if window.executes < 2 or not window.answered or window.seconds <= 0:
        return 0.0
    rate = window.answered / window.seconds
    took = window.execute_s / window.executes
    idle = max(window.idle_s - window.longest_idle_s, 0.0) / (window.executes - 1)
    return max(idle - math.exp(-rate * took) / rate - delay_s, 0.0) * window.executes / window.answered


def measured_s(window: Window, piped: bool) -> float | None:
    """A request's mean seconds from Triton's queue to its answer as the window measured them,
    the hand-off to the client left out alike for both ways. Each call holds Triton's instance
    for its time and a hand-off after it (``round_trip_s``: what the idle between calls shows
    beyond what random arrivals leave); a request arriving finds the instance so held as often
    as it is, for half of that on average, then spends its time inside the model: pipelined,
    from arriving in ``execute`` to its send returning (``Window.piped_s``); plain, its call and
    the hand-off that returns the call's answers. Served plain under Poisson 1,800/s, BERT-base's
    three FP16 stages read 8.4 ms where the client took 9.6; pipelined 7.3 where it took 7.6
    (docs/results/check-held-out-runs). None where the window cannot tell: its calls not counted
    (several instances, a hold), or pipelined, its answers mostly from lone batches run inline."""
    if window.executes < 2 or window.seconds <= 0 or not window.answered:
        return None
    call = window.execute_s / window.executes
    handoff = round_trip_s(window) * window.answered / window.executes
    held = min((window.execute_s + window.executes * handoff) / window.seconds, 1.0)
    if not piped:
        inside = call + handoff
    elif window.piped < MIN_ANSWERS or window.inline > MIXED_INLINE * window.executes:
        return None
    else:
        inside = window.piped_s / window.piped
    return held * (call + handoff) / 2 + inside


@dataclass(frozen=True)
class Seen:
    """What the ``ModeSwitch`` kept of a window for the next: its answers/s, the round trip it
    showed served plain (``round_trip_s``; None pipelined), and the way it found better (None: the
    one served)."""

    rate: float
    trip: float | None
    wanted: Mode | None


@dataclass
class ServedLine:
    """The stub's CPU seconds a batch and a request as the windows served one way show them: a
    least-squares line through each window's seconds a request against its batches a request
    (``1 / requests`` a run), once windows ``LINE_SPREAD`` apart in batch size are kept; each half octave
    of batch sizes counts as the median of its latest ``LINE_KEEPS`` windows (one window that
    holds other work, a drain, moves no line). Loading measures each way apart from Triton
    (``calibrate.py``): not what the stub spends receiving a call's requests and sending their
    responses, which is a cost a call as well as a request. Held from 1 to 64 in flight on one
    core, plain served three uneven timed stages at 314 us a batch and 106 a request where
    loading had measured 75 and 10, and TensorRT-speed BERT-base at 287 and 89 against 71 and 8
    (docs/results/served-cost-lines): what a window shows at one batch size says little of
    another."""

    _kept: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # half octave: (1 / requests, s each)

    def add(self, requests: float, per_request_s: float) -> None:
        kept = self._kept.setdefault(half_octave(requests), [])
        kept.append((1 / max(requests, 1.0), per_request_s))
        del kept[:-LINE_KEEPS]

    def fit(self) -> tuple[float, float] | None:
        """(seconds a batch, seconds a request), or None while the windows kept span too few batch sizes."""
        points = [sorted(kept, key=lambda point: point[1])[(len(kept) - 1) // 2] for kept in self._kept.values()]
        xs = [x for x, _ in points]
        if not points or max(xs) < LINE_SPREAD * min(xs):
            return None
        mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        if slope <= 0:  # no cost a batch shows: all of it a request's
            return 0.0, my
        if my - slope * mx < 0:  # no cost a request shows: all of it a batch's
            return sum(x * y for x, y in points) / sum(x * x for x in xs), 0.0
        return slope, my - slope * mx


@dataclass
class ModeSwitch:
    """Serves pipelined or plain, whichever answers the load seen sooner (auto on engines that
    overlap). Each window it reads the utilisation of every limit serving has in the way it serves
    now (the stub's interpreter, the host's cores with tritonserver and the other processes on
    them, the engines: the bottleneck stage pipelined; plain, the instance: its time inside
    ``execute`` and each request's round trip in series where the clients wait on their answers,
    ``round_trip_s``), and predicts the other
    way's at the same load, scaling the stub's time by the two ways' measured costs at the batch
    size seen and reading the engines' from the tables. From each way's utilisation ``u`` it
    predicts a request's mean latency: a batch's own time through the stages and the stub
    (pipelined, with the hand-offs' latency: ``HostCosts.handoff_s``), plus the wait for the limit
    ahead of it, a queue's ``s u / (2 (1 - u))`` for a limit that serves a batch in ``s`` (the whole
    batch's time plain, the bottleneck's pipelined: the pipeline's multi-entry lets a request into
    stage 0 while another runs, or where its ``execute`` waits for stage 0, no less than that call
    with its requests' round trip: ``_entry_s``; the other way's host taken ``SWITCH_GAIN`` busier than predicted,
    the model's error; the wait taken only as often as the requests found a batch ahead, against
    random arrivals: ``_overlap``). It switches when the other way's prediction
    is ``SWITCH_GAIN`` below the current one's in two windows in a row at rates within
    ``SWITCH_GAIN`` of each other (a window may hold a load starting or stopping, whose rate is
    neither's). At light load both ways predict
    about a batch's own time, unless the hand-offs' latency weighs in it, and the mode stays (the
    lone batches of a pipeline run inline where ``LoneRuns`` says so). Where the way served now is
    overloaded, or served plain with the clients waiting on their answers and the instance busy
    within ``SWITCH_GAIN`` of all the time (a round trip seen), its answers per second are its
    capacity, not the load (which may be higher), so a prediction at that rate says only how the
    other way's capacity compares: overloaded, it switches where the other would be ``SWITCH_GAIN``
    less busy, as where both would be overloaded (a prediction just under capacity, within the
    model's error, once flipped the near-zero profile every 1.5 s between plain serving and a
    pipeline that carries a third less, through a load at 0.9 of the plain capacity:
    docs/results/check-auto-client-core). In such a loop it tries the other (``Trial``): the idle
    between calls that reads as one is also Triton's hand-off from one call to the next under an
    open load, whose answers no way raises (MiniLM's six FP16 stages from an H100, served plain
    98 % busy under Poisson 1,000/s, went straight to a pipeline predicted 79 % busy, which
    answered in 10.8 ms where the plain model took 7.3: docs/results/check-minilm-fp16-six).
    (Switching back to the pipeline whenever both had room once cost the next load its first second:
    the near-zero profile's pipeline carries about half of what its plain path does;
    docs/results/check-auto-2core-noslack.) A window with hardly any answers changes nothing (when a
    load stops and starts again, as a benchmark's windows do, it is served as it was). Each way's
    stub costs measured at load are corrected by what the windows served that way show against them
    (``costs``: what a request cost beyond loading's, added to it; a way not served yet is taken
    to be off by as much as the way served now), or, once its windows span batch sizes enough to
    draw a line through them, replaced by it (``ServedLine``),
    and tritonserver's cost per request is learnt for each way while it is served that way, where
    it can be read, over windows of ``CORRECT_AFTER`` answers (a pipelined request never taken to
    cost it less than a plain one: ``_server_s``).

    Where the way served is at capacity and the other is predicted less busy, but within the model's
    error, the other is tried (``Trial``); so is plain where the pipeline is within the model's
    error of capacity and plain, in the batches it would gather, is predicted less busy than the
    pipeline is and than it would be in batches as large (``_batched``). The way tried is served for
    ``TRIAL_WINDOWS`` and kept where it answered ``TRIAL_GAIN`` more (or as many, sooner as
    measured: ``Trial``), as ``EntryWait`` tries
    returning at once. At capacity the answers/s are the way's capacity, so they decide where the
    costs cannot (three uneven timed stages at 64 in flight, served plain, had the pipeline
    predicted 93 % busy against plain's 99 %, and plain stayed, at 0.84x the answers of the forced
    pipeline; the costs then carried plain's correction to the pipeline as a factor). One trial a
    load: none again until the load moves (``_another_load``)."""

    tables: Sequence[LatencyTable]
    costs: HostCosts
    cores: float
    statistic: str = "mean"
    shared_host: bool = False
    mode: Mode = Mode.PIPELINE
    # The whole model's table where a batch served plain runs it as one engine (``Mode.FUSED``:
    # ``Manifest.fused``); without it the stages run in turn (``Mode.IN_TURN``).
    whole: LatencyTable | None = None
    batcher_delay_s: float = 0.0  # Triton's batcher's max_queue_delay (``round_trip_s``)
    # Whether a pipelined ``execute`` waits until stage 0 computed its queries (``waits``): its
    # calls then hold Triton's instance one after another as plain serving's do, each with its
    # requests' round trip in series (``_entry_s``).
    entry_waits: bool = False
    last: str = "nothing seen yet"  # why the mode is what it is: for the log
    measured: HostCosts = field(init=False)  # the costs as loading measured them, which windows correct
    # tritonserver's CPU seconds per request as seen served each way, the latest at each half octave
    # of answers/s, the latest sight last (``server``; a pipelined answer is a ``send()`` of its own:
    # 2-3x what an answer in ``execute``'s list costs it under load, docs/results/send-cost-2core):
    # what the load did to the way served now's, it is taken to have done to the other's
    # (``_server_s``); a way not served yet is taken to cost what the other does
    server_at: dict[Mode, dict[int, float]] = field(init=False, default_factory=dict)
    # Each way's stub seconds a request beyond loading's at the batch size seen, the answers/s and
    # the requests a run it was seen at, as last seen served that way. Loading runs each way apart from Triton
    # (``calibrate.py``): what it leaves out is mostly the stub's work receiving a call's requests
    # and sending their responses, about as much a request whichever way serves, not a share of
    # each way's own cost (a factor a way, read from the way served and carried to the other, made
    # the pipeline of three uneven stages twice loading's where it was 1.2x, and plain's base, a
    # seventh of the pipeline's, 1.4x where it was 7x: docs/results/served-cost-lines). A way not
    # served yet is taken to be off by as much as the way served now, and one last seen at a load
    # lighter by ``SWITCH_GAIN`` by no less: a load that runs the stub beside tritonserver's
    # threads makes both ways dearer alike (the pipeline seen at one request in flight as loading
    # measured it, against plain seen under 1,017 Poisson answers/s, once sent TensorRT speed to a
    # pipeline that cost more than loading's too: docs/results/served-plain-bookkeeping). (One
    # correction for both ways, read from the way served, once had the switch flip every 1.5 s at
    # near-zero compute: each window served plain forgot how much dearer the pipeline had just
    # shown itself.) A call's own share of what loading leaves out falls on each of its requests
    # as a request's: a way last seen in runs of half as many requests or fewer is taken to be off
    # by no more than the way served now, and at a lighter load, by as much (plain, seen at one
    # request in flight 127 us a request over loading's, was predicted so at 64 in flight in runs
    # of 21, 164 % busy where it spent 37 us a request and answered 1.1x what the pipeline did:
    # docs/results/check-held-out-runs).
    excess: dict[Mode, tuple[float, float, float]] = field(init=False, default_factory=dict)
    lines: dict[Mode, ServedLine] = field(init=False, default_factory=dict)  # each way's costs as served
    # Served plain, what each request last held the next batch back in series (``round_trip_s``),
    # and the answers/s it was seen at: a load served pipelined at less than ``1 - SWITCH_GAIN``
    # of that rate is taken as another one (a closed loop served faster answers no less), where
    # plain serving is predicted without it. Of two steady windows, the less (a load starting within
    # a window leaves it idle too: at 16 in flight, the first window read 8 ms a request at 97
    # answers/s); a switch needs two (``observe``), so the round trip it acted on is such a one.
    round_trip: tuple[float, float] = field(init=False, default=(0.0, 0.0))
    _seen: tuple[Mode, float] = field(init=False, default=(Mode.PIPELINE, 0.0))  # the last window's way, how busy
    _before: Seen | None = field(init=False, default=None)  # the window before, since the last switch
    trying: Trial | None = field(init=False, default=None)  # the way served now on trial, against the other
    # The answers/s and rows a run at which the last trial began; none since a pause (``_another_load``).
    _tried_at: tuple[float, float] | None = field(init=False, default=None)

    def __post_init__(self):
        self.measured = self.costs

    @property
    def plain(self) -> Mode:
        """How a batch served plain runs."""
        return Mode.IN_TURN if self.whole is None else Mode.FUSED

    def observe(self, window: Window, trial: bool = False) -> Mode | None:
        """Take a window served ``self.mode``; the mode to serve where it switches or keeps a
        trial (``Trial``), else None.
        ``trial``: a window of ``EntryWait``'s trial of returning at once, which serves the
        pipeline as it may not go on serving: its costs are learnt, but it decides nothing,
        nor pairs with the window after it (three uneven timed stages at 64 in flight went
        plain on a trial's two windows, batches of 9.3 rows where waiting for stage 0 forms
        17, and answered 0.84x the forced pipeline)."""
        if window.seconds <= 0:
            return None
        if window.answered < MIN_ANSWERS:  # nothing to go by: the load that comes next is likely the last one's
            self._before = None  # ... but not the same one: no window across a pause agrees with one before it
            self._tried_at = None  # ... nor is it the load last tried
            return None if self.trying is None else self._end_trial(f"a trial {way(self.mode)} ended with its load")
        rows, requests = max(window.rows, 1.0), window.requests
        if window.answered >= CORRECT_AFTER and window.inline <= MIXED_INLINE * window.answered / requests:
            # Over enough answers that the stub's per-second work, the metrics' export, weighs little in them.
            self._learn(window.stub_s / window.answered, requests, window.answered / window.seconds)
        if window.server_s is not None and window.answered >= CORRECT_AFTER:
            seen, load = self.server_at.setdefault(self.mode, {}), half_octave(window.answered / window.seconds)
            seen.pop(load, None)
            seen[load] = window.server_s / window.answered
        if trial:
            self._before = None
            return None
        rate = window.answered / window.seconds
        before = self._before
        steady = before is not None and not moved(rate, before.rate)
        trip = round_trip_s(window, self.batcher_delay_s) if self.mode is not Mode.PIPELINE and window.executes \
            else None
        if trip is not None:
            self.round_trip = (min(trip, before.trip) if steady and before.trip is not None else trip, rate)
        series = self._series_s(rate)
        plain = self.plain
        other = self._other
        engines, host = self._predicted(other, window, series)
        busy = {self.mode: self._utilisation(self.mode, window, series), other: max(engines, host)}
        self._seen = (self.mode, busy[self.mode])
        # The way served now shows how busy it is; the other's host is a prediction, weighed as busier
        # by the model's error: near capacity a few points decide the wait (a near-zero model, plain
        # 100 % busy, switched to a pipeline predicted 98 %, which could not carry the load).
        overlap = self._overlap(window, rows, requests)
        latency = {self.mode: self._latency(self.mode, busy[self.mode], rows, requests, series, overlap),
                   other: self._latency(other, max(engines, host * (1 + SWITCH_GAIN)), rows, requests, series, overlap)}
        self.last = (f"{rate:.0f} answers/s, {rows:.1f} rows a run"
                     f"{f' ({requests:.1f} requests)' if requests < rows - 0.05 else ''}"
                     f"{f', requests overlapping {overlap:.0%} as often as at random' if overlap < 0.995 else ''}: "
                     f"{_ms(latency[Mode.PIPELINE])} pipelined ({busy[Mode.PIPELINE]:.0%} busy"
                     f"{f', {_ms(window.piped_s / window.piped)} measured inside the model' if window.piped else ''}), "
                     f"{_ms(latency[plain])} plain ({busy[plain]:.0%}, {series * 1e6:.0f} us a request's round trip "
                     f"in series) ({self.costs.describe()}, tritonserver {self._server_text()})")
        # Its answers are its capacity, not the load, where it is overloaded, and where the clients
        # wait on their answers (a round trip in series) and keep the instance busy within the
        # model's error of all the time: weigh capacities.
        looped = self.mode is not Mode.PIPELINE and series > 0 and busy[self.mode] >= 1 - SWITCH_GAIN
        if self.trying is not None:
            self._before = None
            return self._trial(rate, rows, measured_s(window, self.mode is Mode.PIPELINE))
        overloaded = math.isinf(latency[self.mode])
        capped = looped or overloaded
        if capped:  # ... and a loop is a guess at the load's kind, which only a trial's answers confirm (``Trial``)
            better = overloaded and busy[other] < busy[self.mode] * (1 - SWITCH_GAIN)
        else:
            better = latency[other] < latency[self.mode] * (1 - SWITCH_GAIN)
        # Pipelined within the model's error of capacity, plain is tried where its batches would carry more.
        near = capped or (self.mode is Mode.PIPELINE and busy[self.mode] >= 1 - SWITCH_GAIN)
        tries = near and not better and self._another_load(rate, rows) and (busy[other] < busy[self.mode] or (
            other is not Mode.PIPELINE and self._batched(window, series, busy[self.mode])))
        self._before = Seen(rate, trip, other if better or tries else None)
        if not (better or tries) or not steady or before.wanted is not other:
            return None  # a window may hold a load starting or stopping: the one before must agree
        if not better:
            self.trying = Trial((before.rate + rate) / 2, measured_s(window, self.mode is Mode.PIPELINE))
            self._tried_at = (self.trying.baseline, rows)
            self.last = f"a trial, {way(self.mode)} at capacity: {self.last}"
        return self._switch(other)

    def _batched(self, window: Window, series: float, busy: float) -> bool:
        """Whether plain serving, carrying a pipelined window's answers in batches as large as
        the tables go, would be less busy than the pipeline is (``busy``) and than it would be in
        batches as large: what plain's capacity allows, where a trial says whether the load lets
        it gather them (a closed loop of fewer requests cannot). A pipeline's stage 0 gathers what
        arrives during one stage, a plain call what arrives during the whole model, so a pipeline
        near capacity predicts plain at its own rows a run, busier than plain would be: six stages
        of 0.7-1 ms (BERT-base in FP16 on an H100) at 64 in flight on a one-core server pipelined
        at 17.6 rows a run, 99 % busy at 2,200 answers/s, predicted plain 90-103 % busy at those
        rows and stayed, at 0.82x the plain model, which ran 48 rows a call
        (docs/results/trial-plain-batches). But a pipeline is busy in small batches under an open
        load well below its capacity too, and its batches grow with the load as plain's do: where
        it is predicted less busy in batches as large, plain carries less whatever the load (the
        slower engine's two stages under Poisson 420/s, 2.3 rows a run and 88 % busy, tried plain,
        predicted 53 % busy in its largest batches where the pipeline would be 34 %, after every
        pause, each trial two windows of an overloaded plain: 1.08x the forced pipeline's mean,
        docs/results/check-held-out-four)."""
        rows = max(float(self.tables[0].batch_sizes[-1]), window.rows)
        plain = max(self._predicted(self.plain, window, series, rows=rows))
        return plain < busy and plain < max(self._predicted(Mode.PIPELINE, window, series, rows=rows))

    def _another_load(self, rate: float, rows: float) -> bool:
        """Whether a load at capacity is another than the one last tried (``Trial``): none tried
        since the last pause, or its answers/s moved by ``SWITCH_GAIN``, or its rows a run by twice
        that. At capacity the answers/s stay where the load grows, and the rows a run, the queue
        Triton gathers behind the instance, show it: ResNet-50's stages from an H200 on a one-core
        server, served plain at capacity, tried the pipeline at 16 in flight (12 rows a run) and
        that load ended within the trial; at 64 in flight (16 rows a run) plain answered 930/s
        again and the pipeline was not tried, at 0.87x the forced pipeline's answers
        (docs/results/trial-another-load)."""
        if self._tried_at is None:
            return True
        at, rows_at = self._tried_at
        return moved(rate, at) or moved(rows, rows_at, 2 * SWITCH_GAIN)

    def _learn(self, per_request_s: float, requests: float, rate: float) -> None:
        """The stub's seconds a request served as now at ``requests`` a run and ``rate`` answers/s,
        against what loading measured: each way's costs from its own line where it has one
        (``ServedLine``), else loading's and the excess a request last seen served that way (no
        less than the way served now's where that was at a load lighter by ``SWITCH_GAIN``, no
        more where it was in runs of half as many requests or fewer, the way served now's where
        both), or, not served yet, the way served now's."""
        predicted = self.measured.stub_s(self.mode, requests) / requests
        now = max(per_request_s - predicted, -(1 - LEAST_SHARE) * predicted)
        self.excess[self.mode] = (now, rate, requests)

        def excess(mode: Mode) -> float:
            seen, at, runs_of = self.excess.get(mode, (now, rate, requests))
            lighter, fewer = at < (1 - SWITCH_GAIN) * rate, runs_of * LINE_SPREAD <= requests
            if fewer:  # its excess held a call's costs spread over fewer requests: at most as much now
                return now if lighter else min(seen, now)
            return max(seen, now) if lighter else seen

        self.lines.setdefault(self.mode, ServedLine()).add(requests, per_request_s)
        costs = self.measured.plus(excess(Mode.PIPELINE), excess(self.plain))
        lined = []
        for mode, line in self.lines.items():
            if (fit := line.fit()) is not None:
                costs = costs.served(mode, *fit)
                lined.append(way(mode))
        self.costs = replace(costs, how=f"{self.measured.how}; {' and '.join(lined)} as served (decide.ServedLine)") \
            if lined else costs

    def _trial(self, rate: float, rows: float, took_s: float | None) -> Mode | None:
        """A window of a trial, with its requests' measured latency (``measured_s``): after
        ``TRIAL_WINDOWS``, the way tried is kept (returned, as a switch to it) or left. A way kept
        runs its own rows a run at the load tried, which ``_another_load`` must not take for
        another load (kept plain at 48 rows where the pipeline had run 17, the pipeline was tried
        straight back)."""
        trial = self.trying
        if trial.moved(rate):
            return self._end_trial(f"a trial {way(self.mode)} ended with its load")
        kept = trial.take(rate, took_s)
        if kept is None:
            return None
        said = trial.said(f"a trial {way(self.mode)}", way(self._other))
        if kept:
            self.trying, self.last, self._tried_at = None, f"{said}: kept", (trial.answered, rows)
            return self.mode
        return self._end_trial(f"{said}: {trial.refused}")

    @property
    def _other(self) -> Mode:
        return self.plain if self.mode is Mode.PIPELINE else Mode.PIPELINE

    def _end_trial(self, why: str) -> Mode | None:
        """Back to the way served before the trial."""
        self.trying, self.last = None, why
        return self._switch(self._other)

    def host_busy(self, window: Window) -> float | None:
        """The host's utilisation as a window ``observe`` took showed it, served as now (``_host``:
        the stub's interpreter, or the cores with tritonserver and the other processes on them),
        for ``EntryWait``; None where the window answered too few to go by."""
        if window.seconds <= 0 or window.answered < MIN_ANSWERS:
            return None
        return self._host(window.stub_s, window, self.mode)

    def hold_rate(self, window: Window, held: bool) -> float | None:
        """The arrival rate up to which a hold (``hold.py``) may hold queries back, from a window
        served plain with answers enough (None from any other: the rate stays as it was): the
        capacity it shows, its rate over its nearest limit's utilisation. That is exact at
        capacity and less below it, wherever the host has costs that do not grow with the load
        (tritonserver's and the stub's own threads): no margin for the model's error on top (with
        0.85 of it, at 0.5 of the plain peak at TensorRT speed, the hold mostly held nothing and
        read 1.01x the best benchmark's objective; without, 0.72x).
        A held answer is a ``send()``, which costs the stub a round trip and
        tritonserver more than an answer in ``execute``'s list (204-250 against 88 us a request:
        docs/results/send-cost-2core), so a window that sent few answers (``held`` false) is
        taken to carry as much less as the costs predict (``_sent_share``). Held for the SMDP's
        control limit at 0.9 of the plain peak at TensorRT speed on this project's 2-core host,
        with no such bound, the mean went from 112 to 324 ms
        (docs/results/smdp-power-weight-plain-hold)."""
        mode, busy = self._seen
        if mode is Mode.PIPELINE or window.answered < CORRECT_AFTER or busy <= 0:
            return None
        capacity = window.answered / window.seconds / busy
        return capacity * (1.0 if held else self._sent_share(window.requests))

    def _sent_share(self, requests: float) -> float:
        """What the host carries with every answer sent, as a share of what it carries with
        every answer in ``execute``'s list, by the costs: a ``send()`` is a round trip
        (``HostCosts.send_s``) of the stub's, and about as much again of tritonserver's."""
        stub, server = self.costs.stub_s(self.plain, requests) / requests, self._server_s(self.plain)
        listed = max(stub, (stub + server) / self.cores)
        sent = max(stub + self.costs.send_s, (stub + server + 2 * self.costs.send_s) / self.cores)
        return listed / sent if sent > 0 else 1.0

    def _latency(self, mode: Mode, busy: float, rows: float, requests: float, series: float,
                 overlap: float = 1.0) -> float:
        """A request's mean seconds served ``mode`` with its nearest limit ``busy``, in runs of
        ``rows`` from ``requests``: its batch's own time, and the wait for the batch ahead at that
        limit (M/D/1: plain, the batch's time and its requests' round trip in series, ``series``
        each; ``overlap`` of it where requests find a batch ahead less often than random arrivals
        would, ``_overlap``); infinite at or past capacity."""
        if busy >= 1:
            return math.inf
        stub = self.costs.stub_s(mode, requests)
        if mode is not Mode.PIPELINE:
            own = self._device_s(mode, rows) + stub
            return own + overlap * (own + requests * series) * busy / (2 * (1 - busy))
        own = self._device_s(Mode.IN_TURN, rows) + stub  # its stages, one after another
        ahead = max(self._device_s(mode, rows), stub, self._entry_s(rows, requests, series))
        return own + self.costs.handoff_s + overlap * ahead * busy / (2 * (1 - busy))

    def _overlap(self, window: Window, rows: float, requests: float) -> float:
        """How often a window's requests found a batch ahead of them, as a share of how often random
        arrivals would have (at most 1). Served pipelined: the share of its requests that came in no
        lone call (``Window.lone``: the calls that found the pipeline empty; the rest found a batch
        in it or waiting at its entry; counted by requests, as Triton gathers those that arrive
        during a call into one), over the share of the time stage 0 would have been busy had every
        batch run through it (by the tables at the window's rows; random arrivals find it busy that
        often, and the pipeline busy at least as often). Served plain: a call's requests beyond its
        first (they arrived while the call before ran), over what random arrivals would bring at the
        window's rate and calls, ``rate took + exp(-rate took) - 1`` (simulated, Poisson arrivals
        read 0.99 of it from 100 to 2,000 a second; Triton's hand-off between calls adds more,
        capped). A closed loop of one request in flight never finds a batch ahead, whichever way
        serves it: counted as random arrivals, TensorRT-speed BERT-base's requests of 8 rows at
        500/s had plain serving predicted to wait 0.6 ms a request behind another, and the model
        kept pipelining (its lone batches inline), its stub 100 us a request dearer than the plain
        model's, at 0.91x-0.97x its answers/s; counted one way and not the other, the two ways could
        each predict the other sooner. 1 where the window cannot tell: its calls not counted
        (several instances, a hold), or, pipelined, its lone batches."""
        if not window.executes or window.seconds <= 0:
            return 1.0
        if self.mode is not Mode.PIPELINE:
            rate, took = window.answered / window.seconds, window.execute_s / window.executes
            beyond = rate * took + math.exp(-rate * took) - 1  # a call's requests beyond its first, at random
            return min(max(window.answered / window.executes - 1, 0.0) / beyond, 1.0) if beyond > 0 else 1.0
        stage0 = window.answered / requests * self._device_s(Mode.IN_TURN, rows, self.tables[:1]) / window.seconds
        found = 1 - min(window.lone, window.answered) / window.answered
        return min(found / stage0, 1.0) if stage0 > 0 else 1.0

    def _switch(self, mode: Mode) -> Mode | None:
        if mode is self.mode:
            return None
        self.mode, self._before = mode, None
        return mode

    def _utilisation(self, mode: Mode, window: Window, series: float) -> float:
        """The nearest limit's utilisation as the window showed it: served plain, the instance's
        too (its time inside ``execute`` and its requests' round trip in series)."""
        busy = window.busy_s or (0.0,)
        engines = (max(busy) if mode is Mode.PIPELINE else sum(busy)) / window.seconds
        if mode is not Mode.PIPELINE and window.executes:
            engines = max(engines, (window.execute_s + window.answered * series) / window.seconds)
        return max(engines, self._host(window.stub_s, window, mode))

    def _predicted(self, mode: Mode, window: Window, series: float, rows: float | None = None) -> tuple[float, float]:
        """The engines' and the host's utilisation had the window's load been served ``mode``
        (the engines' read from their tables; the host's scaled from costs measured elsewhere).
        Served plain, the engines' is the instance's: each batch runs inside ``execute``, the stub's
        work and the engines' one after another, and its requests' round trip in series. A
        pipeline overlaps that round trip with the engines but does not shorten it: in a closed
        loop of ``n`` it still answers at most ``n`` a round trip, so its share of the window is a
        limit too (near-zero compute at 64 in flight, served plain on a one-core server: the
        instance 98 % busy at 1,752 answers/s, 89 % of it the round trip, where the pipeline,
        predicted 72 % busy by its stub costs alone, answered 1,200). ``rows``: runs of these rows
        in place of the window's (``_batched``)."""
        if rows is not None:
            window = replace(window, rows=rows)
        rows, requests = max(window.rows, 1.0), window.requests
        batches = window.answered / requests
        stub = batches * self.costs.stub_s(mode, requests)
        engines = batches * self._device_s(mode, rows)
        if mode is not Mode.PIPELINE:
            engines += stub + window.answered * series
        else:  # each request's round trip is its own, whoever serves it: a pipeline overlaps it with the engines
            engines = max(engines, window.answered * series, batches * self._entry_s(rows, requests, series))
        return engines / window.seconds, self._host(stub, window, mode)

    def _entry_s(self, rows: float, requests: float, series: float) -> float:
        """The seconds a pipelined call of ``rows`` from ``requests`` holds Triton's instance where ``execute`` waits
        for stage 0 (``entry_waits``; else none): stage 0's time, and its requests' round trip in
        series, as a call served plain has it. What the round trip reads under an open load is
        mostly Triton's hand-off from one call to the next, which a waiting entry pays as plain
        serving does: counted for plain alone, 242 us a request at 908 Poisson answers/s at
        TensorRT speed (1.7 rows a call) sent the model to a pipeline predicted at 1.56 ms against
        2.03, which answered in 3.1 ms where plain had in 2.3."""
        if not self.entry_waits:
            return 0.0
        return self._device_s(Mode.IN_TURN, rows, self.tables[:1]) + requests * series

    def _series_s(self, rate: float) -> float:
        """A plain request's round trip in series (``round_trip``) at a load of ``rate`` answers/s."""
        seconds, seen_at = self.round_trip
        return seconds if rate >= (1 - SWITCH_GAIN) * seen_at else 0.0

    def _device_s(self, mode: Mode, rows: float, tables: Sequence[LatencyTable] | None = None) -> float:
        """The engines' seconds for a batch of the ``rows`` seen, served ``mode`` (through the
        whole model's table where it runs fused, else the stages', else those ``tables``)."""
        if tables is None:
            tables = [self.whole] if mode is Mode.FUSED and self.whole is not None else self.tables
        bs = max(1, min(round(rows), self.tables[0].batch_sizes[-1]))
        return device_s(tables, mode, bs, middle_length(self.tables), self.statistic, self.shared_host)

    def _host(self, stub_s: float, window: Window, mode: Mode) -> float:
        """The host's utilisation: the stub's one interpreter, or the cores with tritonserver
        and the other processes on them (``Window.others_s``: at the window's load they take the
        same whichever way serves it; left out, a check on one core with its clients there read
        a pipeline 78 % busy against plain's 99 % at 16 in flight, switched to it, and answered
        0.86x the plain model: docs/results/check-auto-poisson-peak)."""
        server = window.answered * self._server_s(mode)
        return max(stub_s, (stub_s + server + window.others_s) / self.cores) / window.seconds

    def _server_s(self, mode: Mode) -> float:
        """tritonserver's CPU seconds a request served ``mode``: as last seen served that way,
        scaled as the way served now's changed since that load where it was seen there too (a
        call's own cost spreads over the requests a call brings: at TensorRT speed, requests of 8
        rows, the pipeline cost it 652 us a request at 1 in flight and 406 at 8, and seen at 1, it
        was predicted overloaded at 8, where it was 70 % busy), but never less pipelined than what
        serving plain shows now, nor more plain than what pipelining shows now. A pipelined answer
        is a ``send()`` of its own where a plain one goes back in ``execute``'s list, so it costs
        tritonserver as much or more; a sight of the other way taken at another load must not say
        otherwise. (The pipeline seen at 234 us a request in a first, light second, against 348
        served plain, once sent an overloaded near-zero model to a pipeline that carried less:
        docs/results/check-auto-client-core's rerun.)"""
        server = self.server
        now = server.get(self.mode)
        seen = server.get(mode, now)
        if seen is None:
            return 0.0
        if now is None or mode is self.mode:
            return seen
        loads = self.server_at.get(mode)
        then = self.server_at.get(self.mode, {}).get(next(reversed(loads))) if loads else None
        if then:
            seen *= now / then
        return max(seen, now) if mode is Mode.PIPELINE else min(seen, now)

    @property
    def server(self) -> dict[Mode, float]:
        """tritonserver's CPU seconds a request as last seen served each way."""
        return {mode: next(reversed(seen.values())) for mode, seen in self.server_at.items()}

    def _server_text(self) -> str:
        """Each way's tritonserver cost a request as the switch takes it now (``_server_s``)."""
        return ", ".join(f"{self._server_s(m) * 1e6:.0f} us a request {'pipelined' if m is Mode.PIPELINE else 'plain'}"
                         for m in self.server_at) or "not seen"


def moved(value: float, since: float, share: float = SWITCH_GAIN) -> bool:
    """Whether ``value`` lies more than ``share`` of ``since`` from it: a load (or a queue) that
    moved, which the trials and the switch's pairs of windows take for another."""
    return abs(value - since) > share * since


def half_octave(value: float) -> int:
    """Which half octave ``value`` (at least 1) lies in: the windows of one load or batch size."""
    return round(2 * math.log2(max(value, 1.0)))


def way(mode: Mode) -> str:
    """How ``mode`` serves, in the log's words."""
    return "pipelined" if mode is Mode.PIPELINE else "plain"


def _ms(seconds: float) -> str:
    """A predicted latency for the log: the M/D/1 wait grows without bound near capacity (a way
    100 % busy to the percent read "41442145.62 ms"), so a minute or more reads as overloaded."""
    return "overloaded" if seconds >= 60 else f"{seconds * 1000:.2f} ms"
