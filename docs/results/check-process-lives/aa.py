"""A/A: exact copies of the forced pipeline beside it in one tritonserver, loaded once or loaded
afresh every few rounds (``Bench.reload``, as ``tools.check_auto --reload-every``), each round rotated as the check's.

    DVABATCH_CLIENT_CPUS=0 PYTHONPATH=. python docs/results/check-process-lives/aa.py PROFILE \
        [--copies a1,zz] [--rounds 20] [--reload-every 0] [--seconds 2] [--warmup 1.5]

A copy may change its config.pbtxt parameters: ``--copies vwait=policy:auto+execute_waits:true``.

Prints each round's answers/s (16 in flight) and each copy over the pipeline: by rounds, and
where reloaded, by lives (``check_cell.Cell.by_life``'s reading).
"""
import argparse
import shutil
import tempfile
from pathlib import Path

from tools.lib.check_cell import Cell, in_turn
from tools.lib.harness import Bench
from tools.lib.intervals import across_rounds
from tools.lib.peers import write_variant, write_ways
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile", type=Path)
    parser.add_argument("--copies", default="a1,zz")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reload-every", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="aa-"))
    write_ways(args.profile, folder)
    copies = []
    for spec in args.copies.split(","):  # NAME, or NAME=KEY:VALUE+KEY:VALUE (config.pbtxt parameters changed)
        name, _, changed = spec.partition("=")
        write_variant(folder / "pipeline", folder, name, dict(kv.split(":") for kv in changed.split("+") if kv))
        copies.append(name)
    models = ("pipeline", *copies)
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
    load = Load(concurrency=16)
    cell = Cell(args.profile.stem, load.label, True, {m: [] for m in models}, lives=[0] if args.reload_every else None)
    with Bench(folder, log=folder / "tritonserver.log") as bench:
        for model in models:
            bench.load(model)
            bench.capacity(model, data, 64, 1.0)
        for turn in range(args.rounds):
            if cell.lives is not None and turn and turn % args.reload_every == 0:
                bench.reload(in_turn(models, len(cell.lives)), load, data, args.warmup)
                cell.lives.append(turn)
            for model in in_turn(models, turn):
                cell.rounds[model].append(bench.window(model, load, data, args.seconds, args.warmup).window)
            print(turn, len(cell.lives or [0]) - 1, {m: round(v[-1].throughput) for m, v in cell.rounds.items()},
                  flush=True)
    for name in copies:
        line = f"{name} / pipeline: by rounds {across_rounds(cell.paired('pipeline', name), False)}"
        if cell.lives is not None:
            line += f"; by lives {across_rounds(cell.by_life('pipeline', name), False)} over {len(cell.lives)}"
        print(line + f" ({args.rounds} rounds)", flush=True)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
