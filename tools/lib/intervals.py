"""Ratios of two configurations with 95 % confidence intervals, from interleaved windows.

A comparison measures every configuration once per round, the rounds interleaved, so round i of
two configurations ran at nearly the same time (and, with perf_analyzer's fixed Poisson seed,
with the same arrivals). A configuration's statistic pools the requests of all its windows. The
interval of a ratio comes from a two-level bootstrap: rounds drawn with replacement, the same
rounds for both configurations (they are paired), then the requests of each drawn window drawn
with replacement; the 2.5th and 97.5th percentiles of the ratio over the draws bound it. With one
round only the noise within a window is seen, which is why every comparison also measures a
configuration against a copy of itself (the A/A row): its interval is the noise floor.

A ratio whose interval lies wholly on one side of 1 is ``better`` or ``worse``; one that holds 1
is ``within noise``.

Where only a few rounds are run on a host whose windows move from round to round by more than
the requests within a window do, drawing rounds again from so few understates that movement:
``across_rounds`` takes the ratio of each round's pair of windows and gives their geometric mean
with Student's t interval over the rounds instead (the textbook paired comparison), which widens
as rounds get fewer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tools.lib.perf_analyzer import Window

DRAWS = 2000
LOWER_IS_BETTER = {"mean": True, "p99": True, "throughput": False, "goodput": False}


def statistic(name: str, qos_ms: float) -> Callable[[np.ndarray, float], float]:
    """``f(latencies_ms, seconds)`` for ``mean``, ``p99``, ``throughput`` (answers per second) or
    ``goodput`` (answers within ``qos_ms`` per second); ``seconds`` as ``seconds_of`` gives them."""
    return {
        "mean": lambda lat, s: float(lat.mean()) if len(lat) else math.nan,
        "p99": lambda lat, s: float(np.percentile(lat, 99, method="inverted_cdf")) if len(lat) else math.nan,
        "throughput": lambda lat, s: len(lat) / s if s > 0 else math.nan,
        "goodput": lambda lat, s: int((lat <= qos_ms).sum()) / s if s > 0 else math.nan,
    }[name]


def seconds_of(window: Window, name: str) -> float:
    """Throughput counts until the last answer; goodput per second of the load (``Window.goodput``)."""
    return window.schedule_s if name == "goodput" else window.seconds


def pooled(windows: Sequence[Window], name: str, qos_ms: float = 200.0) -> float:
    """``name`` over every request of ``windows`` together."""
    if not windows:
        return math.nan
    f = statistic(name, qos_ms)
    return f(np.concatenate([w.latency_ms for w in windows]), sum(seconds_of(w, name) for w in windows))


@dataclass(frozen=True)
class Ratio:
    """``value`` = statistic of one configuration over another's, with its 95 % interval."""

    value: float
    low: float
    high: float
    lower_is_better: bool

    @property
    def verdict(self) -> str:
        if math.isnan(self.low) or self.low <= 1 <= self.high:
            return "within noise"
        return "better" if (self.high < 1) == self.lower_is_better else "worse"

    def __str__(self) -> str:
        if math.isnan(self.value):
            return "-"
        if math.isnan(self.low):
            return f"{self.value:.2f}x"
        return f"{self.value:.2f}x [{self.low:.2f}, {self.high:.2f}]"


def ratio(a: Sequence[Window], b: Sequence[Window], name: str, qos_ms: float = 200.0, draws: int = DRAWS,
          seed: int = 0) -> Ratio:
    """``name`` of ``a`` over ``name`` of ``b``, windows paired by round (``a[i]`` beside ``b[i]``)."""
    rounds = min(len(a), len(b))
    if rounds == 0:
        return Ratio(math.nan, math.nan, math.nan, LOWER_IS_BETTER[name])
    a, b = list(a[:rounds]), list(b[:rounds])
    f = statistic(name, qos_ms)
    value = pooled(a, name, qos_ms) / pooled(b, name, qos_ms)
    rng = np.random.default_rng(seed)
    found = np.empty(draws)
    for d in range(draws):
        chosen = rng.integers(0, rounds, rounds)
        pair = []
        for side in (a, b):
            lat = np.concatenate([side[i].latency_ms[rng.integers(0, side[i].requests, side[i].requests)]
                                  for i in chosen])
            pair.append(f(lat, sum(seconds_of(side[i], name) for i in chosen)))
        found[d] = pair[0] / pair[1] if pair[1] else math.nan
    found = found[~np.isnan(found)]
    low, high = (np.percentile(found, (2.5, 97.5)) if len(found) else (math.nan, math.nan))
    return Ratio(float(value), float(low), float(high), LOWER_IS_BETTER[name])


def across_rounds(ratios: Sequence[float], lower_is_better: bool, confidence: float = 0.95) -> Ratio:
    """The geometric mean of per-round ratios (each round's two windows side by side) with its t
    interval over the rounds at ``confidence``; no interval (NaN) from one round, nothing from none."""
    logs = np.log([r for r in ratios if r > 0 and math.isfinite(r)])
    if not len(logs):
        return Ratio(math.nan, math.nan, math.nan, lower_is_better)
    value = float(np.exp(logs.mean()))
    if len(logs) < 2:
        return Ratio(value, math.nan, math.nan, lower_is_better)
    half = t_quantile(1 - (1 - confidence) / 2, len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
    return Ratio(value, float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half)), lower_is_better)


def t_quantile(p: float, df: int) -> float:
    """Student's t with ``df`` degrees of freedom below which a share ``p`` (at least a half) of it
    lies: its distribution function inverted by bisection (a sequential check asks for levels no
    printed table has)."""
    low, high = 0.0, 1e7
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if 1 - _beta(df / 2, 0.5, df / (df + middle * middle)) / 2 < p else (low, middle)
    return (low + high) / 2


def _beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Student's t's distribution function
    is made of it), by its continued fraction (Lentz's method), on the side where that converges."""
    if x <= 0 or x >= 1:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _beta(b, a, 1 - x)
    tiny = 1e-300
    c, d = 1.0, 1 / (1 - (a + b) * x / (a + 1) or tiny)
    fraction = d
    for m in range(1, 500):
        for term in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 / (1 + term * d or tiny)
            c = 1 + term / c or tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    return front * fraction / a


def against_margin(r: Ratio, margin: float) -> str:
    """Whether ``r`` is shown within ``margin`` of 1 on its worse side: ``yes`` where its whole
    interval is (a lower-is-better ratio at most ``1 + margin``, a higher-is-better one at least
    ``1 - margin``), ``NO`` where its whole interval lies beyond, else ``unresolved``; a ratio
    without an interval (one round) by its value alone, and none at all (no round) ``NO``."""
    if math.isnan(r.value):
        return "NO"
    low, high = (r.value, r.value) if math.isnan(r.low) else (r.low, r.high)
    if r.lower_is_better:
        return "yes" if high <= 1 + margin else "NO" if low > 1 + margin else "unresolved"
    return "yes" if low >= 1 - margin else "NO" if high < 1 - margin else "unresolved"
