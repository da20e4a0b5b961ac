"""Whether responses go missing under Poisson load: a gRPC client of our own, no perf_analyzer.

    DVABATCH_CLIENT_CPUS=0 python docs/results/served-plain-flat/lost_responses.py PROFILE.json RATE WINDOWS SECONDS

One tritonserver serves the plain model and ``auto`` of a timed profile (``write_ways``); each
window sends Poisson arrivals at RATE requests/s for SECONDS to each model in turn, one async
request each, and it counts the callbacks within 10 s of the last send (answered, failed, missing).
The profile's inputs are taken to be 64-token int64 text, as the main profiles' are.
"""

import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tools.lib.harness import Bench
from tools.lib.peers import Peer, write_ways
from tools.lib.workload import interface_of

MODELS = ("plain", "auto")


def window(client, model: str, inputs: list, rate: float, seconds: float) -> tuple[int, int, int]:
    answered, failed, lock = [0], [0], threading.Lock()

    def done(result, error) -> None:
        with lock:
            (failed if error else answered)[0] += 1

    sent, start = 0, time.monotonic()
    due = start
    while due - start < seconds:
        due += random.expovariate(rate)
        time.sleep(max(due - time.monotonic(), 0.0))
        client.async_infer(model, inputs, done)
        sent += 1
    waited = time.monotonic()
    while answered[0] + failed[0] < sent and time.monotonic() - waited < 10:
        time.sleep(0.05)
    return sent, answered[0], failed[0]


def main() -> None:
    profile, rate, windows, seconds = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    folder = Path(tempfile.mkdtemp(prefix="lost-"))
    write_ways(profile, folder, {}, [], Peer())
    inputs = []
    for spec in interface_of(folder / "auto").inputs:
        tensor = grpcclient.InferInput(spec.name, [1, 64], "INT64")
        tensor.set_data_from_numpy(np.ones((1, 64), np.int64))
        inputs.append(tensor)
    with Bench(folder) as bench:
        for model in MODELS:
            bench.load(model)
        client = grpcclient.InferenceServerClient(bench.url)
        for w in range(windows):
            for model in MODELS if w % 2 == 0 else MODELS[::-1]:
                sent, answered, failed = window(client, model, inputs, rate, seconds)
                print(w, model, "sent", sent, "answered", answered, "failed", failed,
                      "missing", sent - answered - failed, flush=True)


if __name__ == "__main__":
    main()
