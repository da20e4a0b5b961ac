"""python -m tools.check_auto: is ``auto`` within 5 % of the better of the plain model and the forced pipeline?

    python -m tools.check_auto [PROFILE.json | MODEL_DIR ...] [--concurrency 1,16,64]
                               [--loads 0.3,0.6,0.9] [--qos-ms 200] [--percentile 99] [--seconds 3] [--warmup 4]
                               [--bursts 0.1/0.8] [--burst-seconds 2] [--rounds 1] [--max-rounds N]
                               [--reload-every 1]
                               [--margin 0.05] [--length 64 | 32,64,128] [--request-rows 1] [--instances 1] [--ensemble]
                               [--source SRC.onnx ...]
                               [--out docs/results/RUN]

For each timed profile (default: near-zero compute, TensorRT-speed BERT-base and the slower
engine of ``docs/profiles``) or sliced model directory, one tritonserver serves three models of
the same engine, as ``tools.bench_cost`` builds them: ``plain`` (a plain Python model behind
Triton's dynamic batcher), ``pipeline`` (our runtime with ``policy: pass``, always pipelined)
and ``auto`` (what the slicer writes; ``tools.lib.peers.write_ways``). Every query has
``--length`` tokens; given several, successive queries take them in turn (the paper's input
diversity), and the plain model pads a batch to its longest (``allow_ragged_batch``: Triton's
batcher would otherwise batch equal lengths only, as the forced pipeline's ``policy: pass`` and
the ensemble's steps do). With ``--request-rows`` each request carries that many rows of one
length (a client that batches its own, as an image classifier's often does): the figures count
requests, and ``auto``'s mode switch must put the stub's work on requests and the engines' on
rows. Each cell runs the three side by side:

- closed loops (perf_analyzer) at each ``--concurrency``: answers/s; ``auto`` passes where it
  answers at least ``1 - margin`` of the better of the other two;
- Poisson loads at each ``--loads`` fraction of the better one's peak (the higher of the two
  Poisson peaks, each the highest rate whose p``--percentile`` stays within ``--qos-ms``, found
  by bisection from the last closed loop's figure and never above it: ``better_peak``): mean latency; ``auto``
  passes where its mean is at most ``1 + margin`` of the lower of the other two;
- loads that come and go, with ``--bursts LOW/HIGH``: Poisson arrivals at ``LOW`` of that peak
  for ``--burst-seconds``, then at ``HIGH`` as long, over and over (``perf_analyzer.write_bursts``,
  the same arrivals for each model): mean latency, as for a Poisson load. A stationary load lets
  a model that decides while it serves settle; one that moves every few seconds asks it to
  follow, or to hold a way that serves both rates.

Every window starts with ``--warmup`` seconds unmeasured, in which ``auto`` settles on the load
(its mode switch looks each second and needs two windows of a load to change its mind; where the
way it serves is at capacity it then tries the other for a window or two, ``decide.Trial``, one
trial a load): an open loop's as that many seconds' requests, a closed loop's by the clock
(``perf_analyzer.after_warmup``). Four seconds by default, so that a trial begun as the warm-up's
second window ends is over before the measured seconds: with two, such trials ran inside them (at
TensorRT speed under Poisson 0.9, one begun 2.0 s into the load ran the first 1.5 s of the window,
which read 1.35x the plain model's mean: docs/results/check-warmup-trials). A load that moves
every few seconds, where a trial's cost is part of serving it, is measured with ``--bursts``.
The rounds run the three in turn, each round starting one further along (``check_cell.in_turn``),
so that a host slowing down or speeding up over a cell, and a window's place in its round, weigh
on each alike.

A model's process keeps a speed of its own while it lives: exact copies of one forced pipeline,
loaded once, read 0.90x [0.88, 0.93] and 0.92x [0.86, 0.98] it over 20 and 12 rounds, where loaded
afresh every few rounds they read 0.97x-1.00x (docs/results/check-process-lives). So every
``--reload-every`` rounds (every round by default, ``cli.RELOAD_EVERY``) each model of a cell is
unloaded and loaded afresh, its stubs new processes, and runs ``--warmup`` seconds at the cell's
load unmeasured before the next round (``auto`` learns anew from loading on, as on a server just
started); each such life's rounds make one ratio, and the interval is over lives, which a
verdict needs two of where ``--rounds`` asks for two or more rounds (``check_cell.Cell.by_life``;
``--max-rounds`` must then allow two lives). ``--reload-every 0`` loads each model once and reads
each round as a life (the reading before; its processes' own speeds then go unseen).

Per cell the table says the three figures (each pooled over its rounds), ``auto`` over the
better one (the geometric mean of the lives' ratios, each round's windows side by side) with its
95 % t interval over the lives (``tools.lib.intervals.across_rounds``: it widens as they get
fewer, as it must on a host whose windows move from round to round), ``auto`` over the better
one in each round, how far the better one's own rounds lie apart, and a verdict
(``Cell.verdict``):

- ``yes``: the whole interval is within the margin (``auto`` shown within 5 %);
- ``NO``: the whole interval is outside it (shown outside);
- ``unresolved``: the interval holds the margin's edge: on this host, at these rounds, the
  windows move by more than the difference, and only more rounds (or a quieter host) can tell.

With ``--ensemble`` each round runs a fourth model, the ensemble of the stages (each step a
plain model behind its own batcher: ``tools.bench_cost``'s), and each cell adds ``auto`` over
it with its interval: where the pipeline pays, the margins issue 20 reached over the ensemble
(1.2x its answers/s at 16 and 64 in flight, 0.8x its mean at medium load) are read in the same
run as the verdicts. The ensemble takes no part in the verdict, nor in the Poisson rates.

Beside the verdict, each cell says how ``auto`` served while measured (the seconds its
``dvabatch_serving_seconds_total`` grew each way during its windows, warm-ups included; of its
seconds pipelined, the share of its ``execute`` calls in which a lone batch ran inline counts as
served plain, for it ran as the plain path runs: ``decide.LoneRuns``) and whether that was the
better way's (``choice``): ``right`` where it served as the better one at
least 90 % of that time, ``wrong`` at most 10 %, else ``mixed``, and ``either`` where the two ways
are not shown apart by more than the margin (the worse one over the better by the same test as
``auto``'s verdict), so that any choice is right. The host's noise that leaves a ratio unresolved
seldom hides which way is better by far: a cell can show that ``auto`` chose right on a host
whose windows cannot show it within 5 %, and where it chose right, what is left is the cost of
its serving path beside the peer's.

One round (``--rounds 1``) gives no interval: its ratio alone says yes or no. Where more were asked
for, a cell left with fewer rounds that have both windows is unresolved.

With ``--max-rounds`` a cell still unresolved after ``--rounds`` gets more rounds until its verdict
is read or it has had that many: rounds go where this host's noise needs them. It is read again
after 1.5 times the rounds of the look before (``check_cell.looks``: 2, 3, 5, 8, 12, 18, 24), and
at ``--max-rounds``. Looking more often would find a wrong verdict more often than one look does,
so each look reads a wider interval (Bonferroni: 1 - 5 % / looks; ``looked``), and a verdict is
still wrong at most 5 % of the time, whichever look reads it (the table's "95 %" is that
guarantee). From a look at which plain and the forced pipeline are shown more than the margin
apart, the worse of them runs no more (``auto``'s verdict and choice read the better alone): a
round then takes two windows, ``auto``'s next to the better one's.

``--out`` keeps the table (summary.md, check.csv) and every window's figure (windows.csv),
rewritten after each cell, so that a run cut short keeps what it measured. A window that fails
(perf_analyzer hangs now and then, more often with every process on one core) leaves its figure
out and its round uncounted (another round makes up for it where ``--max-rounds`` allows); a cell
left with fewer rounds than ``--rounds`` is unresolved, and one without any fails. The exit
status is 0 only where every cell is shown within the margin.
"""

