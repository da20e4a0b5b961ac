"""What windows.csv shows: each way's served line against loading's, and how far off the way not
served is predicted from the way served, as a factor (the rule before e5eb473) and as an excess
added (the rule after), against the other way's own served line at the same rows a run.

    python docs/results/served-cost-lines/analyse.py
"""

import csv
import statistics
from pathlib import Path


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of us a request against 1 / rows: (us a batch, us a request)."""
    xs, ys = [1 / rows for rows, _ in points], [us for _, us in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def main() -> None:
    rows = list(csv.DictReader(Path(__file__).with_name("windows.csv").read_text().splitlines()))
    for profile in dict.fromkeys(r["profile"] for r in rows):
        windows = [r for r in rows if r["profile"] == profile and int(r["answered"]) >= 200]
        loading, served = {}, {}
        for way in ("plain", "pipeline"):
            mine = [r for r in windows if r["held"] == way]
            loading[way] = (float(mine[0][f"loading_{way}_batch_us"]), float(mine[0][f"loading_{way}_request_us"]))
            served[way] = fit([(float(r["rows_a_run"]), float(r["stub_us_a_request"])) for r in mine])
            print(f"{profile} {way}: loading {loading[way][0]:.0f} us a batch + {loading[way][1]:.0f} a request, "
                  f"served {served[way][0]:.0f} + {served[way][1]:.0f} ({len(mine)} windows)")
        for seen, other in (("plain", "pipeline"), ("pipeline", "plain")):
            factor, added = [], []
            for r in (r for r in windows if r["held"] == seen):
                n, us = float(r["rows_a_run"]), float(r["stub_us_a_request"])
                mine, theirs = loading[seen][0] / n + loading[seen][1], loading[other][0] / n + loading[other][1]
                truth = served[other][0] / n + served[other][1]
                factor.append(theirs * min(max(us / mine, 0.5), 2.0) / truth - 1)
                added.append((theirs + us - mine) / truth - 1)
            print(f"  served {seen}, {other} predicted: as a factor {statistics.median(factor):+.0%} "
                  f"({min(factor):+.0%} to {max(factor):+.0%}), added {statistics.median(added):+.0%} "
                  f"({min(added):+.0%} to {max(added):+.0%})")


if __name__ == "__main__":
    main()
