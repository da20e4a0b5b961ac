"""SMDP dynamic batching (Xu, Sun, Zhou, Niu: ``smdp-dynamic-batching.txt``): when to dispatch a
batch and how big, solved offline from batch-size-dependent service times and Poisson arrivals.

A single server (here: the pipeline, whose period is its slowest stage's time) decides at each
*decision epoch* (it finished a batch, or a request arrived while it idled) from the number of
requests in the system ``s`` whether to serve a batch of ``a <= min(s, Bmax)`` now or wait
(``a = 0``). The objective is the weighted sum of the mean response time (by Little's law, the
mean number in the system over the arrival rate) and the mean power (energy per batch over
time). The paper's procedure, implemented as it states it:

- **finite state approximation** (its IV-A): states ``0..s_max`` and an *overflow* state for
  every larger one, counted as ``s_max`` requests, with an *abstract cost* ``c_o y(s, a)`` for
  the tail's extra holding; ``s_max`` doubles until the overflow state's share of the average
  cost, ``Delta^pi`` (its eq. 15), is under ``TOLERANCE`` of the cost;
- **discretization** (IV-B): costs over sojourn times, transitions scaled by ``eta``;
- **relative value iteration** (IV-C), stopped when the span of an iteration's change is under
  ``EPSILON`` of the average cost.

Every policy (the solved one, or the paper's benchmarks: work-conserving, static batch sizes)
is evaluated exactly by the stationary distribution of its embedded chain (eq. 14), which is
how the paper compares them (its Fig. 5) and how the tests do.

Nothing here imports Triton, so the solver is tested directly (against the paper's own numbers).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

TOLERANCE = 1e-4  # the overflow state's share of the average cost (eq. 15) an approximation may keep
EPSILON = 1e-4  # RVI stops when an iteration's change spans under this share of the average cost
# The abstract cost of the overflow state: its holding as if the tail held this many times
# ``s_max`` requests more. 4 gives the paper's best, c_o = 100, in its setting (rho 0.9, s_max 70,
# lambda 2.66 per ms: 4 * 70 / 2.66 = 105); smaller ones underestimate the tail and need a far
# larger s_max (its Table I: 161 states for c_o = 10).
TAIL = 4.0
UNSTABLE = 1e-3  # a policy serving this share less than arrives is unstable: its cost is infinite
MAX_STATES = 1024  # the largest s_max tried: beyond it the load is too near capacity to truncate
# Relative value iteration's budget, then policy iteration finishes: on BERT-base's TensorRT tables
# (Bmax 64) 300 find the same policies as 3,000, in 0.04-0.26 s instead of 0.06-2.3.
RVI_ITERATIONS = 300
MAX_IMPROVEMENTS = 50  # policy iteration's


@dataclass(frozen=True)
class Problem:
    """One dispatch problem: ``service_s[b - 1]`` is a batch of ``b``'s service time ``tau[b]``,
    ``energy[b - 1]`` its energy ``zeta[b]`` (joules; or any proxy, such as the engines' busy
    seconds, where the device reports none), requests arrive at ``arrivals_per_s``, and the
    objective weighs the mean response time by ``latency_weight`` and the mean power by
    ``power_weight``. Any consistent units will do (the tests use the paper's ms and mJ)."""

    service_s: tuple[float, ...]
    energy: tuple[float, ...]
    arrivals_per_s: float
    latency_weight: float = 1.0
    power_weight: float = 0.0

    @property
    def max_batch(self) -> int:
        return len(self.service_s)

    @functools.cached_property
    def capacity(self) -> float:
        """Requests per unit time at the best batch size: the most any policy can serve (read on
        stage 0's path, so computed once)."""
        return max(b / t for b, t in enumerate(self.service_s, start=1))

    @property
    def load(self) -> float:
        """rho: the arrival rate over the capacity; under 1 for a stable system."""
        return self.arrivals_per_s / self.capacity


@dataclass(frozen=True)
class Solution:
    """A stationary deterministic policy: ``actions[s]`` is the batch to serve with ``s``
    requests in the system (0: wait), the last entry the overflow state's; with its average cost
    per unit time (eq. 14), the overflow state's part of it (eq. 15), and what solving took."""

    problem: Problem
    actions: tuple[int, ...]
    average_cost: float
    overflow_cost: float
    s_max: int
    iterations: int = 0
    seconds: float = 0.0
    values: np.ndarray | None = field(default=None, repr=False, compare=False)  # RVI's relative values

    def action(self, requests: int) -> int:
        """The batch to serve now with ``requests`` waiting (0: wait for more)."""
        if requests <= 0:
            return 0
        return min(self.actions[min(requests, len(self.actions) - 1)], requests)

    @property
    def control_limit(self) -> int | None:
        """The fewest requests at which it serves; None where it never does."""
        return next((s for s, a in enumerate(self.actions) if a > 0), None)

    @property
    def has_control_limit(self) -> bool:
        """Whether it waits below one number of requests and serves at and above it (the
        structure the paper observes in every solution, its Fig. 4)."""
        limit = self.control_limit
        return limit is not None and all((a > 0) == (s >= limit) for s, a in enumerate(self.actions))

    def describe(self) -> str:
        return (f"serves from {self.control_limit} requests at {self.problem.arrivals_per_s:.1f}/s "
                f"(load {self.problem.load:.2f}; s_max {self.s_max}, {self.iterations} iterations, "
                f"{self.seconds * 1000:.0f} ms)")


class _Chain:
    """The truncated model of one ``Problem`` at one ``s_max``: states ``0..s_max`` and the
    overflow state (index ``s_max + 1``), actions ``0..Bmax``, each (state, action)'s cost until
    the next epoch ``c'``, sojourn ``y`` and how to take the expectation of a value over the
    next state."""

    def __init__(self, problem: Problem, s_max: int):
        self.problem, self.s_max = problem, s_max
        lam, w1, w2 = problem.arrivals_per_s, problem.latency_weight, problem.power_weight
        bmax = problem.max_batch
        n = s_max + 2
        self.n, self.overflow = n, s_max + 1
        tau = np.asarray(problem.service_s, dtype=float)
        zeta = np.asarray(problem.energy, dtype=float)
        # p[a - 1, k]: k arrivals during a batch of a (eq. 4), as many as can land below overflow.
        means = lam * tau
        self.k = min(s_max + 1, int(math.ceil(means.max() + 12 * math.sqrt(means.max()) + 12)))
        ks = np.arange(self.k)
        log_p = ks[None, :] * np.log(np.maximum(means, 1e-300))[:, None] - means[:, None] \
            - np.array([math.lgamma(k + 1) for k in ks])[None, :]
        self.p = np.exp(log_p)
        states = np.arange(n)
        counted = np.minimum(states, s_max)  # the overflow state holds s_max requests
        actions = np.arange(bmax + 1)
        # Feasible: a <= s (the overflow state holds s_max >= Bmax). Waiting only below Bmax:
        # with a full batch there, waiting cannot make it larger and only adds holding. The
        # overflow state serves the batch of most throughput, as a policy that stabilizes the
        # system must there: otherwise the truncation (which counts every state past s_max as
        # s_max) lets an unstable policy's requests vanish into it, its cost bounded, and a heavy
        # power weight found waiting there, or serving one request at a time, cheapest (the
        # truncation's artefact the paper notes for small c_o, its V-C).
        self.feasible = actions[None, :] <= counted[:, None]
        self.feasible[:, 0] = counted < bmax
        self.feasible[self.overflow, :] = False
        self.feasible[self.overflow, _fastest(tau)] = True
        # y(s, a) (eq. 7) and c(s, a) (eq. 9), with the overflow state's abstract cost (eq. 13).
        y = np.empty((n, bmax + 1))
        y[:, 0] = 1 / lam
        y[:, 1:] = tau[None, :]
        c = np.empty((n, bmax + 1))
        c[:, 0] = w1 * counted / lam ** 2
        c[:, 1:] = w2 * zeta[None, :] + w1 * (counted[:, None] / lam * tau[None, :] + tau[None, :] ** 2 / 2)
        c[self.overflow] += TAIL * w1 * s_max / lam * y[self.overflow]
        # Serving a from s leaves base = s - a requests, then k arrive (eq. 5, 12).
        base = counted[:, None] - actions[None, 1:]
        self.base = np.where(self.feasible[:, 1:], base, 0)
        # Arrivals past s_max vanish from the truncated chain: each is charged what it would
        # cost at least (the best energy per request, and the wait for s_max requests ahead at
        # full throughput), or a heavy power weight finds a queue held at s_max, dropping the
        # arrivals, cheaper than serving them (rho 0.9, weight 500: below static batching).
        over = np.maximum(ks[None, :] - (s_max - np.arange(s_max + 1))[:, None], 0)  # [base, k]
        lost = self.p @ over.T  # [a - 1, base]: arrivals expected past s_max
        per_lost = w2 * float(np.min(zeta / np.arange(1, bmax + 1))) + w1 * s_max / problem.capacity
        c[:, 1:] += per_lost * lost[np.arange(bmax)[None, :], self.base]
        self.y, self.c = y, c
        self.waited = np.minimum(states + 1, self.overflow)  # a = 0: one more arrives
        self.waited[self.overflow] = self.overflow
        # The probability of staying in the same state, for eta (eq. 18).
        stay = np.zeros((n, bmax + 1))
        stay[self.overflow, 0] = 1.0
        for a in range(1, bmax + 1):
            stay[: s_max + 1, a] = self.p[a - 1, a] if a < self.k else 0.0
            stay[self.overflow, a] = 1 - self.p[a - 1, : min(a + 1, self.k)].sum()
        leaves = self.feasible & (stay < 1)
        self.eta = 0.99 * float(np.min((y / np.maximum(1 - stay, 1e-300))[leaves]))

    def expected(self, value: np.ndarray) -> np.ndarray:
        """E[value(next state) | s, a] for every state and action (infeasible ones arbitrary)."""
        s_max, k = self.s_max, self.k
        # After serving, from each base 0..s_max: k arrivals, beyond s_max all in the overflow state.
        padded = np.concatenate([value[: s_max + 1], np.full(k, value[self.overflow])])
        windows = np.lib.stride_tricks.sliding_window_view(padded, k)[: s_max + 1]
        from_base = self.p @ windows.T + (1 - self.p.sum(axis=1))[:, None] * value[self.overflow]
        out = np.empty_like(self.c)
        out[:, 0] = value[self.waited]
        out[:, 1:] = from_base[np.arange(self.problem.max_batch)[None, :], self.base]
        return out

    def solve(self, start: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
        """Relative value iteration on the discretized MDP (eq. 17, 21), for at most
        ``RVI_ITERATIONS``, then policy iteration on the SMDP (eq. 16) from its greedy policy
        until no state's action improves: the policy, the relative values (to start a nearby
        problem from) and the iterations both took. Policy iteration confirms RVI's policy in one
        step where RVI converged; near capacity, where the chain mixes slowly and RVI needs tens
        of thousands of iterations (rho 0.99: 63,000, a minute), it finishes in a few."""
        rate = self.c / self.y
        step = self.eta / self.y
        value = np.zeros(self.n) if start is None or len(start) != self.n else start.copy()
        iterations = 0
        for iterations in range(1, RVI_ITERATIONS + 1):
            q = rate + value[:, None] + step * (self.expected(value) - value[:, None])
            q[~self.feasible] = np.inf
            updated = q.min(axis=1)
            change = updated - value
            value = updated - updated[0]
            if np.ptp(change) < EPSILON * max(abs(change[0]), 1e-12):
                break
        actions = np.where(self.feasible, q, np.inf).argmin(axis=1)
        for _ in range(MAX_IMPROVEMENTS):
            gain, relative = self._values(actions)
            iterations += 1
            q = self.c - gain * self.y + self.expected(relative)
            q[~self.feasible] = np.inf
            kept = q[np.arange(self.n), actions]
            better = q.min(axis=1) < kept - 1e-9 * np.maximum(np.abs(kept), 1.0)
            if not better.any():
                return actions, value, iterations
            actions = np.where(better, q.argmin(axis=1), actions)
        return actions, value, iterations

    def _values(self, actions: np.ndarray) -> tuple[float, np.ndarray]:
        """Policy evaluation: the average cost ``g`` and relative values ``h`` (``h(0) = 0``)
        solving ``h = c - g y + P h`` under ``actions``."""
        rows = np.arange(self.n)
        system = np.zeros((self.n + 1, self.n + 1))
        system[: self.n, : self.n] = np.eye(self.n) - self.transitions(actions)
        system[: self.n, self.n] = self.y[rows, actions]
        system[self.n, 0] = 1.0
        rhs = np.concatenate([self.c[rows, actions], [0.0]])
        solution = np.linalg.lstsq(system, rhs, rcond=None)[0]
        return float(solution[self.n]), solution[: self.n]

    def transitions(self, actions: np.ndarray) -> np.ndarray:
        """The embedded chain's transition matrix under ``actions``."""
        matrix = np.zeros((self.n, self.n))
        for s, a in enumerate(actions):
            if a == 0:
                matrix[s, self.waited[s]] = 1.0
                continue
            base = self.base[s, a - 1]
            reach = min(self.k, self.s_max + 1 - base)
            matrix[s, base: base + reach] = self.p[a - 1, :reach]
            matrix[s, self.overflow] += 1 - self.p[a - 1, :reach].sum()
        return matrix

    def evaluate(self, actions: np.ndarray) -> tuple[float, float]:
        """(average cost per unit time, the overflow state's part of it): eq. 14 and 15, from the
        stationary distribution of the embedded chain."""
        matrix = self.transitions(actions)
        system = matrix.T - np.eye(self.n)
        system[-1, :] = 1.0
        rhs = np.zeros(self.n)
        rhs[-1] = 1.0
        try:
            mu = np.linalg.solve(system, rhs)
        except np.linalg.LinAlgError:
            mu = np.linalg.lstsq(system, rhs, rcond=None)[0]
        mu = np.clip(mu, 0.0, None)
        mu /= mu.sum()
        rows = np.arange(self.n)
        cost, sojourn = self.c[rows, actions], self.y[rows, actions]
        per_time = float(mu @ sojourn)
        served = float(mu @ np.minimum(actions, np.minimum(rows, self.s_max))) / per_time
        if served < (1 - UNSTABLE) * self.problem.arrivals_per_s:  # it cannot keep up: its queue grows without end
            return math.inf, math.inf
        return float(mu @ cost) / per_time, float(mu[self.overflow] * cost[self.overflow]) / per_time


def _fastest(service_s: np.ndarray) -> int:
    """The batch size of most requests per unit time (the largest of equals)."""
    rates = np.arange(1, len(service_s) + 1) / service_s
    return int(np.flatnonzero(rates >= rates.max() * (1 - 1e-9))[-1]) + 1


def _first_states(problem: Problem) -> int:
    """Where doubling s_max starts: two full batches."""
    return 2 * problem.max_batch


def solve(problem: Problem, start: Solution | None = None) -> Solution:
    """The optimal dispatch policy of ``problem``, by the paper's procedure; the values of
    ``start`` (a solution of a nearby problem: the same tables at another rate) seed the
    iteration. At or past capacity no policy is stable: the work-conserving one (serve as many
    as there are, up to Bmax) is returned, with an infinite cost."""
    began = time.perf_counter()
    if problem.load >= 1:
        actions = tuple(min(s, problem.max_batch) for s in range(problem.max_batch + 2))
        return Solution(problem, actions, math.inf, math.inf, problem.max_batch)
    s_max = _first_states(problem)
    values, iterations = None, 0
    while True:
        chain = _Chain(problem, s_max)
        if values is None and start is not None and start.values is not None:
            values = _resized(start.values, chain.n)
        actions, values, used = chain.solve(values)
        iterations += used
        cost, overflow = chain.evaluate(actions)
        if overflow <= TOLERANCE * cost or 2 * s_max > MAX_STATES:
            return Solution(problem, tuple(int(a) for a in actions), cost, overflow, s_max, iterations,
                            time.perf_counter() - began, values)
        s_max *= 2
        values = _resized(values, s_max + 2)


def _resized(values: np.ndarray, n: int) -> np.ndarray:
    """Relative values for ``n`` states from another truncation's: the new states (and the
    overflow one) start where the old overflow state was."""
    head = values[: min(len(values) - 1, n - 1)]
    return np.concatenate([head, np.full(n - len(head), values[-1])])


def evaluate(problem: Problem, rule: Callable[[int], int]) -> float:
    """The average cost per unit time (eq. 14) of the policy serving ``rule(s)`` with ``s``
    requests in the system (a benchmark's), on the truncation the solver would start from."""
    chain = _Chain(problem, 4 * _first_states(problem))
    counted = np.minimum(np.arange(chain.n), chain.s_max)
    actions = np.array([min(max(rule(int(s)), 0), int(s), problem.max_batch) for s in counted])
    return chain.evaluate(actions)[0]


def work_conserving(max_batch: int) -> Callable[[int], int]:
    """Serve every request there is, up to ``max_batch``; wait only when none is there."""
    return lambda s: min(s, max_batch)


def static(batch: int) -> Callable[[int], int]:
    """Always serve exactly ``batch``; wait until there are that many."""
    return lambda s: batch if s >= batch else 0


def unsolved(problem: Problem, rule: Callable[[int], int]) -> Solution:
    """A benchmark's ``rule`` as the stationary policy it is, to serve by (``policy.static``): not
    evaluated, its costs NaN."""
    actions = tuple(min(max(rule(s), 0), s, problem.max_batch) for s in range(problem.max_batch + 2))
    return Solution(problem, actions, math.nan, math.nan, problem.max_batch)
