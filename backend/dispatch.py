"""``policy: smdp``: the entry's dispatch decision from the SMDP of ``smdp.py``, solved over the
stage latency tables at the arrival rate the entry measures.

When stage 0 is ready for more queries (the SMDP's decision epoch: the server finished a batch,
or a query arrived while it idled) with ``s`` queries waiting, the solved policy says whether to
serve ``a`` of them now or to wait for the next arrival. The server is the pipeline: a batch of
``b`` takes its slowest stage's time (with the host's measured cost of a stage run) or, where
longer, the stub's measured work for it, which is how often the pipeline can take one. Its
energy, where ``power_weight`` is set on a GPU instance, is the GPU's own per batch, measured
from NVML's counter when the model loads (``calibrate.energy``); elsewhere (a CPU instance, no
NVML, a GPU without the counter; the model's log says why) the engines' busy seconds (every
stage's time), a proxy. ``power_weight`` weighs the mean power against the mean response time
(seconds of response time per watt; with the proxy, per fully busy engine): 0, the default,
minimises the response time alone.

The policy is solved per tabulated length (the oldest query's, where the model has a length
axis) and per arrival rate (the entry's steady rate, over its last ``entry.STEADY`` arrivals:
Triton hands queries over in batches, so a shorter count reads a burst; none older than
``entry.STEADY_S`` before the latest, so a pause is no load), rounded to
``RATE_STEP`` steps, on a thread of its own and kept:
stage 0's path only looks a solution up. Until one is solved for the rate seen (a few ms to a
second), and where the rate is unknown, the entry serves what waits (work-conserving). Late
queries still stretch a running batch (Policy III, as ``policy: load``): the meta operations
compose with the dispatch rule. A wait is bounded: where the queries the control limit waits
for do not come (the load stopped), the oldest waits at most twice the time they take on
average at the measured rate. With ``static`` set, the entry serves exactly that many instead
(waiting as long, bounded alike) and no late query stretches them: the paper's static
benchmark, served as the policy is.

Nothing here imports Triton.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import smdp
from .decide import HostCosts, Mode
from .diversity import DiversityPolicy
from .errors import ConfigError
from .manifest import Manifest
from .policy import Outlook
from .query import BatchShape, Query

log = logging.getLogger(__name__)
RATE_STEP = 1.25  # arrival rates are solved for on a geometric grid of this step (25 % apart)
MAX_LOAD = 0.95  # rates nearer capacity are solved as this load (the truncation grows without end)


@dataclass
class SmdpPolicy(DiversityPolicy):
    name = "smdp"
    load: bool = True  # Policy III's stretch: late queries join a running batch
    power_weight: float = 0.0  # seconds of mean response time one watt (or one busy engine) is worth
    static: int = 0  # > 0: serve exactly this many, none stretched in (the paper's static benchmark), not the SMDP's
    _problems: dict[int | None, smdp.Problem] = field(init=False, repr=False, default_factory=dict)  # by length
    _costs: HostCosts = field(init=False, repr=False, default_factory=HostCosts)
    _joules: dict[int, float] = field(init=False, repr=False, default_factory=dict)  # measured energy per batch
    _solved: dict[tuple[int | None, int | None], smdp.Solution] = field(init=False, repr=False, default_factory=dict)
    _wanted: list[tuple[int | None, int]] = field(init=False, repr=False, default_factory=list)
    _solving: tuple[int | None, int] | None = field(init=False, repr=False, default=None)
    _lock: threading.Condition = field(init=False, repr=False, default_factory=threading.Condition)
    _solver: threading.Thread | None = field(init=False, repr=False, default=None)

    def __post_init__(self):
        super().__post_init__()
        if self.power_weight < 0:
            raise ConfigError(f"parameter 'policy.power_weight' must be >= 0, got {self.power_weight}")
        if self.static:
            self.load = False  # a static batch is that many: no late query stretches it

    def bind(self, manifest: Manifest) -> None:
        super().bind(manifest)
        if not 0 <= self.static <= manifest.max_batch_size:
            raise ConfigError(f"parameter 'policy.static' must lie in 0..{manifest.max_batch_size} (max_batch_size), "
                              f"got {self.static}")
        self._forget()

    def measured(self, costs: HostCosts, stages: int) -> None:
        super().measured(costs, stages)
        self._costs = costs
        self._forget()

    def energy_measured(self, joules: Mapping[int, float]) -> None:
        """The device's joules per batch of the sizes measured (``calibrate.energy``): the energy
        the power weight weighs from now on, in place of the engines' busy seconds."""
        self._joules = dict(joules)
        self._forget()
        self.said("smdp energy per batch from the GPU's counter: " + ", ".join(
            f"{rows} rows {j:.3f} J" for rows, j in sorted(self._joules.items())))

    def _forget(self) -> None:
        """The problems and their solutions, made from tables or costs that changed."""
        with self._lock:
            self._problems.clear()
            self._solved.clear()

    def problem(self, length: int | None, arrivals_per_s: float) -> smdp.Problem:
        """The dispatch problem at ``length`` and ``arrivals_per_s``: per batch size, the
        pipeline's period and the engines' busy seconds (every stage's time) as its energy. The
        period is its slowest stage (with the host's cost of a stage run), or where longer the
        stub's own work for the batch, as measured where the model serves (``measured``): on
        BERT-base's TensorRT tables the stages take 2 ms for 64 rows and this host's stub 4.7,
        so without it the policy took a load of 0.9 for 0.1."""
        problem = self._problems.get(length)
        if problem is None:
            sizes = range(1, self._max + 1)
            periods = [max(max(self._times(b, length)), self._costs.stub_s(Mode.PIPELINE, b)) for b in sizes]
            if self._joules:  # the device's own energy per batch (``calibrate.energy``), between sizes measured
                measured = sorted(self._joules)
                engines = list(np.interp(sizes, measured, [self._joules[b] for b in measured]))
            else:
                engines = [sum(t.predict(b, length, self.statistic) for t in self._tables) / 1000 for b in sizes]
            problem = self._problems[length] = smdp.Problem(tuple(periods), tuple(engines), 0.0, 1.0,
                                                            self.power_weight)
        return replace(problem, arrivals_per_s=arrivals_per_s)

    def solution(self, queries: Sequence[Query], arrivals_per_s: float) -> smdp.Solution | None:
        """The policy solved for ``queries``' length at about ``arrivals_per_s``, or None until it
        is (asking for it); the nearest solved rate meanwhile where there is one."""
        if arrivals_per_s <= 0:
            return None
        length = self.tabulated_length(self._length(None, queries[:1]))
        if length not in self._problems:
            self.problem(length, arrivals_per_s)
        if self.static:  # one rule at every rate
            with self._lock:
                solution = self._solved.get((length, None))
                if solution is None:
                    solution = self._solved[(length, None)] = smdp.unsolved(self._problems[length],
                                                                             smdp.static(self.static))
            return solution
        rate = min(arrivals_per_s, MAX_LOAD * self._problems[length].capacity)
        step = round(math.log(rate) / math.log(RATE_STEP))
        key = (length, step)
        with self._lock:
            solution = self._solved.get(key)
            if solution is not None:
                return solution
            if key not in self._wanted and key != self._solving:
                self._wanted.append(key)
                self._lock.notify()
            if self._solver is None:
                self._solver = threading.Thread(target=self._solve_wanted, name="dvabatch-smdp", daemon=True)
                self._solver.start()
            return self._nearest(length, rate)

    def _nearest(self, length: int | None, rate: float) -> smdp.Solution | None:
        """The solution at ``length`` for the rate nearest ``rate`` (the lock held)."""
        near = [solution for (at, _), solution in self._solved.items() if at == length]
        return min(near, key=lambda solution: abs(math.log(solution.problem.arrivals_per_s / rate)), default=None)

    def _solve_wanted(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._wanted)
                length, step = self._solving = self._wanted.pop()  # the latest rate first
                problem = self.problem(length, RATE_STEP ** step)
                start = self._nearest(length, problem.arrivals_per_s)
            rate = problem.arrivals_per_s
            try:
                solution = smdp.solve(problem, start)
            except Exception:  # the entry keeps serving work-conserving at this rate
                log.exception("solving the SMDP at %.1f/s failed", rate)
                with self._lock:
                    self._solving = None
                continue
            self.said(f"smdp at length {length}: {solution.describe()}")
            with self._lock:
                self._solved[(length, step)] = solution
                self._solving = None

    def window_end(self, waiting: Sequence[Query], rows: int, outlook: Outlook, now: float) -> float:
        """Now where the solved policy serves the queries waiting; else until the next arrival
        (the entry asks again when one comes), at most twice the time the control limit's
        arrivals take on average after the oldest came."""
        solution = self.solution(waiting, outlook.steady_per_s)
        if solution is None or solution.action(len(waiting)) > 0:
            return now
        limit = solution.control_limit or len(waiting)
        return waiting[0].arrived + 2 * limit / outlook.steady_per_s

    def form(self, waiting: Sequence[Query], room: int, now: float, outlook: Outlook = Outlook()
             ) -> list[tuple[list[Query], BatchShape]]:
        """The oldest ``a`` queries the solved policy serves (all that fit where it would wait:
        the window ran out), formed as Policy I would where it is on."""
        solution = self.solution(waiting, outlook.steady_per_s)
        serve = solution.action(len(waiting)) if solution is not None else 0
        if serve > 0:
            waiting = waiting[:serve]
        return super().form(waiting, room, now, outlook)
