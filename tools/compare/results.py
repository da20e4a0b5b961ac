"""What a comparison found, before it is written out."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from tools.bench import Stepping, Window
from tools.compare.configs import Config


@dataclass(frozen=True)
class Level:
    name: str  # low, medium, high
    fraction: float  # of the best baseline's peak
    rate: float  # requests/s


@dataclass
class Results:
    model: str
    qos_ms: float
    percentile: int
    capacity: float  # requests/s of ZeroBatch in a closed loop
    dataset: str | None
    peaks: dict[Config, Stepping] = field(default_factory=dict)
    measured: list[Config] = field(default_factory=list)  # best ZeroBatch, best DelayBatch, ours
    best_baseline: Config | None = None
    levels: list[Level] = field(default_factory=list)
    windows: dict[tuple[Config, str], list[Window]] = field(default_factory=dict)  # one per round
    seconds: float = 0.0

    def spread(self, config: Config, level: str, statistic) -> tuple[float, float, float]:
        """(median, min, max) over the rounds of ``statistic(summary)``."""
        values = [v for w in self.windows.get((config, level), []) if not math.isnan(v := statistic(w.summary))]
        if not values:
            return math.nan, math.nan, math.nan
        return statistics.median(values), min(values), max(values)
