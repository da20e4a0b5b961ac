"""A comparison written out: summary.md, CSV files and PNG plots, and a console table.

- ``peaks.csv``: every configuration tried, its peak under the QoS and the throughput there;
- ``stepping.csv``: every request of every stepping load (Figure 15's data);
- ``loads.csv``: every measured window (configuration, load, round) with latency percentiles;
- ``batches.csv``: batch items each stage ran, by rows, per configuration and load;
- ``latency.png`` (mean and p99 against load, median and range over rounds), ``stepping.png``
  (per-query latency under the stepping load) and ``batches.png`` (rows per batch formed).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from rich.table import Table

from tools.compare.results import Results

P = 99


def write(results: Results, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _peaks_csv(results, out / "peaks.csv")
    _stepping_csv(results, out / "stepping.csv")
    _loads_csv(results, out / "loads.csv")
    _batches_csv(results, out / "batches.csv")
    (out / "summary.md").write_text(summary_markdown(results))
    plots(results, out)


def _peaks_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "model", "kind", "sending", "delay_us", "spinning", "peak_rps", "peak_capped",
                    "throughput_at_peak", "steps"])
        for c, s in results.peaks.items():
            w.writerow([c.label, c.model, c.kind, c.sending, c.delay_us, c.spinning, s.peak, s.capped,
                        f"{s.peak_throughput:.2f}", len(s.steps)])


def _stepping_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "query", "step", "rate", "sent_s", "latency_ms", "status", "length"])
        for c, s in results.peaks.items():
            for i, r in enumerate(s.records):
                w.writerow([c.label, i, r.phase, s.rates[r.phase], f"{r.sent:.4f}", f"{r.latency_ms:.3f}", r.status,
                            "" if r.length is None else r.length])


def _loads_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "load", "rate", "round", "requests", "failures", "throughput", "mean_ms", "p50_ms",
                    "p90_ms", "p95_ms", "p99_ms", "meta_new", "meta_stretch", "meta_split"])
        for level in results.levels:
            for c in results.measured:
                for round_, window in enumerate(results.windows.get((c, level.name), [])):
                    s = window.summary
                    w.writerow([c.label, level.name, level.rate, round_ + 1, s.requests, sum(s.failures.values()),
                                f"{s.throughput:.2f}", *(f"{v:.3f}" for v in (s.mean_ms, *s.percentiles_ms.values())),
                                *(int(window.meta.get(k, 0)) for k in ("new", "stretch", "split"))])


def _batches_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "load", "stage", "rows", "batch_items"])
        for level in results.levels:
            for c in results.measured:
                for (stage, rows), count in sorted(_batches(results, c, level.name).items()):
                    w.writerow([c.label, level.name, stage, rows, int(count)])


def _batches(results: Results, config, level: str) -> dict[tuple[int, int], float]:
    total: dict[tuple[int, int], float] = {}
    for window in results.windows.get((config, level), []):
        for key, count in window.batches.items():
            total[key] = total.get(key, 0) + count
    return total


def mean_rows(results: Results, config, level: str, stage: int = 0) -> float:
    batches = {rows: n for (s, rows), n in _batches(results, config, level).items() if s == stage}
    return sum(r * n for r, n in batches.items()) / sum(batches.values()) if batches else math.nan


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _spread(results: Results, config, level: str, statistic) -> str:
    median, low, high = results.spread(config, level, statistic)
    return "-" if math.isnan(median) else f"{median:.1f} ({low:.1f}-{high:.1f})"


def summary_markdown(results: Results) -> str:
    base = results.best_baseline
    lines = [f"# {results.model}: DVABatch against Triton's dynamic batcher", "",
             f"Workload: {results.dataset or 'synthetic inputs'}; QoS p{results.percentile} <= {results.qos_ms:g} ms; "
             f"ZeroBatch closed-loop capacity {results.capacity:.1f} requests/s; {results.seconds / 60:.1f} min.", "",
             "## Peak throughput under the QoS (stepping load)", "",
             "| configuration | peak (requests/s) | answered/s at the peak | vs best baseline |",
             "|---|---:|---:|---:|"]
    base_peak = results.peaks[base].peak if base else math.nan
    for c, s in sorted(results.peaks.items(), key=lambda kv: -kv[1].peak):
        mark = " (best baseline)" if c == base else ""
        ratio = f"{s.peak / base_peak:.2f}x" if base_peak else "-"
        lines.append(f"| {c.label}{mark} | {'>= ' if s.capped else ''}{s.peak:g} | {s.peak_throughput:.1f} | {ratio} |")
    lines += ["", "## Latency at low, medium and high load (Poisson)", "",
              "Median over rounds, (min-max) in brackets; ratio: mean latency over the best baseline's.", "",
              "| load | configuration | mean ms | p99 ms | answered/s | rows per batch (stage 0) | failures | "
              "mean vs best baseline |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for level in results.levels:
        base_mean = results.spread(base, level.name, lambda s: s.mean_ms)[0] if base else math.nan
        for c in results.measured:
            mean = results.spread(c, level.name, lambda s: s.mean_ms)[0]
            failures = sum(sum(w.summary.failures.values()) for w in results.windows.get((c, level.name), []))
            ratio = f"{mean / base_mean:.2f}x" if base_mean and not math.isnan(mean) else "-"
            lines.append(f"| {level.name} ({level.rate:g}/s) | {c.label} | "
                         f"{_spread(results, c, level.name, lambda s: s.mean_ms)} | "
                         f"{_spread(results, c, level.name, lambda s: s.percentiles_ms[P])} | "
                         f"{_spread(results, c, level.name, lambda s: s.throughput)} | "
                         f"{_ms(mean_rows(results, c, level.name))} | {failures} | {ratio} |")
    lines += ["", "Plots: `latency.png`, `stepping.png`, `batches.png`. Data: `peaks.csv`, `loads.csv`, "
              "`stepping.csv`, `batches.csv`.", ""]
    return "\n".join(lines)


def console_table(results: Results) -> Table:
    table = Table(title=f"{results.model}: mean / p{P} ms (median over rounds) and peak under {results.qos_ms:g} ms")
    table.add_column("configuration")
    table.add_column("peak/s", justify="right")
    for level in results.levels:
        table.add_column(f"{level.name} {level.rate:g}/s", justify="right")
    for c in results.measured:
        cells = []
        for level in results.levels:
            mean = results.spread(c, level.name, lambda s: s.mean_ms)[0]
            p99 = results.spread(c, level.name, lambda s: s.percentiles_ms[P])[0]
            cells.append(f"{_ms(mean)} / {_ms(p99)}")
        peak = results.peaks[c]
        table.add_row(c.label + (" *" if c == results.best_baseline else ""),
                      f"{'>= ' if peak.capped else ''}{peak.peak:g}", *cells)
    return table


def plots(results: Results, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Mean and p99 latency against load.
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (title, statistic) in zip(axes, (("mean", lambda s: s.mean_ms), (f"p{P}", lambda s: s.percentiles_ms[P]))):
        for c in results.measured:
            spreads = [results.spread(c, lv.name, statistic) for lv in results.levels]
            rates = [lv.rate for lv in results.levels]
            ax.errorbar(rates, [m for m, _, _ in spreads], yerr=[[m - lo for m, lo, _ in spreads],
                                                                  [hi - m for m, _, hi in spreads]],
                        marker="o", capsize=3, label=c.label)
        ax.set_xlabel("load (requests/s, Poisson)")
        ax.set_ylabel(f"{title} latency (ms)")
        ax.set_title(f"{results.model}: {title} latency")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)

    # Per-query latency under the stepping load (the paper's Figure 15).
    shown = [c for c in results.measured if c in results.peaks and (c == results.best_baseline or not c.baseline)]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 2.6 * len(shown)), squeeze=False)
    for ax, c in zip(axes[:, 0], shown):
        s = results.peaks[c]
        ok = [(i, r.latency_ms) for i, r in enumerate(s.records) if r.status == "OK"]
        ax.scatter([i for i, _ in ok], [v for _, v in ok], s=2, label="latency")
        ax.axhline(results.qos_ms, color="red", linewidth=0.8, label="QoS")
        ax.set_ylabel("ms")
        ax.set_title(f"{c.label}: peak {s.peak:g} requests/s", fontsize=9)
        rate = ax.twinx()
        rate.plot(range(len(s.records)), [s.rates[r.phase] for r in s.records], color="gray", linewidth=0.8)
        rate.set_ylabel("requests/s")
    axes[-1, 0].set_xlabel("query (in sending order)")
    fig.tight_layout()
    fig.savefig(out / "stepping.png", dpi=110)
    plt.close(fig)

    # Rows per batch formed at the entry (stage 0), per load.
    fig, axes = plt.subplots(1, len(results.levels), figsize=(4 * len(results.levels), 3.4), squeeze=False)
    width = 0.8 / max(1, len(results.measured))
    for ax, level in zip(axes[0], results.levels):
        for k, c in enumerate(results.measured):
            batches = {rows: n for (stage, rows), n in _batches(results, c, level.name).items() if stage == 0}
            total = sum(batches.values()) or 1
            rows = sorted(batches)
            ax.bar([r + k * width for r in rows], [batches[r] / total for r in rows], width=width, label=c.label)
        ax.set_title(f"{level.name} load ({level.rate:g}/s)", fontsize=9)
        ax.set_xlabel("rows per batch (stage 0)")
        ax.set_ylabel("share of batches")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "batches.png", dpi=110)
    plt.close(fig)
