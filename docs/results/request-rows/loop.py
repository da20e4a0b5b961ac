"""One closed loop of requests of several rows each against each of the given ways, one server.

    ROOT=<checkout> LOG=<tritonserver log> DVABATCH_CLIENT_CPUS=0 \
        python docs/results/request-rows/loop.py PROFILE ROWS CONCURRENCY SECONDS plain,pipeline,auto

Serves the three ways of ``tools.lib.peers.write_ways`` from the checkout at ``$ROOT`` (its
backend and tools, so that an older commit's worktree runs as it was) and runs perf_analyzer
once per model (``-b ROWS``, one measurement window of SECONDS), printing its throughput (rows/s)
and mean latency. The model log (``$LOG``) holds each switch of ``auto``'s mode.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.environ["ROOT"])

from tools.lib import perf_analyzer
from tools.lib.peers import write_ways
from tools.lib.triton import Server
from tools.lib.workload import ModelInterface, synthetic, write_input_data

profile, rows, concurrency, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
folder = Path("/tmp/request-rows/repository")
shutil.rmtree(folder, ignore_errors=True)
folder.mkdir(parents=True)
write_ways(profile, folder)
for ensemble in folder.glob("ensemble*"):  # plain, pipeline and auto only
    shutil.rmtree(ensemble)
with Server(model_repository=folder, log=Path(os.environ["LOG"])) as server:
    interface = ModelInterface.from_server(server.grpc_url, "auto")
    data = write_input_data(synthetic(interface, 1, {}, lengths=(128,), count=64), folder.parent / "data.json")
    for model in sys.argv[5].split(","):
        done = subprocess.run([str(perf_analyzer.binary()), "-m", model, "-u", server.grpc_url, "-i", "grpc", "--async",
                               "--input-data", str(data), "-b", str(rows), "--concurrency-range", str(concurrency),
                               "-p", str(int(seconds * 1000)), "-s", "100000", "-r", "3",
                               "--warmup-request-count", str(4 * concurrency)],
                              capture_output=True, text=True, timeout=300)
        said = [line.strip() for line in done.stdout.splitlines() if "Throughput" in line or "Avg latency" in line]
        print(model, said[-2:], done.stderr[-300:] if done.returncode else "", flush=True)
