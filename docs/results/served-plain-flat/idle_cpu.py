"""The CPU an idle model's stub spends: each stub's threads over 10 s, once a short load has ended.

    DVABATCH_CLIENT_CPUS=0 python docs/results/served-plain-flat/idle_cpu.py PROFILE.json plain,auto,pipeline

One tritonserver serves the named ways of a timed profile (``write_ways``); each runs a closed
loop of 4 for 2 s, then the server idles 3 s, and each stub's CPU over the next 10 s is read from
``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds a thread ran), per thread and in all.
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tools.lib.harness import Bench
from tools.lib.peers import Peer, write_ways
from tools.lib.triton import stubs_of
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data

def cpu_ns(pid: int) -> dict[str, int]:
    return {task.name: int((task / "schedstat").read_text().split()[0]) for task in Path(f"/proc/{pid}/task").iterdir()}


def main() -> None:
    profile, models = Path(sys.argv[1]), sys.argv[2].split(",")
    folder = Path(tempfile.mkdtemp(prefix="idle-"))
    write_ways(profile, folder, {}, [], Peer())
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=[64]), folder / "data.json")
    with Bench(folder) as bench:
        for model in models:
            bench.load(model)
            bench.measure(model, Load(concurrency=4), data, 2.0, 1.0)
        time.sleep(3)
        found = stubs_of(bench.server.process.pid)
        before = {pid: cpu_ns(pid) for pid in found}
        time.sleep(10)
        for pid, model in found.items():
            after = cpu_ns(pid)
            spent = {tid: ns - before[pid].get(tid, 0) for tid, ns in after.items()}
            busy = {tid: round(ns / 1e6, 1) for tid, ns in spent.items() if ns > 1e5}
            print(f"{model}: {sum(spent.values()) / 1e8:.3f} % of a core idle; "
                  f"threads (ms in 10 s): {busy}")


if __name__ == "__main__":
    main()
