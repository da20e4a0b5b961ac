"""Node costs corrected by stage times measured as served.

The node profile times each node of the graph as cut, one kernel at a time, with ONNX Runtime's
further optimisation off so that the timed nodes are the graph's nodes. A stage is served
differently: fused and with layout changes (convolutions in blocked layouts cost about half what
the profile says, MatMuls about 0.7x), and with a cost per node that no kernel timing sees. So
the slowest stage predicted from the profile is not the slowest stage served.

Each measured stage says how much its nodes really cost together. Over all stages measured so
far, one factor per op type and one cost per node are fitted by least squares (served ms ~
sum over the stage's nodes of factor[op type] x profiled ms, plus nodes x per-node ms), pulled
weakly towards the overall served/profiled ratio (and no per-node cost) where the measurements
cannot tell them apart, each pull in proportion to the time its column adds to a stage. Pure
numpy: no ONNX, no ONNX Runtime.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PRIOR = 0.1  # weight of the prior: a unit of factor off it costs as much as 10 % of its column's time
NODE_MS = 1e-3  # the per-node cost is fitted in this unit (1 us)
FACTOR_RANGE = 20.0  # fitted factors stay within this ratio of the overall one


@dataclass(frozen=True)
class Span:
    """A stage measured as served: nodes ``start:end`` took ``ms``."""

    start: int
    end: int
    ms: float


def calibrated_costs(costs: Sequence[float], kinds: Sequence[str], spans: Sequence[Span]) -> np.ndarray:
    """``costs`` (profiled ms per node, ``kinds`` their op types) corrected so that the measured
    ``spans`` add up as closely as the model allows."""
    costs = np.asarray(costs, dtype=float)
    types = sorted(set(kinds))
    column = {kind: i for i, kind in enumerate(types)}
    per_node = len(types)  # the last column: nodes in the stage, in NODE_MS
    rows = np.zeros((len(spans), len(types) + 1))
    for r, span in enumerate(spans):
        for i in range(span.start, span.end):
            rows[r, column[kinds[i]]] += costs[i]
        rows[r, per_node] = (span.end - span.start) * NODE_MS
    measured = np.array([span.ms for span in spans])
    overall = measured.sum() / rows[:, :per_node].sum() if rows[:, :per_node].sum() > 0 else 1.0
    weight = PRIOR * np.sqrt((rows ** 2).mean(axis=0))  # per column: a share of what it adds to a stage
    prior = np.append(np.full(len(types), overall), 0.0)
    lhs = np.vstack([rows, np.diag(weight)])
    rhs = np.concatenate([measured, weight * prior])
    fitted, *_ = np.linalg.lstsq(lhs, rhs, rcond=None)
    factors = np.clip(fitted[:per_node], overall / FACTOR_RANGE, overall * FACTOR_RANGE)
    node_ms = max(float(fitted[per_node]), 0.0) * NODE_MS
    return costs * factors[[column[kind] for kind in kinds]] + node_ms
