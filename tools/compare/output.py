"""A comparison written out: summary.md, CSV files and PNG plots, and a console table.

- ``peaks.csv``: every configuration tried, its peak under the QoS and the first rate past it;
- ``probes.csv``: every probe of every bisection (rate, latency, passed or not);
- ``windows.csv``: every measured window (configuration, load, round), with Triton's server-side
  columns as perf_analyzer reports them;
- ``ratios.csv``: every statistic of every configuration over the best baseline's, its 95 %
  interval and verdict;
- ``batches.csv``: batches each stage (or ensemble step) formed, by rows, per configuration and load;
- ``latency.png`` (mean and p99 against load), ``peaks.png`` (the bisections) and
  ``batches.png`` (rows per batch at the first stage).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from rich.table import Table

from tools.compare.configs import Config
from tools.compare.results import Level, Results
from tools.lib.intervals import Ratio
from tools.lib.perf_analyzer import VERSION

P = 99
NAMES = {"mean": "mean", "p99": "p99", "goodput": "goodput", "throughput": "answered/s"}


def write(results: Results, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ratios = all_ratios(results)
    _peaks_csv(results, out / "peaks.csv")
    _probes_csv(results, out / "probes.csv")
    _windows_csv(results, out / "windows.csv")
    _ratios_csv(results, ratios, out / "ratios.csv")
    _batches_csv(results, out / "batches.csv")
    (out / "summary.md").write_text(summary_markdown(results, ratios))
    plots(results, out)


def all_ratios(results: Results) -> dict[tuple[Config, str, str], Ratio]:
    """Every measured configuration's statistics over the best baseline's (bootstraps take a while)."""
    return {(c, lv.name, s): results.ratio(c, lv.name, s) for lv in results.levels for c in results.measured
            if c != results.best_baseline for s in lv.statistics}


def _peaks_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "model", "kind", "sending", "delay_us", "spinning", "peak_rps", "first_rps_past_qos",
                    "probes"])
        for c, p in results.peaks.items():
            w.writerow([c.label, c.model, c.kind, c.sending, c.delay_us, c.spinning, p.rate, p.ceiling, len(p.probes)])


def _probes_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "probe", "rate", "requests", "mean_ms", f"p{results.percentile}_ms", "answered_per_s",
                    "within_qos", "delayed_percent"])
        for c, p in results.peaks.items():
            for i, probe in enumerate(p.probes):
                win = probe.window
                w.writerow([c.label, i + 1, probe.rate, win.requests, f"{win.mean_ms:.3f}",
                            f"{win.percentile_ms(results.percentile):.3f}", f"{win.throughput:.2f}", probe.passed,
                            f"{win.delayed_percent:.1f}"])


def _windows_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "level", "load", "round", "requests", "seconds", "mean_ms", "p50_ms", "p90_ms", "p95_ms",
                    "p99_ms", "answered_per_s", "goodput_per_s", "delayed_percent", "server_queue_us",
                    "server_compute_infer_us"])
        for level in results.levels:
            for c in results.measured:
                for round_, win in enumerate(results.of(c, level.name)):
                    w.writerow([c.label, level.name, level.load.label, round_ + 1, win.requests, f"{win.seconds:.3f}",
                                *(f"{v:.3f}" for v in (win.mean_ms, *(win.percentile_ms(p) for p in (50, 90, 95, 99)))),
                                f"{win.throughput:.2f}", f"{win.goodput(results.qos_ms):.2f}",
                                f"{win.delayed_percent:.1f}", win.server_us.get("Server Queue", ""),
                                win.server_us.get("Server Compute Infer", "")])


def _ratios_csv(results: Results, ratios: dict, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "level", "statistic", "value", "baseline_value", "ratio", "low", "high", "verdict"])
        for (c, level, statistic), r in ratios.items():
            w.writerow([c.label, level, statistic, f"{results.value(c, level, statistic):.4f}",
                        f"{results.value(results.best_baseline, level, statistic):.4f}", f"{r.value:.4f}",
                        f"{r.low:.4f}", f"{r.high:.4f}", r.verdict])


def _batches_csv(results: Results, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "level", "stage", "rows", "batches"])
        for level in results.levels:
            for c in results.measured:
                for (stage, rows), count in sorted(batches(results, c, level.name).items()):
                    w.writerow([c.label, level.name, stage, rows, int(count)])


def batches(results: Results, config: Config, level: str) -> dict[tuple[int, int], float]:
    total: dict[tuple[int, int], float] = {}
    for m in results.windows.get((config, level), []):
        for key, count in m.batches.items():
            total[key] = total.get(key, 0) + count
    return total


def mean_rows(results: Results, config: Config, level: str, stage: int = 0) -> float:
    found = {rows: n for (s, rows), n in batches(results, config, level).items() if s == stage}
    return sum(r * n for r, n in found.items()) / sum(found.values()) if found else math.nan


def _num(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _cell(ratio: Ratio | None) -> str:
    return "(baseline)" if ratio is None else f"{ratio} {ratio.verdict}"


def summary_markdown(results: Results, ratios: dict) -> str:
    base = results.best_baseline
    rounds = max((len(v) for v in results.windows.values()), default=0)
    lines = [f"# {results.model}: DVABatch against the peers a Triton user would deploy", "",
             f"`{results.command}`", "",
             f"Workload: {results.workload}; QoS p{results.percentile} <= {results.qos_ms:g} ms; "
             f"perf_analyzer {VERSION} "
             f"(gRPC, asynchronous); {rounds} interleaved rounds per load; {results.seconds / 60:.1f} min. "
             f"Best baseline: **{base.label}**. Ratios are over the best baseline with their 95 % interval "
             "(two-level bootstrap over rounds and requests, `tools/intervals.py`) and a verdict; the A/A row "
             "is the best baseline against a second copy of itself: the noise floor. Goodput: answers per "
             "second within the QoS.", "",
             "## Peak under the QoS (bisection)", "",
             "| configuration | peak (requests/s) | first rate past the QoS | probes | vs best baseline |",
             "|---|---:|---:|---:|---:|"]
    base_peak = results.peaks[base].rate
    for c, p in sorted(results.peaks.items(), key=lambda kv: -kv[1].rate):
        mark = " (best baseline)" if c == base else ""
        ratio = f"{p.rate / base_peak:.2f}x" if base_peak else "-"
        lines.append(f"| {c.label}{mark} | {p.rate:g} | {'-' if math.isinf(p.ceiling) else f'{p.ceiling:g}'} | "
                     f"{len(p.probes)} | {ratio} |")
    open_levels = [lv for lv in results.levels if not lv.load.closed]
    closed_levels = [lv for lv in results.levels if lv.load.closed]
    if open_levels:
        lines += ["", "## Open loop: Poisson loads (fractions of the best baseline's peak) and intervals files", "",
                  "| load | configuration | mean ms | p99 ms | answered/s | goodput/s | rows per batch (first stage) | "
                  "mean vs baseline | p99 vs baseline | goodput vs baseline |",
                  "|---|---|---:|---:|---:|---:|---:|---|---|---|"]
        for level in open_levels:
            for c in results.measured:
                v = lambda s: results.value(c, level.name, s)  # noqa: E731
                cells = [_cell(ratios.get((c, level.name, s))) for s in level.statistics]
                rows = _num(mean_rows(results, c, level.name), 2)
                lines.append(f"| {_level(level)} | {c.label} | {_num(v('mean'))} | {_num(v('p99'))} | "
                             f"{_num(v('throughput'))} | {_num(v('goodput'))} | {rows} | " + " | ".join(cells) + " |")
    if closed_levels:
        lines += ["", "## Closed loop", "",
                  "| requests in flight | configuration | answered/s | mean ms | answered/s vs baseline | "
                  "mean vs baseline |", "|---|---|---:|---:|---|---|"]
        for level in closed_levels:
            for c in results.measured:
                v = lambda s: results.value(c, level.name, s)  # noqa: E731
                cells = [_cell(ratios.get((c, level.name, s))) for s in level.statistics]
                lines.append(f"| {level.load.concurrency} | {c.label} | {_num(v('throughput'))} | {_num(v('mean'))} | "
                             + " | ".join(cells) + " |")
    late = sorted({f"{c.label} at {level}" for (c, level), ms in results.windows.items()
                   if any(m.window.delayed_percent > 10 for m in ms)})
    if late:
        lines += ["", "perf_analyzer sent over 10 % of the requests late (it shares the CPU with the server) for: "
                  + "; ".join(late) + "."]
    lines += ["", "Plots: `latency.png`, `peaks.png`, `batches.png`. Data: `peaks.csv`, `probes.csv`, `windows.csv`, "
              "`ratios.csv`, `batches.csv`.", ""]
    return "\n".join(lines)


def _level(level: Level) -> str:
    return f"{level.name} ({level.load.label})"


def console_table(results: Results) -> Table:
    table = Table(title=f"{results.model}: mean ms (answered/s for closed loops) and peak under {results.qos_ms:g} ms")
    table.add_column("configuration")
    table.add_column("peak/s", justify="right")
    for level in results.levels:
        table.add_column(_level(level), justify="right")
    for c in results.measured:
        cells = [_num(results.value(c, lv.name, "throughput" if lv.load.closed else "mean")) for lv in results.levels]
        peak = results.peaks.get(c)
        table.add_row(c.label + (" *" if c == results.best_baseline else ""), f"{peak.rate:g}" if peak else "-",
                      *cells)
    return table


PALETTE = 128  # colours a plot keeps: a third of the bytes, and the results travel to every GPU machine


def save_png(fig, path: Path) -> None:
    """``fig`` as a PNG of ``PALETTE`` colours: these plots use a few, and in full colour they were
    the bulk of docs/results (6 of 9.6 MB), which the working tree carries beside the GPU bundle
    in the 64 MiB a lent machine takes (``tools.lib.bundle.TREE_BUDGET``)."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(colors=PALETTE, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def plots(results: Results, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    poisson = [lv for lv in results.levels if lv.load.rate is not None]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, statistic in zip(axes, ("mean", "p99")):
        for c in results.measured:
            values = [results.value(c, lv.name, statistic) for lv in poisson]
            spread = [[w.mean_ms if statistic == "mean" else w.percentile_ms(P)
                       for w in results.of(c, lv.name)] for lv in poisson]
            low = [v - min(s) if s else 0 for v, s in zip(values, spread)]
            high = [max(s) - v if s else 0 for v, s in zip(values, spread)]
            ax.errorbar([lv.load.rate for lv in poisson], values, yerr=[low, high], marker="o", capsize=3,
                        label=c.label)
        ax.set_xlabel("load (requests/s, Poisson)")
        ax.set_ylabel(f"{statistic} latency (ms), range over rounds")
        ax.set_title(f"{results.model}: {statistic} latency")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, out / "latency.png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    for c, peak in results.peaks.items():
        probes = sorted(peak.probes, key=lambda p: p.rate)
        line = ax.plot([p.rate for p in probes], [p.window.percentile_ms(results.percentile) for p in probes],
                       marker="o", linewidth=0.8, label=f"{c.label}: {peak.rate:g}/s")[0]
        ax.scatter([p.rate for p in probes if not p.passed],
                   [p.window.percentile_ms(results.percentile) for p in probes if not p.passed],
                   marker="x", color=line.get_color(), s=40)
    ax.axhline(results.qos_ms, color="red", linewidth=0.8, label="QoS")
    ax.set_yscale("log")
    ax.set_xlabel("Poisson rate probed (requests/s)")
    ax.set_ylabel(f"p{results.percentile} latency (ms)")
    ax.set_title(f"{results.model}: peak bisection (x: past the QoS)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    save_png(fig, out / "peaks.png")
    plt.close(fig)

    fig, axes = plt.subplots(1, max(1, len(poisson)), figsize=(4 * max(1, len(poisson)), 3.4), squeeze=False)
    width = 0.8 / max(1, len(results.measured))
    for ax, level in zip(axes[0], poisson):
        for k, c in enumerate(results.measured):
            found = {rows: n for (stage, rows), n in batches(results, c, level.name).items() if stage == 0}
            total = sum(found.values()) or 1
            rows = sorted(found)
            ax.bar([r + k * width for r in rows], [found[r] / total for r in rows], width=width, label=c.label)
        ax.set_title(_level(level), fontsize=9)
        ax.set_xlabel("rows per batch (first stage)")
        ax.set_ylabel("share of batches")
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    save_png(fig, out / "batches.png")
    plt.close(fig)
