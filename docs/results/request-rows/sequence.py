"""``auto`` through a closed loop of 8 requests of 8 rows, then Poisson 924 requests/s of 8 rows
(TensorRT speed), then the plain model under the same Poisson load; 15 s each, one server.

    python docs/results/served-cost-lines/scan_patch.py   # scratch: every window logged
    DVABATCH_CLIENT_CPUS=0 python docs/results/request-rows/sequence.py /tmp/sequence.log
    git checkout backend/serving.py
"""

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tools.lib import perf_analyzer
from tools.lib.peers import write_ways
from tools.lib.triton import Server
from tools.lib.workload import ModelInterface, synthetic, write_input_data

folder = Path("/tmp/request-rows/sequence")
shutil.rmtree(folder, ignore_errors=True)
folder.mkdir(parents=True)
write_ways(Path("docs/profiles/bert_base_trt_a100_2stages.json"), folder)
for ensemble in folder.glob("ensemble*"):
    shutil.rmtree(ensemble)
poisson = ["--request-rate-range", "924", "--request-distribution", "poisson"]
with Server(model_repository=folder, log=Path(sys.argv[1])) as server:
    interface = ModelInterface.from_server(server.grpc_url, "auto")
    data = write_input_data(synthetic(interface, 1, {}, lengths=(128,), count=64), folder.parent / "sequence.json")
    for model, load in (("auto", ["--concurrency-range", "8"]), ("auto", poisson), ("plain", poisson)):
        done = subprocess.run([str(perf_analyzer.binary()), "-m", model, "-u", server.grpc_url, "-i", "grpc", "--async",
                               "--input-data", str(data), "-b", "8", *load, "-p", "15000", "-s", "100000", "-r", "3"],
                              capture_output=True, text=True, timeout=300)
        said = [line.strip() for line in done.stdout.splitlines() if "Throughput" in line or "Avg latency" in line]
        print(model, load[1], said[-2:], flush=True)
