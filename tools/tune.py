"""python -m tools.tune: choose the stage count by measuring (the paper tries 1 to 8 stages).

    python -m tools.tune SRC.onnx --out model_repository/NAME [--stages 1-8] [--max-batch-size 8]
        [--by peak | --by latency --rate R] [--dataset glue:RTE --tokenizer FILE | --input-data ...]
        [--qos-ms 200] [--probe-seconds 5] [--window 10] [--rounds 2] [--csv tune.csv]

Slices the model into each stage count (the slicer's defaults otherwise, including its policy
defaults), serves every slicing from one tritonserver, loads them with perf_analyzer sending the
same queries, and picks the best: the highest Poisson rate whose p99 stays within the QoS, found
by bisection (``--by peak``), or the lowest mean latency at ``--rate`` requests/s (Poisson) over
``--rounds`` interleaved windows (``--by latency``). The winner is written to ``--out``
(replacing an earlier slicing there); every try and the time tuning took are reported.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from backend.manifest import Manifest
from slicer.errors import SliceError
from slicer.slicing import VERSION, SliceOptions, slice_model
from tools.lib.cli import numbers, table_console
from tools.lib.harness import PEAK_TOLERANCE, add_measurement_arguments, Bench
from tools.lib.perf_analyzer import Load, PerfAnalyzerError
from tools.lib.workload import WorkloadError, add_workload_arguments, from_arguments, interface_of, write_input_data


@dataclass
class Try:
    stages: int
    model: str
    slice_seconds: float
    balance: float = math.nan
    error: str = ""
    peak: float = math.nan
    mean_ms: list[float] | None = None
    p99_ms: list[float] | None = None
    serves: list[str] = field(default_factory=list)  # how it served after each measurement (``Bench.serving``)

    def saw(self, mode: str) -> None:
        if mode and mode not in self.serves:
            self.serves.append(mode)

    @property
    def mean(self) -> float:
        return statistics.median(self.mean_ms) if self.mean_ms else math.nan


def _counts(text: str) -> tuple[int, ...]:
    counts: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            counts.update(range(int(low), int(high or low) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected counts such as 1-8 or 1,2,4, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"stage counts must be at least 1, got {text!r}")
    return tuple(sorted(counts))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="the ONNX model to slice")
    p.add_argument("--out", type=Path, required=True, help="model directory for the winner (its name is the model's)")
    p.add_argument("--stages", type=_counts, default=tuple(range(1, 9)), help="stage counts to try (default 1-8)")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--slice-lengths", type=numbers(int), default="16,32,64",
                   help="the slicer's --lengths for models with a length axis (default 16,32,64)")
    p.add_argument("--by", choices=("peak", "latency"), default="peak", help="what picks the winner (default peak)")
    p.add_argument("--rate", type=float, help="--by latency: the load, in requests/s (Poisson)")
    add_workload_arguments(p)
    add_measurement_arguments(p, rounds=2)  # --by peak: the QoS and probes; --by latency: the windows
    p.add_argument("--csv", type=Path, help="write every try here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = table_console()
    if args.by == "latency" and not args.rate:
        console.print("[red]error:[/red] --by latency needs --rate")
        return 2
    began = time.monotonic()
    name = args.out.name
    with tempfile.TemporaryDirectory(prefix="dvabatch-tune-") as scratch:
        repository = Path(scratch) / "repository"
        tries = slice_all(args, repository, name, args.slice_lengths, console)
        served = [t for t in tries if not t.error]
        if not served:
            console.print("[red]error:[/red] no stage count could be sliced")
            return 2
        try:
            data = args.input_data if args.input_data not in ("random", "zero") and not args.dataset else \
                write_input_data(from_arguments(args, interface_of(repository / served[0].model)),
                                 Path(scratch) / "data.json")
        except WorkloadError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
        try:
            with Bench(repository, log=repository / "tritonserver.log") as bench:
                for t in served:
                    bench.load(t.model)
                measure(bench, served, data, args, console)
        except PerfAnalyzerError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 1
        best = (max(served, key=lambda t: (t.peak, -t.stages)) if args.by == "peak"
                else min(served, key=lambda t: (t.mean, t.stages)))
        install(repository / best.model, args.out)
    seconds = time.monotonic() - began
    console.print(report(tries, best, args))
    for line in caveats(served, best, args):
        console.print(line, highlight=False)
    if args.csv:
        write_csv(args.csv, tries, best)
    console.print(f"{best.stages} stages won ({'peak' if args.by == 'peak' else 'mean latency'}); wrote {args.out}. "
                  f"Tuning took {seconds / 60:.1f} min.")
    return 0


def slice_all(args: argparse.Namespace, repository: Path, name: str, lengths: tuple[int, ...],
              console: Console) -> list[Try]:
    tries = []
    options = SliceOptions(max_batch_size=args.max_batch_size, lengths=lengths)
    for count in args.stages:
        model = f"{name}_{count}stages"
        began = time.perf_counter()
        try:
            result = slice_model(args.src, repository / model, replace(options, stages=count))
            t = Try(count, model, time.perf_counter() - began, result.manifest.slicing.balance)
        except (SliceError, FileNotFoundError) as exc:
            shutil.rmtree(repository / model, ignore_errors=True)
            t = Try(count, model, time.perf_counter() - began, error=str(exc))
        console.print(f"  {count} stages: " + (f"sliced in {t.slice_seconds:.0f} s, balance {t.balance:.2f}"
                                               if not t.error else f"not sliced: {t.error}"), highlight=False)
        tries.append(t)
    return tries


def measure(bench: Bench, tries: list[Try], data, args: argparse.Namespace, console: Console) -> None:
    max_bs = Manifest.load(Path(bench.server.model_repository) / tries[0].model / VERSION).max_batch_size
    for t in tries:  # warm every slicing up
        bench.capacity(t.model, data, max_bs, args.warmup)
    if args.by == "peak":
        start = 0.8 * bench.capacity(tries[0].model, data, 2 * max_bs, 2 * args.probe_seconds)
        for t in tries:
            t.peak = bench.peak(t.model, data, float(f"{start:.3g}"), args.qos_ms, args.percentile,
                                args.probe_seconds).rate
            start = max(start, t.peak)
            t.saw(bench.serving(t.model))
            console.print(f"  {t.stages} stages: peak {t.peak:g} requests/s", highlight=False)
        return
    for round_ in range(args.rounds):
        shift = round_ % len(tries)
        for t in tries[shift:] + tries[:shift]:
            w = bench.window(t.model, Load(rate=args.rate), data, args.window, args.warmup).window
            t.mean_ms = (t.mean_ms or []) + [w.mean_ms]
            t.p99_ms = (t.p99_ms or []) + [w.percentile_ms(99)]
            t.saw(bench.serving(t.model))
            console.print(f"  round {round_ + 1}, {t.stages} stages: mean {w.mean_ms:.1f} ms, "
                          f"p99 {w.percentile_ms(99):.1f} ms", highlight=False)


def install(model_dir: Path, out: Path) -> None:
    """Copy the winning slicing to ``out`` under its name; an earlier model there is replaced
    only if the slicer wrote it (it has a manifest)."""
    if out.exists() and not (out / VERSION / "manifest.json").is_file():
        raise SystemExit(f"{out} exists and is not a sliced model; not replacing it")
    staged = out.with_name(f".{out.name}.tuning")
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(model_dir, staged)
    config = staged / "config.pbtxt"
    config.write_text(re.sub(r'^name:\s*".*"', f'name: "{out.name}"', config.read_text(), count=1, flags=re.M))
    shutil.rmtree(out, ignore_errors=True)
    staged.rename(out)


def report(tries: list[Try], best: Try, args: argparse.Namespace) -> Table:
    goal = f"peak under {args.qos_ms:g} ms" if args.by == "peak" else f"mean latency at {args.rate:g}/s"
    table = Table(title=f"stage counts tried ({goal})")
    for column in ("stages", "sliced in s", "balance", "serves", "peak/s" if args.by == "peak" else "mean ms (p99 ms)",
                   ""):
        table.add_column(column, justify="right")
    for t in tries:
        if t.error:
            result = t.error
        elif args.by == "peak":
            result = f"{t.peak:g}"
        else:
            result = f"{t.mean:.1f} ({statistics.median(t.p99_ms):.1f})"
        table.add_row(str(t.stages), f"{t.slice_seconds:.0f}", "-" if math.isnan(t.balance) else f"{t.balance:.2f}",
                      ", ".join(t.serves) or "-", result, "best" if t is best else "")
    return table


def caveats(served: list[Try], best: Try, args: argparse.Namespace) -> list[str]:
    """What a reader of the table should know before trusting the winner: the slicings served
    inside ``execute`` throughout (``auto`` found the pipeline cannot pay on this host, so the
    stage count barely matters here), and the others measured within the winner's resolution
    (the bisection's tolerance for a peak; the rounds' spread for a mean)."""
    lines = []
    if all(t.serves and "pipeline" not in t.serves for t in served):
        lines.append("Every slicing served inside execute here, as a plain model does (auto found that the "
                     "pipeline cannot pay on this host: backend/decide/), so the stage count changes little "
                     "on it: tune on the host that will serve.")
    if args.by == "peak":
        close = [t for t in served if t is not best and t.peak >= best.peak / (1 + PEAK_TOLERANCE)]
        why = f"within {PEAK_TOLERANCE:.0%} of its peak, the bisection's resolution"
    else:
        worst = max(best.mean_ms or [math.nan])
        close = [t for t in served if t is not best and t.mean_ms and min(t.mean_ms) <= worst]
        why = "its rounds' spread overlapping the winner's"
    if close:
        counts = ", ".join(f"{t.stages} stage{'s' if t.stages > 1 else ''}" for t in close)
        lines.append(f"{best.stages} stages won, but {counts} measured {why}: no real difference was shown.")
    return lines


def write_csv(path: Path, tries: list[Try], best: Try) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["stages", "slice_seconds", "balance", "serves", "peak_rps", "mean_ms", "p99_ms", "best", "error"])
        for t in tries:
            w.writerow([t.stages, f"{t.slice_seconds:.1f}", t.balance, " ".join(t.serves), t.peak, t.mean,
                        statistics.median(t.p99_ms) if t.p99_ms else math.nan, t is best, t.error])


if __name__ == "__main__":
    sys.exit(main())
