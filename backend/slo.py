"""``policy: slo``: Orloj's distribution-aware batching of queries with deadlines (its sections 3-4).

A query's deadline is its request's Triton timeout (the client's ``timeout``, or the queue
policy's default) or, where its request sets none, ``deadline_ms`` after it arrived (the model's
SLO). How long a query takes is not known before it runs (an early-exit model leaves early on
some inputs): the policy learns it as an empirical distribution per tabulated length, kept over
a sliding window of stage runs (``ExecTimes``), as a ratio to what the latency tables predict.
A run of ``b`` rows takes as long as its slowest row (the batch is padded to its longest, paper
eq. 4), so its ratio samples the largest of ``b`` queries' ratios, whose CDF is ``F^b`` (eq. 6);
``learn`` inverts that, which gives each query's own distribution from the batches it ran in,
without the paper's profiler rerunning queries alone. The distributions are learned on a thread
of their own: stage 0's path only reads them.

When stage 0 asks for work (the paper's lazy batch creation), ``rule: orloj`` (the default):

1. **Feasible batch sizes** (Algorithm 1): a batch of ``k`` rows is feasible for a query where it
   finishes by the query's deadline with probability at least ``FEASIBLE`` (its finish: after the
   batches ahead free each stage, its stages' tabulated time at ``k`` times the ratio, whose CDF
   at ``k`` rows is ``F^k``). The query with the earliest deadline goes in the largest batch
   feasible for it that enough waiting queries can fill; beyond the paper, everyone waiting goes
   in one batch instead where that finishes more in time, as expected, than this batch and then
   the rest in the next (``_Batching.or_all``). Also beyond the paper, the batch keeps up with
   the load: where the entry's steady rate needs batches of at least ``k`` rows for the pipeline
   to drain it, the query with the earliest deadline a batch of ``k`` is in time for goes first,
   in a batch of at least ``k`` (``_Batching.keeps_up``).
2. **Batch-aware priority** (eq. 1-2): the batch is filled with the queries of highest priority
   among those it is feasible for, the priority being the expected cost a query saves by running
   in this batch rather than after an anticipated delay (exponential, rate one over a lone
   query's time; the paper finds the rate does not matter): ``sum_j p_j e^(-rate (slack - x_j))``
   over the batch's execution times ``x_j`` (probability ``p_j``) that meet its deadline. A query
   gains most just before its deadline and nothing once it cannot meet it.
3. **What cannot meet its deadline** even alone on an empty pipeline, at the shortest time its
   length was seen to take, is answered at once with Triton's timeout error (``hopeless``), not
   computed.

``rule: edf`` is the comparison the paper's related work draws: the earliest deadlines first, as
many as a batch holds, padded to the longest, only expired queries refused. Queries without a
deadline go last, oldest first. Nothing here imports Triton.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .decide import HostCosts
from .diversity import DiversityPolicy
from .errors import ConfigError
from .manifest import Manifest
from .policy import Outlook
from .query import BatchShape, Query, take_batch

log = logging.getLogger(__name__)
WINDOW = 2048  # stage runs per length the distribution is learned from (the sliding window)
MIN_RUNS = 16  # runs a length needs before its own distribution replaces the pooled one
MIN_HITS = 5  # runs of one batch size at or below a ratio for their estimate of F there to count
BINS = 24  # points of a learned distribution
REFRESH_S = 0.5  # how often the distributions are learned again from new runs
SAY_EVERY_S = 10.0  # how often the model's log says what was learned
FEASIBLE = 0.5  # a batch is feasible for a query that finishes in time with at least this probability


@dataclass(frozen=True)
class Ratios:
    """A query's execution time as a ratio to the tables' prediction: its CDF at ``grid``."""

    grid: np.ndarray  # ascending ratios
    cdf: np.ndarray  # P(ratio <= grid[i]), reaching 1 at the last

    def chance(self, ratio: np.ndarray, rows: int) -> np.ndarray:
        """P(a batch of ``rows`` queries runs within ``ratio`` times its prediction): ``F^rows``."""
        at = np.searchsorted(self.grid, ratio, side="right") - 1
        return np.where(at >= 0, self.cdf[np.maximum(at, 0)] ** rows, 0.0)

    @property
    def lowest(self) -> float:
        """The shortest ratio seen (the least a run of any size took): no query takes less."""
        return float(self.grid[0])

    def quantile(self, q: float, rows: int = 1) -> float:
        return float(self.grid[np.argmax(self.cdf ** rows >= q)])

    def masses(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """A batch of ``rows``: its ratios and their probabilities."""
        cdf = self.cdf ** rows
        return self.grid, np.diff(cdf, prepend=0.0)


CERTAIN = Ratios(np.array([1.0]), np.array([1.0]))  # before any run: the tables' time exactly


def learn(runs: Sequence[tuple[int, float]]) -> Ratios:
    """Each query's ratio distribution from ``runs`` of (rows, the run's ratio). Runs of ``b`` rows
    sample the largest of ``b`` ratios, of CDF ``F^b``: their empirical CDF to the power ``1/b``
    estimates ``F``. The estimates of each batch size are averaged, weighted by their runs, at
    each ratio only where at least ``MIN_HITS`` of the runs fell at or below it: large batches
    rarely run all-short (30 % long: 0.7^16 = 0.3 % of the batches of 16), and a handful of
    such runs, or none, raised to ``1/b`` says nothing (none counted as 0 made every query look long)."""
    rows = np.fromiter((r for r, _ in runs), dtype=np.int64, count=len(runs))
    ratios = np.fromiter((x for _, x in runs), dtype=np.float64, count=len(runs))
    grid = np.quantile(ratios, np.linspace(0, 1, BINS))
    grid[-1] = ratios.max()
    total, weight = np.zeros(len(grid)), np.zeros(len(grid))
    for b in np.unique(rows):
        own = np.sort(ratios[rows == b])
        hits = np.searchsorted(own, grid, side="right")
        counted = len(own) * ((hits >= MIN_HITS) | (hits == len(own)))
        total += counted * (hits / len(own)) ** (1.0 / b)
        weight += counted
    cdf = np.maximum.accumulate(np.divide(total, weight, out=np.zeros(len(grid)), where=weight > 0))
    cdf[-1] = 1.0
    return Ratios(grid, cdf)


class ExecTimes:
    """Per tabulated length, the latest ``WINDOW`` stage runs and what they teach (``learn``);
    lengths with fewer than ``MIN_RUNS`` runs read the distribution of every length pooled."""

    def __init__(self, said=log.info):
        self._runs: dict[int | None, deque[tuple[int, float]]] = {}
        self._learned: dict[int | None, Ratios] = {}
        self._pooled = CERTAIN
        self._fresh = 0  # runs added since the last learning
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._said_at = 0.0
        self._forgotten = 0  # times forgotten: what was learned from runs forgotten meanwhile is dropped
        self.said = said

    def add(self, length: int | None, rows: int, ratio: float) -> None:
        with self._lock:
            self._runs.setdefault(length, deque(maxlen=WINDOW)).append((rows, ratio))
            self._fresh += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._learn_forever, name="dvabatch-slo", daemon=True)
                self._thread.start()

    def forget(self) -> None:
        """Drop every run and what was learned from them (another model's, or the calibration's)."""
        with self._lock:
            self._runs.clear()
            self._fresh = 0
            self._forgotten += 1
            self._learned, self._pooled = {}, CERTAIN

    def ratios(self, length: int | None) -> Ratios:
        return self._learned.get(length, self._pooled)

    def learn_now(self) -> None:
        """Learn every length's distribution from its runs (the thread does, every ``REFRESH_S``)."""
        with self._lock:
            runs = {length: list(kept) for length, kept in self._runs.items()}
            self._fresh, forgotten = 0, self._forgotten
        pooled = [run for kept in runs.values() for run in kept]
        if not pooled:
            return
        learned = {length: learn(kept) for length, kept in runs.items() if len(kept) >= MIN_RUNS}
        with self._lock:
            if forgotten != self._forgotten:
                return
            self._pooled, self._learned = learn(pooled), learned  # each swapped whole: readers need no lock
        now = time.monotonic()
        if now - self._said_at >= SAY_EVERY_S:
            self._said_at = now
            self.said("slo: a query's time over its tables' prediction, by length: " + "; ".join(
                f"{length}: median {r.quantile(0.5):.2f}x, p99 {r.quantile(0.99):.2f}x ({len(runs[length])} runs)"
                for length, r in sorted(learned.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))))

    def _learn_forever(self) -> None:
        while True:
            time.sleep(REFRESH_S)
            if self._fresh:
                try:
                    self.learn_now()
                except Exception:  # the policy keeps the distributions it had
                    log.exception("learning the execution times failed")


