"""The load generator: phases of closed-loop (concurrency) or open-loop (request rate) load.

A run is a sequence of phases with no pause between them; a *plan* chooses each next phase from
how the earlier ones went (perf_analyzer's stabilising windows, the paper's stepping load that
stops past the QoS, or a fixed list). Closed loop: ``concurrency`` workers each send the next
request when their last is answered. Open loop: requests leave at scheduled times (constant,
Poisson or a file of intervals) whether or not earlier ones came back, up to ``max_outstanding``
at once (a request that has to wait for a free slot is *late*). Every request is recorded with
its scheduled, sent and received times and its status; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tools.load.stats import Record, Summary, stable, summarize
from tools.load.transport import Transport
from tools.load.workload import Request

DISTRIBUTIONS = ("constant", "poisson")


@dataclass(frozen=True)
class Phase:
    """``seconds`` of load at ``concurrency`` (closed loop) or ``rate`` requests/s (open loop)."""

    seconds: float
    concurrency: int | None = None
    rate: float | None = None
    label: str = ""

    def __post_init__(self):
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a phase has a concurrency or a rate")


@dataclass(frozen=True)
class PhaseRun:
    phase: Phase
    start: float
    end: float
    judged: Summary  # at the phase's end, unanswered requests counted with their age


@dataclass
class Run:
    records: list[Record]
    phases: list[PhaseRun] = field(default_factory=list)

    def summary(self, phases: Sequence[PhaseRun], percentiles: Sequence[int] = ()) -> Summary:
        """Final numbers over consecutive phases, every request answered by now."""
        return summarize(self.records, phases[0].start, phases[-1].end, percentiles)


Plan = Callable[[Sequence[PhaseRun]], Phase | None]


class LoadGenerator:
    def __init__(self, transport: Transport, requests: Sequence[Request], distribution: str = "poisson",
                 intervals_us: Sequence[float] | None = None, timeout_s: float = 60.0, max_outstanding: int = 1024,
                 max_requests: int | None = None, seed: int = 0):
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, not {distribution!r}")
        self._transport, self._requests = transport, requests
        self._distribution, self._intervals = distribution, intervals_us
        self._timeout, self._max_outstanding, self._max_requests = timeout_s, max_outstanding, max_requests
        self._rng = random.Random(seed)

    def run(self, plan: Plan, on_phase: Callable[[int, Phase], None] | None = None,
            percentiles: Sequence[int] = ()) -> Run:
        """Run phases until the plan says stop (or ``max_requests`` were sent); wait for every answer."""
        return asyncio.run(self._run(plan, on_phase, percentiles))

    async def _run(self, plan: Plan, on_phase, percentiles) -> Run:
        loop = asyncio.get_running_loop()
        self._now = lambda t0=loop.time(): loop.time() - t0
        self._records: list[Record] = []
        self._inflight: set[asyncio.Task] = set()
        self._workers: dict[int, asyncio.Task] = {}
        self._target, self._phase, self._items = 0, 0, itertools.cycle(range(len(self._requests)))
        run = Run(self._records)
        try:
            while not self._exhausted() and (phase := plan(run.phases)) is not None:
                if on_phase:
                    on_phase(len(run.phases), phase)
                start = self._now()
                if phase.concurrency is not None:
                    await self._closed(phase.concurrency, start + phase.seconds)
                else:
                    await self._open(phase.rate, start, start + phase.seconds)
                end = self._now()
                run.phases.append(PhaseRun(phase, start, end, summarize(self._records, start, end, percentiles, end)))
                self._phase += 1
        finally:
            self._target = 0
            await asyncio.gather(*self._workers.values(), *self._inflight)
            await self._transport.close()
        return run

    def _exhausted(self) -> bool:
        return self._max_requests is not None and len(self._records) >= self._max_requests

    async def _closed(self, concurrency: int, end: float) -> None:
        self._target = concurrency
        for index in range(concurrency):
            if index not in self._workers:
                self._workers[index] = asyncio.create_task(self._worker(index))
        await asyncio.sleep(max(0.0, end - self._now()))

    async def _worker(self, index: int) -> None:
        try:
            while index < self._target and not self._exhausted():
                await self._spawn(self._now())
        finally:
            del self._workers[index]

    async def _open(self, rate: float, start: float, end: float) -> None:
        self._target = 0  # closed-loop workers, if any, stop after their current request
        for offset in self._arrivals(rate):
            due = start + offset
            if due >= end or self._exhausted():
                break
            if due > self._now():
                await asyncio.sleep(due - self._now())
            while len(self._inflight) >= self._max_outstanding:
                await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
            task = asyncio.create_task(self._spawn(due))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)
        await asyncio.sleep(max(0.0, end - self._now()))

    def _arrivals(self, rate: float) -> Iterator[float]:
        """Offsets (s) from a phase's start: the intervals file, or constant or Poisson gaps."""
        offset = 0.0
        gaps = (itertools.cycle(self._intervals) if self._intervals else None)
        while True:
            if gaps is not None:
                offset += next(gaps) / 1e6
            elif rate <= 0:
                return
            elif self._distribution == "constant":
                offset += 1 / rate
            else:
                offset += self._rng.expovariate(rate)
            yield offset

    async def _spawn(self, scheduled: float) -> None:
        item = next(self._items)
        request = self._requests[item]
        record = Record(self._phase, item, scheduled, self._now(), request.rows, request.length)
        self._records.append(record)
        try:
            record.status, record.error = await self._transport.send(item, self._timeout)
        except Exception as exc:  # noqa: BLE001 - a client-side failure is a result, not a crash
            record.status, record.error = "CLIENT_ERROR", f"{type(exc).__name__}: {exc}"
        record.received = self._now()


