"""python -m tools.bench_versions: this checkout's backend against another's, side by side (not a test).

    python -m tools.bench_versions PROFILE.json --base DIR [--concurrency 1] [--rates 800,...]
                                   [--bursts 800/3000] [--burst-seconds 2] [--rounds 8] [--reload-every 1]
                                   [--seconds 3] [--warmup 2] [--length 64,...]
                                   [--request-rows 1] [--parameter KEY=VALUE ...] [--out docs/results/RUN]

A change to the path a request takes through our stub moves its cost by a few microseconds,
while perf_analyzer's windows on a shared host move by 10-25 % from one run to the next: two
runs of ``tools.check_auto``, one before the change and one after, cannot tell them apart. Here
one tritonserver serves three models of the same timed profile (``tools.lib.peers.write_ways``):
``plain`` (the plain Python model), ``auto`` (this checkout's backend, as the slicer configures
it, ``--parameter`` on top) and ``auto_base`` (the same model on the backend of ``--base``,
another checkout, say a git worktree of the commit before, loaded as a second backend,
``dvabatch_base``). Each load (closed
loops at each ``--concurrency``, then Poisson loads at each of ``--rates`` requests/s, then loads
that alternate between two Poisson rates at each of ``--bursts LOW/HIGH`` requests/s, each held for
``--burst-seconds``, where ``auto`` carries what it learnt at one rate to the other) runs the
three in turn, each round starting one further along (``check_cell.in_turn``); with ``--request-rows`` each request
carries that many rows, as a client that batches its own. Per model: its figure (answers/s in a
closed loop, the mean latency under Poisson; the mean over the rounds), Triton's
``compute_infer`` per request (the time its instance spent in ``execute``) and the CPU its stub
process spent per answered request, read from /proc over each window (warm-up included): the
steadiest of the three, within a few per cent from round to round where the figures move by
10-25 % (both medians over the rounds); and for each version the share of its ``execute`` calls
in which a lone batch ran inline while it pipelined (``decide.LoneRuns``; the median over the
rounds, warm-up included). Per version, its figure over the plain model's, round by
round, as a geometric mean with a 95 % t interval over the models' lives: every
``--reload-every`` rounds each model is loaded afresh (``Bench.reload``), since a model's process
keeps a speed of its own while it lives (exact copies of one model, loaded once, read 0.90x and
0.92x it: docs/results/check-process-lives), and a life's rounds count once, as their geometric
mean (``check_cell.geometric_lives``; ``--reload-every 0``: loaded once, each round a life, as
before). Both versions run the model directory this checkout writes, so
``--base`` must read the same manifest format.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import tempfile
from pathlib import Path

from rich.table import Table

from backend.calibrate import process_cpu_s

from tools.lib.check_cell import geometric_lives, in_turn
from tools.lib.cli import (add_bursts_arguments, add_fill_argument, add_lengths_argument, add_parameter_argument,
                           add_reload_argument, add_request_rows_argument, numbers, served, table_console)
from tools.lib.harness import Bench
from tools.lib.intervals import across_rounds
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load, write_bursts
from tools.lib.triton import stubs_of
from tools.lib.workload import WorkloadError, interface_of, synthetic, write_input_data

MODELS = ("plain", "auto", "auto_base")


def write_base(repository: Path) -> None:
    """``auto_base``: a copy of ``auto`` served by the backend ``dvabatch_base``."""
    shutil.copytree(repository / "auto", repository / "auto_base", symlinks=True)
    config = repository / "auto_base" / "config.pbtxt"
    text = config.read_text()
    for old, new in (('name: "auto"', 'name: "auto_base"'), ('backend: "dvabatch"', 'backend: "dvabatch_base"')):
        if old not in text:
            raise ValueError(f"{config}: no {old!r} to replace")
        text = text.replace(old, new)
    config.write_text(text)


def spent(bench: Bench, model: str) -> tuple[float, int, float, dict[str, float]]:
    """Triton's ``compute_infer`` nanoseconds and successful requests of ``model`` so far, its
    stub's CPU seconds and its ``execute`` calls (``Measured.calls``; none for the plain model)."""
    with bench.client() as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    stub = next((pid for pid, name in stubs_of(bench.server.process.pid).items() if name == model), None)
    cpu = (process_cpu_s(stub) if stub is not None else None) or 0.0
    calls = {} if model == "plain" else bench.dvabatch_counts(model)[2]
    return float(stats["compute_infer"].get("ns", 0)), int(stats["success"].get("count", 0)), cpu, calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_versions", description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=served,
                        help="a timed profile (docs/profiles/*.json) or a sliced model directory")
    parser.add_argument("--base", type=Path, required=True, help="the root of the other checkout")
    parser.add_argument("--concurrency", type=numbers(int, empty=True), default="1",
                        help="closed-loop concurrencies (default 1; empty: none)")
    parser.add_argument("--rates", type=numbers(float, empty=True), default="",
                        help="Poisson loads, requests/s (default: none)")
    add_bursts_arguments(parser, "requests/s", "800/3000")
    parser.add_argument("--rounds", type=int, default=8)
    add_reload_argument(parser, "each version against the plain model")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window (default 3)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window (default 2)")
    add_lengths_argument(parser)
    add_fill_argument(parser)
    add_request_rows_argument(parser)
    add_parameter_argument(parser, "both versions' model", "policy=smdp")
    parser.add_argument("--out", type=Path, help="write summary.md, rounds.csv and tritonserver.log here")
    args = parser.parse_args(argv)
    if not args.concurrency and not args.rates and not args.bursts:
        parser.error("no load: give --concurrency, --rates or --bursts")
    backend = (args.base / "backend").resolve()
    if not (backend / "model.py").is_file():
        parser.error(f"--base {args.base}: no backend/model.py there")
    folder = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    rows, sent = [], loads(args, folder)
    try:
        repository = folder / "repository"
        write_ways(args.profile, repository, dict(args.parameter))
        write_base(repository)
        try:
            queries = synthetic(interface_of(repository / "auto"), 1, {}, lengths=args.length, fill=dict(args.fill))
        except WorkloadError as exc:
            parser.error(str(exc))
        data = write_input_data(queries, folder / "data.json")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        with Bench(repository, log=(args.out or folder) / "tritonserver.log") as bench:
            (bench.server.backends / "dvabatch_base").symlink_to(backend, target_is_directory=True)
            for model in MODELS:
                bench.load(model)
            for load in sent:
                for round_ in range(args.rounds):
                    life = round_ // args.reload_every if args.reload_every else round_
                    if args.reload_every and round_ and round_ % args.reload_every == 0:
                        bench.reload(in_turn(MODELS, life), load, data, args.warmup)
                    for model in in_turn(MODELS, round_):
                        ns, count, cpu, calls = spent(bench, model)
                        window = bench.measure(model, load, data, args.seconds, args.warmup)
                        ns_after, count_after, cpu_after, calls_after = spent(bench, model)
                        answered = max(count_after - count, 1)
                        executes = calls_after.get("executes", 0) - calls.get("executes", 0)
                        inline = calls_after.get("inline", 0) - calls.get("inline", 0)
                        rows.append({"load": load.label, "round": round_, "life": life, "model": model,
                                     "figure": window.throughput if load.closed else window.mean_ms,
                                     "compute_us": (ns_after - ns) / answered / 1000,
                                     "stub_us": (cpu_after - cpu) / answered * 1e6,
                                     "inline": inline / executes if executes else None})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(args, rows, sent)