@dataclass
class SloPolicy(DiversityPolicy):
    """Orloj's rule (or EDF) at the entry, with the execution times it learns (module docstring)."""

    name = "slo"
    learns = True
    rule: str = "orloj"  # orloj | edf
    _seen: ExecTimes = field(init=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        if self.rule not in ("orloj", "edf"):
            raise ConfigError(f"parameter 'policy.rule' is {self.rule!r}; known: orloj, edf")
        self._seen = ExecTimes(lambda text: self.said(text))

    def bind(self, manifest: Manifest) -> None:
        super().bind(manifest)
        self._seen.forget()

    def measured(self, costs: HostCosts, stages: int) -> None:
        """Also forget the runs seen so far: they were the calibration's, on made-up inputs."""
        super().measured(costs, stages)
        self._seen.forget()

    def observe(self, stages: range, rows: int, shape: BatchShape, first: Query | None, seconds: float) -> None:
        """``stages`` ran ``rows`` in ``seconds``: one more sample of the ratio."""
        length = self._length(shape, [first] if first is not None else ())
        predicted = sum(self._times(rows, length)[stages.start:stages.stop])
        if predicted > 0:
            self._seen.add(self.tabulated_length(length), rows, seconds / predicted)

    def joins(self, oldest: Query, query: Query) -> bool:
        """Any length joins, padded to the longest (the paper's eq. 4)."""
        return query.rigid == oldest.rigid if oldest.rigid is not None else super().joins(oldest, query)

    def window_end(self, waiting: Sequence[Query], rows: int, outlook: Outlook, now: float) -> float:
        """No window: a batch is created when stage 0 can take it (the paper's lazy creation)."""
        return now

    def may_refuse(self, queries: Sequence[Query]) -> bool:
        """Also every query where the model gives one without a timeout a deadline (``deadline_ms``)."""
        return self.deadline_ms > 0 or super().may_refuse(queries)

    def hopeless(self, query: Query, now: float) -> bool:
        """Whether ``query`` cannot meet its deadline even alone on an empty pipeline at the
        shortest time its length was seen to take (``rule: orloj``; EDF refuses only expired
        ones). Not at a likely time: large batches hide how short a query can be (a batch of 8
        of which 30 % run long runs all-short 6 % of the time), and refusing at the median
        refused early-exit queries that would have finished (57 % against 63 % finished)."""
        deadline = self._deadline(query)
        if math.isinf(deadline):
            return False
        if self.rule == "edf":
            return deadline <= now
        length = self._length(None, [query])
        alone = self._took(query.rows, length) * self._seen.ratios(self.tabulated_length(length)).lowest
        return deadline - now < alone

    def late_together(self, queries: Sequence[Query], now: float) -> list[Query]:
        """Inside ``execute`` (a model served plain) the queries Triton batched run as one and are
        answered when it ends: there is no later batch for one this batch makes late, as the
        pipeline has. So the earliest deadline the batch is not in time for (``FEASIBLE``, at
        its rows and longest length) is refused, again as it shrinks, until it is in time for
        all that are left (``rule: orloj``; EDF refuses only expired queries)."""
        if self.rule != "orloj":
            return []
        batch = sorted(queries, key=self._deadline)
        late: list[Query] = []
        while batch:
            rows = sum(q.rows for q in batch)
            length = self.tabulated_length(self._length(None, batch))
            # In time or not is monotone in the deadline: the late ones are the first few.
            ratio = (self._deadline(batch[0]) - now) / max(self._took(rows, length), 1e-9)
            if self._seen.ratios(length).chance(np.array([ratio]), rows)[0] >= FEASIBLE:
                return late
            late.append(batch.pop(0))
        return late

    def forms_alike_whole(self) -> bool:
        """Orloj's rule may take fewer, the ones in time."""
        return False

    def form(self, waiting: Sequence[Query], room: int, now: float, outlook: Outlook = Outlook()
             ) -> list[tuple[list[Query], BatchShape]]:
        deadlines = np.array([self._deadline(q) for q in waiting])
        order = np.lexsort((np.arange(len(waiting)), deadlines))  # earliest deadline, then oldest
        if self.rule == "orloj" and not math.isinf(deadlines[order[0]]):
            batch = _Batching(self, waiting, deadlines - now, self._free_at(outlook.ahead, now), now,
                              outlook.steady_per_s).form(order, room)
            if batch:
                return [(batch, BatchShape.of(batch, pads=True))]
        batch = take_batch([waiting[i] for i in order], room, self.joins)  # EDF, and where none is in time
        return [(batch, BatchShape.of(batch, pads=True))]

    def _done(self, rows: int, length: int | None, free: list[float], now: float) -> list[float]:
        """When each stage would be done with a batch of ``rows`` entering now, after the stages
        free at ``free``, by the tables."""
        done, out = now, []
        for stage, took in enumerate(self._times(rows, length)):
            done = max(done, free[stage]) + took
            out.append(done)
        return out

    def _finish(self, rows: int, length: int | None, free: list[float], now: float) -> tuple[float, float]:
        """A batch of ``rows`` entering now: (seconds it waits for stages the batches ahead still
        hold, seconds its stages compute), by the tables."""
        took = sum(self._times(rows, length))
        return self._done(rows, length, free, now)[-1] - now - took, took


class _Batching:
    """One admission's choice under ``rule: orloj``: the waiting queries' slack and lengths (the
    tabulated one each is predicted at: the next up, which never predicts short), and the
    stages' free times, asked about batch sizes."""

    def __init__(self, policy: SloPolicy, waiting: Sequence[Query], slack: np.ndarray, free: list[float], now: float,
                 arrivals_per_s: float):
        self.policy, self.waiting, self.slack, self.free, self.now = policy, waiting, slack, free, now
        self.arrivals_per_s = arrivals_per_s
        self.lengths = [policy.tabulated_length(policy._length(None, [q])) for q in waiting]
        self.rows = np.array([q.rows for q in waiting])

    def chances(self, k: int, length: int | None | bool = False, free: list[float] | None = None) -> np.ndarray:
        """Each query's chance that a batch of ``k`` rows entering now (after the stages free at
        ``free``: by default, once the batches ahead leave them) finishes by its deadline, at its
        own length (or at ``length``: the batch's longest)."""
        chance = np.zeros(len(self.waiting))
        for at in ({length} if length is not False else set(self.lengths)):
            wait, took = self.policy._finish(k, at, self.free if free is None else free, self.now)
            mine = np.array([length is not False or own == at for own in self.lengths])
            ratios = self.policy._seen.ratios(at)
            chance = np.where(mine, ratios.chance((self.slack - wait) / max(took, 1e-9), k), chance)
        return chance

    def form(self, order: np.ndarray, room: int) -> list[Query]:
        """The batch for the earliest deadline some batch is in time for (where the load needs
        batches of at least ``keeps_up`` rows, the earliest such a batch is in time for): the
        largest batch in time for it that the queries it is in time for can fill, filled by
        priority; empty where none is in time for anyone (the queries will be refused as
        ``hopeless``)."""
        alone = self.chances(1) >= FEASIBLE
        candidates = [int(i) for i in order if alone[i]]
        if not candidates:
            return []
        urgent, least, most = candidates[0], 1, min(room, int(self.rows.sum()))
        needs: dict[int | None, int] = {}  # by tabulated length
        in_time: dict[int, np.ndarray] = {}  # by rows
        for i in candidates:  # the first a batch that keeps up is in time for
            if self.lengths[i] not in needs:
                needs[self.lengths[i]] = self.keeps_up(self.lengths[i], most)
            need = needs[self.lengths[i]]
            if need not in in_time:
                in_time[need] = self.chances(need) >= FEASIBLE
            if in_time[need][i]:
                urgent, least = i, need
                break
        first = self.waiting[urgent]
        fits = np.array([self.policy.joins(first, q) for q in self.waiting])

        def feasible(k: int, length: int | None | bool = False) -> np.ndarray:
            return fits & (self.chances(k, length) >= FEASIBLE)

        def serves(k: int) -> bool:
            mask = feasible(k)
            return bool(mask[urgent]) and int(self.rows[mask].sum()) >= k

        low, high = first.rows, min(room, int(self.rows[fits].sum()))
        if least > low and least <= high and serves(least):
            low = least
        if low > high or not serves(low):
            return []
        while low < high:  # the largest k that serves: serves(k) holds up to it and not beyond
            middle = (low + high + 1) // 2
            low, high = (middle, high) if serves(middle) else (low, middle - 1)
        batch = self.by_priority(urgent, feasible(low), low)
        while True:  # padded to its longest, the batch must still be in time for each member
            rows, longest = self.shape(batch)
            served = feasible(rows, longest)
            if longest is None or all(served[i] for i in batch):
                return [self.waiting[i] for i in self.or_all(batch, order, room)]
            own = self.lengths[urgent] or 0
            batch = [i for i in batch if (self.lengths[i] or 0) <= own] if not served[urgent] \
                else [i for i in batch if served[i]]

    def or_all(self, batch: list[int], order: np.ndarray, room: int) -> list[int]:
        """``batch`` (its urgent query first), or every query that joins that one (the earliest
        deadlines, up to ``room`` rows) in one batch where that finishes more of them in time,
        as expected, than ``batch`` and then the rest in the batch after it (beyond the paper:
        where a batch pays a large fixed time, the urgent query's small batch and a second one
        for the rest finished fewer in all: 87 % against 97 % for the work-conserving pipeline
        on an early-exit profile at 0.9 load)."""
        urgent, at = batch[0], {id(query): i for i, query in enumerate(self.waiting)}
        ordered = [self.waiting[urgent], *(self.waiting[i] for i in order if i != urgent)]
        everyone = [at[id(query)] for query in take_batch(ordered, room, self.policy.joins)]
        if len(everyone) <= len(batch):
            return batch
        chosen = set(batch)
        rest = [i for i in everyone if i not in chosen]
        (k, length), (k_rest, length_rest) = self.shape(batch), self.shape(rest)
        k_all, length_all = self.shape(everyone)
        after = self.policy._done(k, length, self.free, self.now)
        apart = (self.chances(k, length)[batch].sum()
                 + self.chances(k_rest, length_rest, after)[rest].sum())
        return everyone if self.chances(k_all, length_all)[everyone].sum() > apart else batch

    def occupies(self, k: int, length: int | None) -> float:
        """Seconds a batch of ``k`` rows of ``length`` holds the pipeline's slowest stage, as
        expected: the tables' time times the expected ratio of such a run."""
        grid, mass = self.policy._seen.ratios(length).masses(k)
        return max(max(self.policy._times(k, length)) * float(grid @ mass), 1e-9)

    def keeps_up(self, length: int | None, most: int) -> int:
        """The fewest rows (up to ``most``) a batch of ``length`` needs for batches that size to
        drain the pipeline as fast as the load comes (the entry's steady rate): 1 where any
        does or the rate is not known yet."""
        rows_per_s = self.arrivals_per_s * float(self.rows.mean())
        if rows_per_s * self.occupies(1, length) <= 1 or most <= 1:
            return 1
        low, high = 2, most
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if rows_per_s * self.occupies(middle, length) <= middle else (middle + 1, high)
        return low

    def shape(self, members: list[int]) -> tuple[int, int | None]:
        """A batch of ``members``: its rows and the longest tabulated length among them."""
        return int(self.rows[members].sum()), max((self.lengths[i] for i in members), key=lambda x: x or 0)

    def by_priority(self, urgent: int, mask: np.ndarray, k: int) -> list[int]:
        """``urgent`` and the queries of ``mask`` of highest priority in a batch of ``k`` rows."""
        policy, length = self.policy, self.lengths[urgent]
        wait, took = policy._finish(k, length, self.free, self.now)
        grid, mass = policy._seen.ratios(length).masses(k)
        rate = 1.0 / max(policy._took(1, length), 1e-6)
        left = (self.slack - wait)[:, None] - took * grid[None, :]
        score = (mass * np.where(left >= 0, np.exp(-rate * np.maximum(left, 0.0)), 0.0)).sum(axis=1)
        chosen, rows = [urgent], self.waiting[urgent].rows
        for i in np.argsort(-score, kind="stable"):
            if mask[i] and i != urgent and rows + self.waiting[i].rows <= k:
                chosen.append(int(i))
                rows += self.waiting[i].rows
        return chosen
