"""python -m tools.bench_versions: this checkout's backend against another's, side by side (not a test).

    python -m tools.bench_versions PROFILE.json --base DIR [--concurrency 1] [--rounds 8]
                                   [--seconds 3] [--warmup 2] [--length 64] [--out docs/results/RUN]

A change to the path a request takes through our stub moves its cost by a few microseconds,
while perf_analyzer's windows on a shared host move by 10-25 % from one run to the next: two
runs of ``tools.check_auto``, one before the change and one after, cannot tell them apart. Here
one tritonserver serves three models of the same timed profile (``tools.lib.peers.write_ways``):
``plain`` (the plain Python model), ``auto`` (this checkout's backend, as the slicer configures
it) and ``auto_base`` (the same model on the backend of ``--base``, another checkout, say a git
worktree of the commit before, loaded as a second backend, ``dvabatch_base``). Closed loops at
each ``--concurrency`` run the three in turn, every other round in the reverse order. Per model:
answers/s (the mean over the rounds) and Triton's ``compute_infer`` per request (the median over
the rounds: the time its instance spent in ``execute``, steadier than answers/s at one in
flight); per version, its answers/s over the plain model's, round by round, as a geometric mean
with a 95 % t interval over the rounds (``intervals.across_rounds``). Both versions run the
model directory this checkout writes, so ``--base`` must read the same manifest format.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import tempfile
from pathlib import Path

from rich.table import Table

from tools.lib.cli import numbers, table_console
from tools.lib.harness import Bench
from tools.lib.intervals import across_rounds
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load, measure
from tools.lib.workload import interface_of, synthetic, write_input_data

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


def compute_ns(bench: Bench, model: str) -> tuple[float, int]:
    """Triton's ``compute_infer`` nanoseconds and successful requests of ``model`` so far."""
    with bench.client() as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
    return float(stats["compute_infer"].get("ns", 0)), int(stats["success"].get("count", 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_versions", description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="a timed profile (docs/profiles/*.json) or a sliced model directory")
    parser.add_argument("--base", type=Path, required=True, help="the root of the other checkout")
    parser.add_argument("--concurrency", type=numbers(int), default="1")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per window (default 3)")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window (default 2)")
    parser.add_argument("--length", type=int, default=64, help="tokens per query (default 64)")
    parser.add_argument("--out", type=Path, help="write summary.md, rounds.csv and tritonserver.log here")
    args = parser.parse_args(argv)
    backend = (args.base / "backend").resolve()
    if not (backend / "model.py").is_file():
        parser.error(f"--base {args.base}: no backend/model.py there")
    folder = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    rows = []
    try:
        repository = folder / "repository"
        write_ways(args.profile, repository)
        write_base(repository)
        data = write_input_data(synthetic(interface_of(repository / "auto"), 1, {}, lengths=(args.length,)),
                                folder / "data.json")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        with Bench(repository, log=(args.out or folder) / "tritonserver.log") as bench:
            (bench.server.backends / "dvabatch_base").symlink_to(backend, target_is_directory=True)
            for model in MODELS:
                bench.load(model)
            for concurrency in args.concurrency:
                for round_ in range(args.rounds):
                    for model in MODELS if round_ % 2 == 0 else MODELS[::-1]:
                        ns, count = compute_ns(bench, model)
                        window = measure(model, bench.url, Load(concurrency=concurrency), data, args.seconds,
                                         args.warmup)
                        ns_after, count_after = compute_ns(bench, model)
                        rows.append({"concurrency": concurrency, "round": round_, "model": model,
                                     "answers_per_s": window.throughput,
                                     "compute_us": (ns_after - ns) / max(count_after - count, 1) / 1000})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report(args, rows)


def report(args: argparse.Namespace, rows: list[dict]) -> None:
    table = Table(title=f"{args.profile.stem}: this checkout against {args.base}, {args.rounds} rounds")
    for column in ("c", "model", "answers/s", "compute_infer µs/req (median)", "answers / plain [95 %]",
                   "each round"):
        table.add_column(column, justify="left" if column in ("model", "each round") else "right")
    lines = ["| c | model | answers/s | compute_infer µs/req | answers / plain [95 %] | each round |",
             "|---|---|---|---|---|---|"]
    for concurrency in args.concurrency:
        mine = {m: [r for r in rows if r["concurrency"] == concurrency and r["model"] == m] for m in MODELS}
        for model in MODELS:
            answers = statistics.fmean(r["answers_per_s"] for r in mine[model])
            compute = statistics.median(r["compute_us"] for r in mine[model])
            ratios = [r["answers_per_s"] / p["answers_per_s"] for r, p in zip(mine[model], mine["plain"])]
            versus = "" if model == "plain" else str(across_rounds(ratios, lower_is_better=False))
            each = "" if model == "plain" else " / ".join(f"{x:.2f}" for x in ratios)
            cells = (str(concurrency), model, f"{answers:.0f}", f"{compute:.0f}", versus, each)
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
