"""Run a tools command with every tritonserver it starts (and the stubs it spawns) in a cgroup v1
CPU quota, the client (perf_analyzer) outside it, as a container's --cpus limits Triton alone.

    python in_cgroup.py CGROUP_DIR tools.check_auto ARGS...
"""
import runpy
import sys
from pathlib import Path

from tools.lib import triton

cgroup = Path(sys.argv[1])
start = triton.Server.start


def start_in_cgroup(self, *args, **kwargs):
    started = start(self, *args, **kwargs)  # models load later (explicit control): their stubs inherit it
    (cgroup / "cgroup.procs").write_text(str(self.process.pid))
    return started


triton.Server.start = start_in_cgroup
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__")