def fixed(phases: Sequence[Phase]) -> Plan:
    """Each phase once, in order."""
    return lambda done: phases[len(done)] if len(done) < len(phases) else None


def stepping(rates: Sequence[float], seconds: float, threshold_ms: float | None,
             percentile: int | None = 99) -> Plan:
    """The paper's stepping load: each rate for ``seconds``, back to back, stopping after the
    first step whose latency (``percentile``, or the mean) passes ``threshold_ms`` or that had
    failures: the steps before it are the load the server sustains within the QoS."""
    def plan(done: Sequence[PhaseRun]) -> Phase | None:
        if done and threshold_ms is not None and violates(done[-1].judged, threshold_ms, percentile):
            return None
        if len(done) == len(rates):
            return None
        return Phase(seconds, rate=rates[len(done)], label=f"step {len(done)}")
    return plan


def violates(summary: Summary, threshold_ms: float, percentile: int | None) -> bool:
    latency = summary.latency(percentile)
    return bool(summary.failures) or math.isnan(latency) or latency > threshold_ms


def sweep(levels: Sequence[Phase], window_s: float, tolerance_percent: float, max_trials: int,
          percentile: int | None, threshold_ms: float | None) -> Plan:
    """perf_analyzer's search: at each level, windows of ``window_s`` until the last three agree
    within ``tolerance_percent`` (or ``max_trials``), then the next level, stopping after a level
    whose latency passes ``threshold_ms``. Windows carry their level's label."""
    def plan(done: Sequence[PhaseRun]) -> Phase | None:
        level = len({p.phase.label for p in done})
        if done:
            windows = [p.judged for p in done if p.phase.label == done[-1].phase.label]
            if not stable(windows, tolerance_percent, percentile) and len(windows) < max_trials:
                return done[-1].phase
            if threshold_ms is not None and violates(windows[-1], threshold_ms, percentile):
                return None
        if level == len(levels):
            return None
        return Phase(window_s, levels[level].concurrency, levels[level].rate, levels[level].label)
    return plan
