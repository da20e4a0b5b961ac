"""Load ``auto`` of a profile N times in one tritonserver, each after a second of the forced
pipeline at 16 in flight (as ``tools.check_auto --reload-every`` reloads), and print what each
load's calibration measured and decided, as the model's log says it.

    DVABATCH_CLIENT_CPUS=0 PYTHONPATH=. python docs/results/calibration-medians/loads.py PROFILE N

Each line: execute waits / returns, the share of the stub's interpreter at the engines'
capacity (%), the stub's us a batch and a request pipelined, a batch and a request plain.
"""
import re
import shutil
import sys
import tempfile
from pathlib import Path

from tools.lib.harness import Bench
from tools.lib.peers import write_ways
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data

DECIDED = re.compile(r'"auto: serves pipeline.*?execute (waits|returns).*?take (\d+)% .*?stub (\d+) us a batch '
                     r'\+ (\d+) a request pipelined.*?(\d+) \+ (\d+) plain')


def main() -> None:
    profile, loads = Path(sys.argv[1]), int(sys.argv[2])
    folder = Path(tempfile.mkdtemp(prefix="loads-"))
    write_ways(profile, folder)
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(64,)), folder / "data.json")
    log = folder / "tritonserver.log"
    with Bench(folder, log=log) as bench:
        bench.load("pipeline")
        for _ in range(loads):
            bench.warm("pipeline", Load(concurrency=16), data, 1.0)
            bench.load("auto")
            bench.unload("auto")
    for decided in DECIDED.finditer(log.read_text()):
        print(*decided.groups())
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
