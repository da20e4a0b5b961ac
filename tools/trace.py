"""python -m tools.trace: where a served pipeline waits, from ``DVABATCH_TRACE`` files.

    DVABATCH_TRACE=/tmp/run python -m tools.serve ...    # or any tritonserver with that environment
    python -m tools.trace /tmp/run-MODEL-PID.tsv [--skip 1.0] [--show 30]

Each file holds a line per ``execute`` call and per batch item a stage ran (``backend/model.py``;
a peer model of ``tools/lib/plain_model.py`` writes its ``execute`` lines alone).
Over the span traced (less the first ``--skip`` seconds) it prints, for ``execute``, the calls,
the requests per call, how long a call held Triton's model instance and the gap until Triton
called again, also for each number of requests a call that made at least 5 % of the calls (two
models that form batches of different sizes compare at equal sizes); for each stage, its items,
rows per item and the share of the time it computed; and ``--show`` lines of the timeline from
the middle, in milliseconds, to see who waited for whom.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def read(path: Path) -> list[tuple[str, float, float, int]]:
    spans = []
    for line in path.read_text().splitlines():
        what, began, ended, count = line.split("\t")
        spans.append((what, float(began), float(ended), int(count)))
    return sorted(spans, key=lambda s: s[1])


def summary(spans: list[tuple[str, float, float, int]]) -> list[str]:
    first, last = spans[0][1], max(s[2] for s in spans)
    lines = [f"{last - first:.2f} s traced"]
    for what in sorted({s[0] for s in spans}):
        mine = [s for s in spans if s[0] == what]
        held = np.array([e - b for _, b, e, _ in mine]) * 1e3
        counts = np.array([n for *_, n in mine])
        line = f"{what}: {len(mine)} calls, {counts.mean():.1f} per call, busy {held.sum() / 1e3 / (last - first):.0%}"
        sizes = []
        if what == "execute":
            gaps = np.array([b - e for (_, _, e, _), (_, b, _, _) in zip(mine, mine[1:])]) * 1e3
            line += (f", held {held.mean():.3f} ms (median {np.median(held):.3f}); gap to the next call "
                     f"{gaps.mean():.3f} ms (median {np.median(gaps):.3f}, p90 {np.percentile(gaps, 90):.3f})")
            sizes = by_requests(held[:-1], gaps, counts[:-1])
        lines += [line, *sizes]
    return lines


def by_requests(held: np.ndarray, gaps: np.ndarray, counts: np.ndarray) -> list[str]:
    """Per number of requests a call (those that made at least 5 % of the calls): the median
    time a call held the instance and the median gap after it, in ms."""
    lines = []
    for n in np.unique(counts):
        calls = counts == n
        if calls.mean() >= 0.05:
            lines.append(f"  {n} a call: {calls.sum()} calls, held median {np.median(held[calls]):.3f} ms, "
                         f"gap after median {np.median(gaps[calls]):.3f}")
    return lines


def timeline(spans: list[tuple[str, float, float, int]], show: int) -> list[str]:
    events = sorted([(b, f"{what} begins ({n})") for what, b, _, n in spans]
                    + [(e, f"{what} ends") for what, _, e, _ in spans])
    middle = len(events) // 2
    start = events[middle][0]
    return [f"{(t - start) * 1e3:9.2f} ms  {event}" for t, event in events[middle:middle + show]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--skip", type=float, default=1.0, help="seconds at the start left out (warm-up)")
    parser.add_argument("--show", type=int, default=30, help="timeline lines to print (0: none)")
    args = parser.parse_args(argv)
    for path in args.files:
        spans = read(path)
        if not spans:
            print(f"{path}: empty")
            continue
        spans = [s for s in spans if s[1] >= spans[0][1] + args.skip] or spans
        print(f"== {path}")
        print("\n".join(summary(spans) + (timeline(spans, args.show) if args.show else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
