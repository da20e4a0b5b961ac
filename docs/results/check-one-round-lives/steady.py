"""Each stub's CPU by thread (``threads.py`` beside it) while plain and ``auto`` serve one load in
turn, 14 s windows in three rounds, each model loaded once (scratch for check-one-round-lives).

    DVABATCH_CLIENT_CPUS=0 PYTHONPATH=. python docs/results/check-one-round-lives/steady.py PROFILE 16
"""

import subprocess
import sys
import tempfile
import time
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
    for model in ("plain", "auto"):
        bench.load(model)
    for turn in range(3):
        for model in ("plain", "auto") if turn % 2 else ("auto", "plain"):
            sampler = subprocess.Popen([sys.executable, str(Path(__file__).with_name("threads.py")), "16"],
                                       stdout=subprocess.PIPE, text=True)
            time.sleep(0.3)
            window = bench.window(model, load, data, 14, 1).window
            print(model, f"{window.throughput:.0f}/s |", sampler.communicate()[0].replace("\n", " | "), flush=True)
