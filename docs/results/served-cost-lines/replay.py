"""Serve models of a timed profile through one tritonserver and hold closed loops in turn,
keeping the server's log (each model's log lines: what it decided, and with scan_patch.py each
window's stub CPU a request).

    python docs/results/served-cost-lines/replay.py PROFILE.json 1:5,4:5,16:5,64:5 LOG [auto,pipeline]

The plan is concurrency:seconds steps; each model answers each step in turn.
"""

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tools.lib.harness import Bench
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load, measure
from tools.lib.workload import interface_of, synthetic, write_input_data


def main() -> None:
    profile, plan, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    models = sys.argv[4].split(",") if len(sys.argv) > 4 else ["auto"]
    folder = Path(tempfile.mkdtemp(prefix="replay-"))
    try:
        write_ways(profile, folder)
        data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
        with Bench(folder, log=log) as bench:
            for model in models:
                bench.load(model)
                bench.capacity(model, data, 64, 1.0)
            for step in plan.split(","):
                concurrency, seconds = step.split(":")
                for model in models:
                    window = measure(model, bench.url, Load(concurrency=int(concurrency)), data, float(seconds), 1)
                    print(model, concurrency, seconds, f"{window.throughput:.0f}/s", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
