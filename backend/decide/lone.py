"""Whether a batch that finds the pipeline empty runs inside ``execute`` (``LoneRuns``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..manifest import Manifest
from .costs import HostCosts, Mode


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
    where 0.92 came), and a run of another length as many more as it is longer.

    ``scale``: the engines' time as times their tables' while serving (``ModeSwitch.off``); the
    tables may be another machine's or another load's, and what an arrival waits more behind an
    inline run grows with the run's real time. Read at a sixteenth of it, a lone batch would
    be judged to hold the instance a sixteenth as long as it does."""

    saved_s: float
    runs_s: dict[int | None, tuple[tuple[float, float], ...]]
    scale: float = 1.0
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
        ``rows`` and its ``length`` rounded up to a tabulated one (the middle one where it has none),
        times ``scale``."""
        lengths = self._lengths
        if length is None or lengths[0] is None:
            at = lengths[len(lengths) // 2]
        else:
            at = next((n for n in lengths if n >= length), lengths[-1])
        by_rows = self.runs_s[at]
        total, first = by_rows[min(max(rows, 1), len(by_rows)) - 1]
        return total * self.scale, first * self.scale

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