def loads(args: argparse.Namespace, folder: Path) -> list[Load]:
    """The closed loops, the Poisson loads and the bursts (their intervals files written in
    ``folder``, each model sent the same arrivals), in that order."""
    bursts = [Load(intervals=write_bursts(folder / f"bursts-{low:g}-{high:g}.txt", (low, high), args.burst_seconds,
                                          args.warmup + args.seconds), rows=args.request_rows)
              for low, high in args.bursts]
    return ([Load(concurrency=c, rows=args.request_rows) for c in args.concurrency]
            + [Load(rate=r, rows=args.request_rows) for r in args.rates] + bursts)


def report(args: argparse.Namespace, rows: list[dict], sent: list[Load]) -> None:
    table = Table(title=f"{args.profile.stem}: this checkout against {args.base}, {args.rounds} rounds")
    header = ("load", "model", "answers/s or mean ms", "compute_infer µs/req", "stub CPU µs/req",
              "lone inline", "figure / plain [95 % over lives]", "each round")
    for column in header:
        table.add_column(column, justify="left" if column in ("load", "model", "each round") else "right")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for load in sent:
        mine = {m: [r for r in rows if r["load"] == load.label and r["model"] == m] for m in MODELS}
        for model in MODELS:
            figure = statistics.fmean(r["figure"] for r in mine[model])
            compute = statistics.median(r["compute_us"] for r in mine[model])
            stub = statistics.median(r["stub_us"] for r in mine[model])
            inline = [r["inline"] for r in mine[model] if r["inline"] is not None]
            ratios = [r["figure"] / p["figure"] for r, p in zip(mine[model], mine["plain"])]
            lives = geometric_lives(ratios, range(0, args.rounds, args.reload_every) if args.reload_every else None)
            versus = "" if model == "plain" else str(across_rounds(lives, lower_is_better=not load.closed))
            each = "" if model == "plain" else " / ".join(f"{x:.2f}" for x in ratios)
            cells = (load.label, model, f"{figure:.0f}" if load.closed else f"{figure:.2f} ms", f"{compute:.0f}",
                     f"{stub:.0f}", f"{statistics.median(inline):.0%}" if inline else "", versus, each)
            table.add_row(*cells)
            lines.append("| " + " | ".join(cells) + " |")
    table_console().print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.md").write_text("\n".join(lines) + "\n")
        with (args.out / "rounds.csv").open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
