"""A/A: copies of one way beside it, in one tritonserver, as tools.check_auto runs its rounds.

    PYTHONPATH=. python docs/results/check-trt-whole-batches/copies.py PROFILE LOAD ROUNDS WAY LOADORDER RUNORDER \
        [reversed]

LOAD: ``c16`` (16 in flight) or a Poisson rate. LOADORDER / RUNORDER: comma lists of WAY and its
copies (any other names, e.g. c1,c2), in the order loaded and the order of the first round; the
rounds rotate (``check_cell.in_turn``), or with ``reversed`` every other round runs reversed (the
order before the rotation). Prints each round's figures and each model's over the first's.
"""
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from tools.lib.check_cell import in_turn
from tools.lib.harness import Bench
from tools.lib.peers import write_variant, write_ways
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data


def main() -> None:
    profile, spec, rounds, way = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    load_order, run_order = sys.argv[5].split(","), sys.argv[6].split(",")
    load = Load(concurrency=int(spec[1:])) if spec.startswith("c") else Load(rate=float(spec))
    folder = Path(tempfile.mkdtemp(prefix="aa-"))
    repository = folder / "repository"
    write_ways(profile, repository)
    for name in set(load_order) - {way}:
        write_variant(repository / way, repository, name, {})
    data = write_input_data(synthetic(interface_of(repository / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
    got: dict[str, list[float]] = {m: [] for m in run_order}
    reverse = sys.argv[7:] == ["reversed"]
    with Bench(repository, log=folder / "tritonserver.log") as bench:
        for model in load_order:
            bench.load(model)
            bench.capacity(model, data, 64, 1.0)
        for r in range(rounds):
            for model in (run_order[::-1] if r % 2 else run_order) if reverse else in_turn(tuple(run_order), r):
                w = bench.window(model, load, data, 5, 4, batched_by_triton=[model] if way == "plain" else ()).window
                got[model].append(w.throughput if load.closed else w.mean_ms)
            print(r, {m: round(v[-1], 2) for m, v in got.items()}, flush=True)
    ref = run_order[0]
    for model, vals in got.items():
        ratios = [a / b for a, b in zip(vals, got[ref])]
        print(model, " ".join(f"{x:.1f}" for x in vals), f"mean {statistics.fmean(vals):.1f}",
              f"vs {ref} {statistics.geometric_mean(ratios):.3f}", " ".join(f"{x:.2f}" for x in ratios))
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
