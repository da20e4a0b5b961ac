"""perf_analyzer's own concurrency sweep (``--concurrency-range``: one run, no pause between its
levels, its default stability rule) on the plain model, the forced pipeline and ``auto``.

    python docs/results/perf-analyzer-sweeps/sweep.py PROFILE.json RANGE ROUNDS MODELS OUT
    (PROTO="-i http" for perf_analyzer's synchronous HTTP client; default "-i grpc --async")
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tools.lib.harness import Bench
from tools.lib.peers import Peer, write_ways
from tools.lib.perf_analyzer import binary, transport
from tools.lib.workload import interface_of, synthetic, write_input_data

PARTS = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
         "Server Compute Output", "Client Recv")


def main(profile: Path, sweep: str, rounds: int, models: list[str], out: Path) -> None:
    proto = os.environ.get("PROTO", "-i grpc --async").split()
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="sweep-"))
    write_ways(profile, folder, {}, [], Peer(ragged=False))
    data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=[64]), folder / "data.json")
    client = ["taskset", "-c", "0"] if os.environ.get("DVABATCH_CLIENT_CPUS") == "0" else []
    rows = []
    with Bench(folder, log=out / "triton.log") as bench:
        for model in models:
            bench.load(model)
        http = "http" in proto
        url = f"{bench.server.host}:{bench.server.http_port}" if http else bench.url
        for turn in range(rounds):
            for model in models if turn % 2 == 0 else models[::-1]:
                report = folder / f"{model}-{turn}.csv"
                command = [str(binary()), "-m", model, "-u", url, *proto, "--input-data", str(data),
                           "--concurrency-range", sweep, "-p", "3000", "-f", str(report),
                           *(() if http else transport(model, bench.url, str(data)))]
                done = subprocess.run(client + command, capture_output=True, text=True, timeout=900)
                if done.returncode:
                    print(model, done.stdout[-2000:], done.stderr[-2000:])
                    continue
                for line in csv.DictReader(report.read_text().splitlines()):
                    mean_ms = sum(float(line[k]) for k in PARTS if k in line) / 1000
                    rows.append((turn, model, int(line["Concurrency"]), float(line["Inferences/Second"]), mean_ms))
                    print(turn, model, line["Concurrency"], line["Inferences/Second"], flush=True)
                if model != "plain":
                    print(model, "served", bench.dvabatch_counts(model)[1], flush=True)
    with open(out / "sweep.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["round", "model", "concurrency", "answers/s", "mean ms"])
        writer.writerows(rows)
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","), Path(sys.argv[5]))