from __future__ import annotations

import argparse
import collections
import csv
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tritonclient.utils import InferenceServerException

from tools.lib.cli import (add_bursts_arguments, add_fill_argument, add_lengths_argument, add_reload_argument,
                           add_request_rows_argument, count, numbers, served, table_console)
from tools.lib.check_cell import Cell, Served, in_turn, looks
from tools.lib.harness import Bench, Measured
from tools.lib.paths import ROOT
from tools.lib.peers import Peer, write_ways
from tools.lib.perf_analyzer import Load, PerfAnalyzerError, write_bursts
from tools.lib.workload import WorkloadError, interface_of, synthetic, write_input_data

PROFILES = ROOT / "docs" / "profiles"
DEFAULT_PROFILES = tuple(PROFILES / name for name in ("zero_2stages.json", "bert_base_trt_a100_2stages.json",
                                                     "slow_2stages.json"))
MODELS = ("plain", "pipeline", "auto")
ENSEMBLE = "ensemble"


def run_profile(profile: Path, args: argparse.Namespace, console: Console) -> Iterator[Cell]:
    """Each cell of ``profile`` as soon as it is measured: the closed loops, then the Poisson
    loads at fractions of the better way's Poisson peak (``better_peak``)."""
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-check-"))
    try:
        write_ways(profile, folder, {}, args.source, Peer(ragged=len(args.length) > 1, instances=args.instances))
        queries = synthetic(interface_of(folder / "auto"), 1, {}, lengths=args.length, fill=dict(args.fill))
        data = write_input_data(queries, folder / "data.json")
        log = (args.out / f"tritonserver-{profile.stem}.log") if args.out else folder / "triton.log"
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        with Bench(folder, log=log) as bench:
            for model in args.models:
                bench.load(model)
                bench.capacity(model, data, max(args.concurrency), 1.0, args.request_rows)  # warm up
            of = f" of {args.request_rows} rows" if args.request_rows > 1 else ""
            for concurrency in args.concurrency:
                top = measure(bench, profile.stem, f"{concurrency} in flight{of}",
                              Load(concurrency=concurrency, rows=args.request_rows), data, args, console)
                yield top
            if not args.loads and not args.bursts:
                return
            closed = {model: top.figures[model] for model in ("plain", "pipeline")
                      if not math.isnan(top.figures[model])}
            peak = better_peak(bench, data, closed, args, console)
            for fraction in args.loads:
                yield measure(bench, profile.stem, f"Poisson {fraction:g} x {peak:.0f}/s{of}",
                              Load(rate=fraction * peak, rows=args.request_rows), data, args, console)
            for low, high in args.bursts:
                intervals = write_bursts(folder / f"bursts-{low:g}-{high:g}.txt", (low * peak, high * peak),
                                         args.burst_seconds, args.warmup + args.seconds)
                yield measure(bench, profile.stem, f"bursts {low:g} / {high:g} x {peak:.0f}/s, "
                              f"{args.burst_seconds:g} s each{of}",
                              Load(intervals=intervals, rows=args.request_rows), data, args, console)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def better_peak(bench: Bench, data: Path, closed: dict[str, float], args: argparse.Namespace,
                console: Console) -> float:
    """The higher of the plain model's and the forced pipeline's Poisson peaks: the highest rate
    whose p``--percentile`` stays within ``--qos-ms`` (``Bench.peak``, from ``closed``, each one's
    answers/s in the last closed loop, and never above it). A closed loop of 64 forms batches
    that a Poisson load at its rate does not, so the host carries less that way: at 0.9 of the
    closed loop's figure every model's queue grew through the window (means of 17-122 ms where
    the batches' own took 2, their rounds 8,752 % apart), and a mean past capacity says how long
    the window was, not how the model serves (docs/results/check-auto-poisson-peak). Past
    capacity the requests pile up, over HTTP each on a connection of its own: probed past its
    own closed loop's figure (the forced pipeline at plain's 8,400/s, where it had answered some
    5,300), a model ran tritonserver out of open files (``bisect_peak``)."""
    peaks = {}
    for model, figure in closed.items():
        start = float(f"{figure:.3g}")
        found = bench.peak(model, data, start, args.qos_ms, args.percentile, args.seconds,
                           args.warmup, rows=args.request_rows, cap=start)
        peaks[model] = found.reference
        above = "not probed above the closed loop's" if found.rate >= start else f"+{found.resolution:.0%} at most"
        console.print(f"  peak of {model}: {peaks[model]:g} requests/s ({above})", highlight=False)
    return max(peaks.values())


