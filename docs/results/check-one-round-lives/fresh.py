"""Answers/s in six successive 2 s windows right after a model loads, plain and ``auto`` in turn,
ROUNDS times (scratch for check-one-round-lives).

    DVABATCH_CLIENT_CPUS=0 PYTHONPATH=. python docs/results/check-one-round-lives/fresh.py PROFILE 16 ROUNDS
"""

import sys
import tempfile
from pathlib import Path

from tools.lib.harness import Bench
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data

folder = Path(tempfile.mkdtemp())
write_ways(Path(sys.argv[1]), folder)
data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
load = Load(concurrency=int(sys.argv[2]))
with Bench(folder, log=folder / "triton.log") as bench:
    for turn in range(int(sys.argv[3])):
        for model in ("plain", "auto") if turn % 2 else ("auto", "plain"):
            bench.load(model)
            figures = [bench.window(model, load, data, 2, 0.3).window.throughput for _ in range(6)]
            bench.unload(model)
            print(model, " ".join(f"{f:.0f}" for f in figures), flush=True)
