"""Latency and throughput of a stretch of load, the way perf_analyzer reports them.

A request belongs to the phase it was *sent* in: its latency counts there even if it came back
later (the paper's per-query latency under a stepping load). Throughput is what *came back*
during the phase: successful inferences (rows) per second. Percentiles are nearest-rank over
successful requests; failures are counted by status, never hidden in the latencies.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

OK = "OK"
PERCENTILES = (50, 90, 95, 99)
# An open-loop request sent this much after its scheduled time is *late*. The event loop's timers
# have about a millisecond's resolution, so a millisecond or two is the loop, not the load.
LATE_S = 0.005


@dataclass
class Record:
    """One request as sent: seconds since the run began (``received`` is nan until answered)."""

    phase: int
    item: int
    scheduled: float
    sent: float
    rows: int
    length: int | None
    received: float = math.nan
    status: str = ""
    error: str = ""

    @property
    def latency_ms(self) -> float:
        return (self.received - self.sent) * 1000


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (nan for no values)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class Summary:
    requests: int  # sent in the phase
    ok: int
    rows: int  # rows of the successful requests sent in the phase
    seconds: float
    throughput: float  # successful rows answered per second during the phase
    mean_ms: float
    percentiles_ms: dict[int, float]
    failures: dict[str, int] = field(default_factory=dict)
    late_sends: int = 0  # sent more than LATE_S after their scheduled time (open loop)

    def latency(self, percentile_: int | None = None) -> float:
        """The latency that judges stability and thresholds: the mean, or a percentile."""
        return self.mean_ms if percentile_ is None else self.percentiles_ms[percentile_]


def summarize(records: Sequence[Record], start: float, end: float,
              percentiles: Sequence[int] = PERCENTILES, now: float | None = None) -> Summary:
    """The requests sent in [start, end) and the successes answered in that time. With ``now``,
    requests still unanswered count with their age so far: a lower bound on their latency, so a
    phase can be judged the moment it ends."""
    sent = [r for r in records if start <= r.sent < end]
    good = [r for r in sent if r.status == OK]
    latencies = [r.latency_ms for r in good]
    if now is not None:
        latencies += [(now - r.sent) * 1000 for r in sent if not r.status]
    answered = sum(r.rows for r in records if r.status == OK and start <= r.received < end)
    seconds = max(end - start, 1e-9)
    return Summary(
        requests=len(sent), ok=len(good), rows=sum(r.rows for r in good), seconds=seconds,
        throughput=answered / seconds, mean_ms=sum(latencies) / len(latencies) if latencies else math.nan,
        percentiles_ms={p: percentile(latencies, p) for p in sorted({*PERCENTILES, *percentiles})},
        failures=dict(Counter(r.status for r in sent if r.status not in (OK, ""))),
        late_sends=sum(1 for r in sent if r.sent - r.scheduled > LATE_S),
    )


def stable(windows: Sequence[Summary], tolerance_percent: float, percentile_: int | None) -> bool:
    """perf_analyzer's rule: the last three windows' throughput and latency each lie within
    ``tolerance_percent`` of their mean."""
    if len(windows) < 3:
        return False
    for values in ([w.throughput for w in windows[-3:]], [w.latency(percentile_) for w in windows[-3:]]):
        mean = sum(values) / 3
        if any(math.isnan(v) for v in values) or any(abs(v - mean) > mean * tolerance_percent / 100 for v in values):
            return False
    return True