HEADER = ("profile", "load", "plain", "pipeline", "auto", "auto / better [95 %]", "within", "each round",
          "better's spread", "auto served", "choice")
ENSEMBLE_HEADER = (ENSEMBLE, "auto / ensemble [95 %]")  # added with --ensemble
WINDOW_HEADER = ("profile", "load", "round", "model", "answers/s or mean ms", "requests", "seconds",
                 "served (mode:seconds)")


def looked(args: argparse.Namespace) -> float:
    """The confidence of each look at a cell's interval: with ``--max-rounds``, a cell is judged
    at each of ``looks`` from ``--rounds`` to ``--max-rounds``, and a verdict read at any of
    them must be wrong no more often than one read once at 95 % (Bonferroni over the looks)."""
    return 1 - 0.05 / len(looks(args.rounds, args.max_rounds))


def measure(bench: Bench, profile: str, label: str, load: Load, data: Path, args: argparse.Namespace,
            console: Console) -> Cell:
    """The models' windows in ``--rounds`` rounds, each starting one further along (``in_turn``),
    and then, while the cell's verdict is unresolved, more rounds up to ``--max-rounds``, read
    at each of ``looks``; from a look on which one of plain and the pipeline is clearly the
    better, the other is left out (``Cell.drop_worse``). A window that fails (perf_analyzer hung
    every time) is None, and its round does not count: the cell stays unresolved until
    ``--rounds`` rounds have both windows, so a lost window is made up by another round where
    ``--max-rounds`` allows one."""
    cell = Cell(profile, label, load.closed, {m: [] for m in args.models}, looked(args), args.rounds,
                lives=[0] if args.reload_every else None)
    stops = looks(args.rounds, args.max_rounds)
    for turn in range(args.max_rounds):
        if turn in stops:
            if cell.verdict(args.margin) != "unresolved":
                break
            cell.drop_worse(args.margin)
        running = cell.running(turn)
        if cell.lives is not None and turn and turn % args.reload_every == 0:
            bench.reload(in_turn(running, len(cell.lives)), load, data, args.warmup)
            cell.lives.append(turn)
        for model in running:
            measured = window(bench, profile, model, load, data, args, console)
            cell.rounds[model].append(measured and measured.window)
            if model == "auto":
                cell.served.append(Served.of(measured))
        for model in set(args.models) - set(running):
            cell.rounds[model].append(None)
    console.print(f"{profile} {label}: auto {cell.versus()} the {cell.best} one after {len(cell.rounds['auto'])} "
                  f"rounds: {cell.verdict(args.margin)}; served {cell.served_label()}: {cell.choice(args.margin)}"
                  + "".join(f"; {m} left out from round {turn + 1}" for m, turn in cell.dropped.items()))
    return cell


