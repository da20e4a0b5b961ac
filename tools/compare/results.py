"""What a comparison found, before it is written out."""

from __future__ import annotations

from dataclasses import dataclass, field

from tools.lib.harness import Measured, Peak
from tools.compare.configs import Config
from tools.lib.intervals import Ratio, pooled, ratio
from tools.lib.perf_analyzer import Load, Window

# What each kind of load is judged on: latency under an open loop, throughput under a closed one.
OPEN_STATISTICS = ("mean", "p99", "goodput")
CLOSED_STATISTICS = ("throughput", "mean")


@dataclass(frozen=True)
class Level:
    name: str  # low, medium, high, c=16, a file's name
    load: Load
    fraction: float | None = None  # of the best baseline's peak (Poisson levels)

    @property
    def statistics(self) -> tuple[str, ...]:
        return CLOSED_STATISTICS if self.load.closed else OPEN_STATISTICS


@dataclass
class Results:
    model: str
    qos_ms: float
    percentile: int
    capacity: float  # answers/s of the first plain candidate in a closed loop
    workload: str
    peaks: dict[Config, Peak] = field(default_factory=dict)
    measured: list[Config] = field(default_factory=list)  # best plain, best ensemble, undelayed, A/A copy, ours
    best_baseline: Config | None = None
    levels: list[Level] = field(default_factory=list)
    windows: dict[tuple[Config, str], list[Measured]] = field(default_factory=dict)  # one per round
    seconds: float = 0.0
    command: str = ""

    def of(self, config: Config, level: str) -> list[Window]:
        return [m.window for m in self.windows.get((config, level), [])]

    def value(self, config: Config, level: str, statistic: str) -> float:
        return pooled(self.of(config, level), statistic, self.qos_ms)

    def ratio(self, config: Config, level: str, statistic: str) -> Ratio:
        """``config`` against the best baseline, with its interval."""
        return ratio(self.of(config, level), self.of(self.best_baseline, level), statistic, self.qos_ms)

    @property
    def aa(self) -> Config | None:
        return next((c for c in self.measured if c.copy), None)
