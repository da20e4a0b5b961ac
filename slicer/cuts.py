"""Where to cut: the N-1 legal cuts that make the slowest stage as fast as possible.

Pure arithmetic over a cost per node (milliseconds at the batch size being balanced) and a byte
count per legal cut, so it can be checked against brute force.

Two exact passes of a dynamic programme over the legal positions (``O(N * P^2)`` for P legal
cuts, vectorised over the earlier position):

1. the smallest possible slowest-stage time ``T*`` for exactly N stages;
2. among all cut sets whose every stage takes at most ``T* * (1 + slack)``, the one moving the
   fewest bytes between stages (ties: the faster slowest stage). ``slack=0`` keeps only the
   optimal cut sets; a little slack lets a cheaper boundary win when stage times differ by less
   than the profile can tell apart anyway.

``forced`` cuts must be among the chosen ones (the operator-diversity cuts): no stage may span one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slicer.errors import SliceError, plural


@dataclass(frozen=True)
class CutPlan:
    cuts: tuple[int, ...]  # node positions; nodes before a cut go to the earlier stage
    stage_costs: tuple[float, ...]  # predicted, in the cost unit
    optimum: float  # the smallest possible slowest stage
    bytes: int  # moved across all chosen cuts

    @property
    def balance(self) -> float:
        """Slowest stage over the mean stage: 1.0 is perfectly even."""
        mean = sum(self.stage_costs) / len(self.stage_costs)
        return max(self.stage_costs) / mean if mean > 0 else 1.0


def _earliest_starts(positions: np.ndarray, forced: Sequence[int]) -> np.ndarray:
    """For each position index j, the first index i a stage ending at positions[j] may start from
    (it may not span a forced cut)."""
    forced_set = set(forced)
    earliest = np.zeros(len(positions), dtype=int)
    last = 0
    for j, pos in enumerate(positions):
        earliest[j] = last
        if int(pos) in forced_set:
            last = j
    return earliest


def balanced_cuts(costs: Sequence[float], legal: Sequence[int], stages: int,
                  cut_bytes: dict[int, int] | None = None, slack: float = 0.0,
                  forced: Sequence[int] = ()) -> CutPlan:
    """The cut plan described in the module docstring."""
    n = len(costs)
    cut_bytes = cut_bytes or {}
    legal = sorted(set(legal))
    if stages < 1:
        raise SliceError("the number of stages must be at least 1")
    if not set(forced) <= set(legal):
        raise SliceError(f"forced cuts {sorted(set(forced) - set(legal))} are not legal cut points")
    if stages - 1 < len(set(forced)):
        raise SliceError(f"{len(set(forced))} forced cuts need at least {len(set(forced)) + 1} stages, not {stages}")
    if len(legal) < stages - 1:
        raise SliceError(f"only {plural(len(legal), 'legal cut point')} in {n} nodes; cannot make {stages} stages")
    positions = np.array([0, *legal, n])
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    at = prefix[positions]
    earliest = _earliest_starts(positions, forced)
    moved = np.array([cut_bytes.get(int(p), 0) for p in positions], dtype=float)
    count = len(positions)
    inf = np.inf

    # Pass 1: best[k][j] = smallest slowest stage covering nodes [0, positions[j]) with k+1 stages.
    best = np.full(count, inf)
    best[1:][earliest[1:] == 0] = at[1:][earliest[1:] == 0]
    for _ in range(stages - 1):
        nxt = np.full(count, inf)
        for j in range(1, count):
            i0 = max(earliest[j], 1)
            if i0 < j:
                nxt[j] = np.min(np.maximum(best[i0:j], at[j] - at[i0:j]))
        best = nxt
    optimum = float(best[-1])
    if not np.isfinite(optimum):
        raise SliceError(f"no {stages} stages fit the forced cuts {list(forced)}")

    # Pass 2: fewest bytes with every stage within the bound; parents kept to rebuild the cuts.
    bound = optimum * (1 + slack) + 1e-12 * max(1.0, abs(optimum))
    load = np.full(count, inf)  # bytes so far
    worst = np.full(count, inf)  # slowest stage so far, the tie-break
    ok = (earliest == 0) & (at <= bound)
    ok[0] = False
    load[ok], worst[ok] = 0.0, at[ok]
    parents = []
    for _ in range(stages - 1):
        nload, nworst, parent = np.full(count, inf), np.full(count, inf), np.full(count, -1)
        for j in range(1, count):
            i0 = max(earliest[j], 1)
            if i0 >= j:
                continue
            seg = at[j] - at[i0:j]
            cand_load = np.where(seg <= bound, load[i0:j] + moved[i0:j], inf)
            cand_worst = np.maximum(worst[i0:j], seg)
            order = np.lexsort((cand_worst, cand_load))
            pick = order[0]
            if np.isfinite(cand_load[pick]):
                nload[j], nworst[j], parent[j] = cand_load[pick], cand_worst[pick], i0 + pick
        load, worst = nload, nworst
        parents.append(parent)
    j = count - 1
    chosen = []
    for parent in reversed(parents):
        j = int(parent[j])
        chosen.append(int(positions[j]))
    cuts = tuple(sorted(chosen))
    bounds = [0, *cuts, n]
    stage_costs = tuple(float(prefix[b] - prefix[a]) for a, b in zip(bounds, bounds[1:]))
    return CutPlan(cuts=cuts, stage_costs=stage_costs, optimum=optimum,
                   bytes=int(sum(cut_bytes.get(c, 0) for c in cuts)))