def window(bench: Bench, profile: str, model: str, load: Load, data: Path, args: argparse.Namespace,
           console: Console) -> Measured | None:
    """One window of ``model`` at ``load``, or None where perf_analyzer failed it."""
    try:
        return bench.window(model, load, data, args.seconds, args.warmup)
    except PerfAnalyzerError as exc:
        console.print(f"[red]{profile} {model} {load.label}: {exc}[/red]")
        return None


def row(cell: Cell, margin: float) -> list[str]:
    unit = "/s" if cell.closed else " ms"
    fmt = (lambda v: f"{v:.0f}{unit}") if cell.closed else (lambda v: f"{v:.2f}{unit}")
    figures, spread = cell.figures, cell.spread()
    line = [cell.profile, cell.load, *(fmt(figures[m]) for m in MODELS),
            f"{cell.versus()} ({cell.best})", cell.verdict(margin),
            " / ".join(f"{r:.2f}x" for r in cell.paired()) or "-",
            "-" if math.isnan(spread) else f"{spread:.0%}", cell.served_label(), cell.choice(margin)]
    if ENSEMBLE in cell.rounds:
        line += [fmt(figures[ENSEMBLE]), str(cell.versus(ENSEMBLE))]
    return line


def header(args: argparse.Namespace) -> tuple[str, ...]:
    return HEADER + (ENSEMBLE_HEADER if ENSEMBLE in args.models else ())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.check_auto", description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", type=served, nargs="*", default=list(DEFAULT_PROFILES),
                        help="timed profiles (JSON) or sliced model directories (default: three timed profiles)")
    parser.add_argument("--concurrency", type=numbers(int), default="1,16,64",
                        help="closed-loop concurrencies (default 1,16,64)")
    parser.add_argument("--loads", type=numbers(float, empty=True), default="0.3,0.6,0.9",
                        help="Poisson rates as fractions of the better model's Poisson peak "
                             "(default 0.3,0.6,0.9; empty: closed loops alone)")
    add_bursts_arguments(parser, "as fractions of the better model's Poisson peak", "0.1/0.8")
    parser.add_argument("--qos-ms", type=float, default=200,
                        help="the latency target of a Poisson peak, which the loads are fractions of (default 200)")
    parser.add_argument("--percentile", type=int, default=99,
                        help="the latency percentile held to --qos-ms (default 99)")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window (default 3)")
    parser.add_argument("--warmup", type=float, default=4.0, help="unmeasured seconds before each window (default 4)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-rounds", type=int, default=0,
                        help="more rounds, up to this many, for a cell still unresolved after --rounds (default: none)")
    add_reload_argument(parser, "a cell's verdict")
    parser.add_argument("--margin", type=float, default=0.05)
    add_lengths_argument(parser)
    add_fill_argument(parser)
    add_request_rows_argument(parser)
    parser.add_argument("--instances", type=count(1, "{text}: a model needs one instance at least"), default=1,
                        help="instances of every model (instance_group count; default 1): each its own stub, "
                             "Triton's calls taken in turn")
    parser.add_argument("--ensemble", action="store_true",
                        help="run the ensemble of the stages too, and set auto beside it (not part of the verdict)")
    parser.add_argument("--source", type=Path, action="append", default=[],
                        help="the unsliced source of a sliced model directory (found by its sha256)")
    parser.add_argument("--out", type=Path, help="write summary.md and check.csv here")
    args = parser.parse_args(argv)
    if args.max_rounds > args.rounds < 2:
        parser.error("--max-rounds needs --rounds 2 or more: one round has no interval to leave a cell unresolved")
    if args.request_rows > 1 and len(args.length) > 1:
        parser.error(f"--request-rows {args.request_rows} with --length {','.join(map(str, args.length))}: "
                     "a request's rows share one length")
    args.max_rounds = max(args.max_rounds, args.rounds)  # without it, --rounds and no more
    if args.rounds > 1 and args.reload_every and args.max_rounds < 2 * args.reload_every:
        parser.error(f"{args.max_rounds} rounds make one life of --reload-every {args.reload_every}, and a verdict "
                     f"reads two or more: ask for --max-rounds {2 * args.reload_every} or a smaller --reload-every")
    args.models = MODELS + ((ENSEMBLE,) if args.ensemble else ())
    console = table_console()
    cells: list[Cell] = []
    try:
        for profile in args.profiles:
            for cell in run_profile(profile, args, console):
                cells.append(cell)
                if args.out:  # each cell kept as soon as measured: a run cut short (a lease's end) keeps them
                    write(args.out, cells, args.margin, header(args))
    except (PerfAnalyzerError, InferenceServerException, WorkloadError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    table = Table(title=f"auto against the better of plain and the forced pipeline (margin {args.margin:.0%})")
    for title in header(args):
        table.add_column(title, justify="left" if title in ("profile", "load") else "right")
    for line in (row(cell, args.margin) for cell in cells):
        table.add_row(*line)
    console.print(table)
    console.print(tally(cells, args.margin))
    return 0 if all(cell.verdict(args.margin) == "yes" for cell in cells) else 1


def tally(cells: list[Cell], margin: float) -> str:
    """How many cells are shown within the margin, shown outside it, and unresolved; and in how
    many of those with a clearly better way ``auto`` served as it."""
    counts = collections.Counter(cell.verdict(margin) for cell in cells)
    choices = collections.Counter(cell.choice(margin) for cell in cells)
    clear = choices["right"] + choices["wrong"] + choices["mixed"]
    return (f"{counts['yes']} of {len(cells)} cells within {margin:.0%} ({counts['NO']} outside, "
            f"{counts['unresolved']} unresolved at this host's noise); auto served as the clearly better way in "
            f"{choices['right']} of the {clear} cells with one ({choices['wrong']} wrong, {choices['mixed']} mixed)")


def write(out: Path, cells: list[Cell], margin: float, titles: tuple[str, ...]) -> None:
    """summary.md and check.csv of ``cells``, and windows.csv: every window's figure, so that
    a round far from the others (a stall) can be told from a cell's spread afterwards."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [row(cell, margin) for cell in cells]
    with (out / "check.csv").open("w", newline="") as f:
        csv.writer(f).writerows([titles, *rows])
    with (out / "windows.csv").open("w", newline="") as f:
        csv.writer(f).writerows([WINDOW_HEADER, *(line for cell in cells for line in cell.windows())])
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles),
             *("| " + " | ".join(line) + " |" for line in rows), "", f"{tally(cells, margin)}."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
