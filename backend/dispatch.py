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
axis) and per arrival rate (the entry's steady rate, over its last ``arrival.STEADY`` arrivals:
Triton hands queries over in batches, so a shorter count reads a burst; none older than
``arrival.STEADY_S`` before the latest, so a pause is no load), rounded to
``RATE_STEP`` steps, on a thread of its own and kept:
stage 0's path only looks a solution up. Until one is solved for the rate seen (a few ms to a
second), and where the rate is unknown, the entry serves what waits (work-conserving). Late
queries still stretch a running batch (Policy III, as ``policy: load``): the meta operations
compose with the dispatch rule. A wait is bounded: where the queries the control limit waits
for do not come (the load stopped), the oldest waits at most twice the time they take on
average at the measured rate. Under Poisson arrivals that bound is rarely reached (1-2 % of
the waits at the smallest control limits, fewer at larger ones), and more rarely still with no
query arriving in the second half of the wait (starved). Where waits often run out starved, the
queries do not come while others wait: a closed loop of fewer clients than the control limit
(perf_analyzer's concurrency mode), whose next requests wait for the answers held back, or a
load that stopped. Waiting then saves nothing (the batches stay as small) and only adds the bound
to the answers: served plain at TensorRT speed with power weight 1, one client in flight read 66
answers/s where the plain model answered 710. So where ``STARVED`` of the latest ``WAITS``
waits ran out starved, the policy serves what waits for ``EAGER_S`` (the arrival rate meanwhile
forgets the waits), then looks again: it waits where the load lets it. Until its waits go well,
one wait that runs out starved is enough to serve what waits again, twice as long each time, up
to ``EAGER_MAX_S``: each look costs a wait to its bound, at a low rate a large share of 4 s (the
slower engine, one client: 0.69x the plain model's answers/s, where a look took three waits
every 4 s). (Waits that run out while queries
still come, fewer than the rate said, as Triton's bursts into an overloaded pipeline do, count
as a load: there a batch served sooner would only be smaller.) With
``static`` set, the entry serves exactly that many instead (waiting as long, bounded alike) and
no late query stretches them: the paper's static benchmark, served as the policy is.

Served plain (``policy.auto: true`` while ``decide.ModeSwitch`` runs every batch inside
``execute``), the server is the instance: a batch of ``b`` takes every stage's time one after
another and the stub's measured work for it served so. There the SMDP decides too, where it
weighs power or serves a static size (``holds``): the queries an ``execute`` hands over are held
(``hold.Hold``) while the policy solved for that server would wait (``hold_until``), and run
once it serves or its wait bound ends. At weight 0 its optimum is within a fraction of a percent
of work-conserving, which Triton's batcher already is, and a held query costs a ``send()``: it
holds nothing there.

Nothing here imports Triton.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from . import smdp
from .arrival import STEADY_S
from .decide import HostCosts, Mode
from .diversity import DiversityPolicy
from .errors import ConfigError
from .manifest import Manifest
from .policy import Outlook
from .query import BatchShape, Query

log = logging.getLogger(__name__)
RATE_STEP = 1.25  # arrival rates are solved for on a geometric grid of this step (25 % apart)
MAX_LOAD = 0.95  # rates nearer capacity are solved as this load (the truncation grows without end)
WAITS = 8  # the latest waits that ended (by the control limit, or by running out at their bound) ...
STARVED = 3  # ... of which this many ran out starved: the load does not come while queries wait
EAGER_S = 2 * STEADY_S  # ... and for this long the policy then serves what waits, doubled each time again ...
EAGER_MAX_S = 32 * STEADY_S  # ... up to this, until its waits go well


@dataclass
class SmdpPolicy(DiversityPolicy):
    name = "smdp"
    load: bool = True  # Policy III's stretch: late queries join a running batch
    power_weight: float = 0.0  # seconds of mean response time one watt (or one busy engine) is worth
    static: int = 0  # > 0: serve exactly this many, none stretched in (the paper's static benchmark), not the SMDP's
    # By length and whether the batch runs inside ``execute`` (served plain) or through the pipeline.
    _problems: dict[tuple[int | None, bool], smdp.Problem] = field(init=False, repr=False, default_factory=dict)
    _costs: HostCosts = field(init=False, repr=False, default_factory=HostCosts)
    _joules: dict[int, float] = field(init=False, repr=False, default_factory=dict)  # measured energy per batch
    # By length, served plain or not, and rate step (None: static).
    _solved: dict[tuple[int | None, bool, int | None], smdp.Solution] = field(init=False, repr=False,
                                                                              default_factory=dict)
    _wanted: list[tuple[int | None, bool, int]] = field(init=False, repr=False, default_factory=list)
    _solving: tuple[int | None, bool, int] | None = field(init=False, repr=False, default=None)
    _lock: threading.Condition = field(init=False, repr=False, default_factory=threading.Condition)
    _solver: threading.Thread | None = field(init=False, repr=False, default=None)
    # How the latest waits ended (True: ran out starved; the latest that ran out, by its oldest
    # query's id and arrival: not the query, which would keep its request), until when it serves
    # what waits, and for how long it did last (0: not since its waits last went well).
    _ended: deque[bool] = field(init=False, repr=False, default_factory=lambda: deque(maxlen=WAITS))
    _ran_out_for: tuple[int, float] | None = field(init=False, repr=False, default=None)
    _eager_until: float = field(init=False, repr=False, default=0.0)
    _eager_s: float = field(init=False, repr=False, default=0.0)

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

    @property
    def holds(self) -> bool:
        """Whether, served plain, it holds queries back for more (``hold_until``): where it weighs
        power or serves a static size."""
        return self.power_weight > 0 or self.static > 0

    def problem(self, length: int | None, arrivals_per_s: float, plain: bool = False) -> smdp.Problem:
        """The dispatch problem at ``length`` and ``arrivals_per_s``: per batch size, the
        server's time for a batch and the engines' busy seconds (every stage's time) as its
        energy. Pipelined, the server's time is its slowest stage (with the host's cost of a
        stage run) or where longer the stub's own work for the batch, as measured where the
        model serves (``measured``): on BERT-base's TensorRT tables the stages take 2 ms for 64
        rows and this host's stub 4.7, so without it the policy took a load of 0.9 for 0.1.
        Served plain (``plain``), every stage's time and the stub's work served so, one after
        another."""
        return replace(self._base(length, plain), arrivals_per_s=arrivals_per_s)

    def _base(self, length: int | None, plain: bool) -> smdp.Problem:
        """``problem`` at no arrival rate, made once (its capacity is read on stage 0's path)."""
        problem = self._problems.get((length, plain))
        if problem is None:
            sizes = range(1, self._max + 1)
            engines = [sum(t.predict(b, length, self.statistic) for t in self._tables) / 1000 for b in sizes]
            if plain:
                periods = [e + self._costs.stub_s(Mode.IN_TURN, b) for e, b in zip(engines, sizes)]
            else:
                periods = [max(max(self._times(b, length)), self._costs.stub_s(Mode.PIPELINE, b)) for b in sizes]
            if self._joules:  # the device's own energy per batch (``calibrate.energy``), between sizes measured
                measured = sorted(self._joules)
                engines = list(np.interp(sizes, measured, [self._joules[b] for b in measured]))
            problem = self._problems[(length, plain)] = smdp.Problem(tuple(periods), tuple(engines), 0.0, 1.0,
                                                                     self.power_weight)
        return problem

    def solution(self, queries: Sequence[Query], arrivals_per_s: float, plain: bool = False) -> smdp.Solution | None:
        """The policy solved for ``queries``' length at about ``arrivals_per_s`` (served plain
        or pipelined), or None until it is (asking for it); the nearest solved rate meanwhile
        where there is one."""
        if arrivals_per_s <= 0:
            return None
        length = self.tabulated_length(self._length(None, queries[:1]))
        problem = self._base(length, plain)
        if self.static:  # one rule at every rate
            with self._lock:
                solution = self._solved.get((length, plain, None))
                if solution is None:
                    solution = self._solved[(length, plain, None)] = smdp.unsolved(problem, smdp.static(self.static))
            return solution
        rate = min(arrivals_per_s, MAX_LOAD * problem.capacity)
        key = (length, plain, round(math.log(rate) / math.log(RATE_STEP)))
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
            return self._nearest(length, plain, rate)

    def _nearest(self, length: int | None, plain: bool, rate: float) -> smdp.Solution | None:
        """The solution at ``length`` (served so) for the rate nearest ``rate`` (the lock held)."""
        near = [solution for (at, served, _), solution in self._solved.items() if (at, served) == (length, plain)]
        return min(near, key=lambda solution: abs(math.log(solution.problem.arrivals_per_s / rate)), default=None)

    def _solve_wanted(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._wanted)
                length, plain, step = self._solving = self._wanted.pop()  # the latest rate first
                problem = self.problem(length, RATE_STEP ** step, plain)
                start = self._nearest(length, plain, problem.arrivals_per_s)
            rate = problem.arrivals_per_s
            try:
                solution = smdp.solve(problem, start)
            except Exception:  # the entry keeps serving work-conserving at this rate
                log.exception("solving the SMDP at %.1f/s failed", rate)
                with self._lock:
                    self._solving = None
                continue
            self.said(f"smdp at length {length}{' served plain' if plain else ''}: {solution.describe()}")
            with self._lock:
                self._solved[(length, plain, step)] = solution
                self._solving = None

    def window_end(self, waiting: Sequence[Query], rows: int, outlook: Outlook, now: float) -> float:
        """Now where the solved policy serves the queries waiting; else until the next arrival
        (the entry asks again when one comes), at most twice the time the control limit's
        arrivals take on average after the oldest came."""
        return self._wait_until(waiting, outlook.steady_per_s, now, plain=False)

    def hold_until(self, waiting: Sequence[Query], arrivals_per_s: float, now: float) -> float:
        """Served plain, as ``window_end`` for the pipeline: now where the policy solved for
        the instance as the server serves the queries ``waiting`` (oldest first), else until the
        next ``execute`` brings more, at most twice the time the control limit's arrivals take."""
        return self._wait_until(waiting, arrivals_per_s, now, plain=True) if self.holds else now

    def _wait_until(self, waiting: Sequence[Query], arrivals_per_s: float, now: float, plain: bool) -> float:
        """Asked again as queries come and once the time it gave has passed (the entry's window
        ends, the hold's thread wakes), so a wait that ran out is seen here, once per oldest
        query. The entry's stage 0 and a hold decide one at a time (a model serves one way at a
        time), so the count needs no lock."""
        if now < self._eager_until:
            return now
        solution = self.solution(waiting, arrivals_per_s, plain)
        if solution is None:
            return now
        if solution.action(len(waiting)) > 0:
            self._ended.append(False)
            if self._eager_s and len(self._ended) == WAITS and sum(self._ended) < STARVED:
                self._eager_s = 0.0
            return now
        limit = solution.control_limit or len(waiting)
        until = waiting[0].arrived + 2 * limit / arrivals_per_s
        if until <= now and (id(waiting[0]), waiting[0].arrived) != self._ran_out_for:
            # Starved: none came in its second half. Arrivals that kept coming, only fewer than
            # the rate said (Triton's bursts into an overloaded pipeline), are a load, not a loop.
            self._ran_out_for = (id(waiting[0]), waiting[0].arrived)
            self._ended.append(waiting[-1].arrived <= waiting[0].arrived + limit / arrivals_per_s)
            if sum(self._ended) >= (1 if self._eager_s else STARVED):  # once starving, one look tells
                self._ended.clear()
                if self._eager_s:  # again before its waits went well
                    self._eager_s = min(2 * self._eager_s, EAGER_MAX_S)
                else:
                    self._eager_s = EAGER_S
                    self.said(f"smdp: {STARVED} of its latest {WAITS} waits ran out with no query arriving in their "
                              f"second half (a closed loop of fewer clients than the control limit, or the load "
                              f"stopped): serves what waits for {EAGER_S:g} s, twice as long each time again, "
                              f"until the waits go well")
                self._eager_until = now + self._eager_s
        return until

    def forms_alike_whole(self) -> bool:
        """The solved policy may serve fewer than wait."""
        return False

    def form(self, waiting: Sequence[Query], room: int, now: float, outlook: Outlook = Outlook()
             ) -> list[tuple[list[Query], BatchShape]]:
        """The oldest ``a`` queries the solved policy serves (all that fit where it would wait:
        the window ran out), formed as Policy I would where it is on."""
        solution = self.solution(waiting, outlook.steady_per_s)
        serve = solution.action(len(waiting)) if solution is not None else 0
        if serve > 0:
            waiting = waiting[:serve]
        return super().form(waiting, room, now, outlook)
