"""The runtime alone, in this process (no Triton, no gRPC): GLUE RTE queries through a simulated
model's timed stages, in a closed loop of C clients and at Poisson loads, printing answers/s,
mean and p99 latency and the rows and length of the batches stage 0 ran. It isolates what the
policies decide from what serving costs (``tools.compare`` and ``tools.bench_cost`` measure
both, through Triton).

    PYTHONPATH=. .venv/bin/python docs/results/slow-rte-in-process/emulate.py sim_repository/slow_2stages \\
        --tokenizer ~/.cache/dvabatch/sources/minilm.tokenizer.json --closed 16,64 --rates 200,450,700,900
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path

import numpy as np

from backend.config import RuntimeConfig, make_policy
from backend.device import make_device
from backend.engines import TimedEngine, load_engines
from backend.manifest import Manifest
from backend.query import Query
from backend.runtime import Runtime
from tools.lib.workload import glue, interface_of


class Served:
    """A runtime on the model's timed stages, noting each batch stage 0 runs."""

    def __init__(self, model_dir: Path, policy: str):
        version = model_dir / "1"
        manifest = Manifest.load(version)
        device = make_device("CPU")
        engines = load_engines(manifest, version, device)
        self.batches: list[tuple[int, int]] = []
        first = engines[0]
        assert isinstance(first, TimedEngine), "a simulated model (python -m tools.simulate) is expected"
        run = first.run

        def noted(inputs):
            tensor = next(iter(inputs.values()))
            self.batches.append((tensor.shape[0], tensor.shape[1] if tensor.ndim > 1 else 0))
            return run(inputs)
        first.run = noted
        self.runtime = Runtime(manifest, engines, RuntimeConfig(policy=make_policy(policy, {})), device)

    def close(self) -> str:
        self.runtime.close()
        rows = np.mean([r for r, _ in self.batches])
        length = np.mean([n for _, n in self.batches])
        return f"stage 0 ran {len(self.batches)} batches of {rows:.1f} rows, {length:.0f} tokens on average"


def closed(served: Served, feeds: list, clients: int, seconds: float) -> str:
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < stop:
            done = threading.Event()
            sent = time.monotonic()
            served.runtime.submit([Query(rng.choice(feeds), lambda outputs, failure: done.set())])
            done.wait()
            latencies.append(time.monotonic() - sent)

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = len(latencies) / (time.monotonic() - began)
    return f"closed loop of {clients}: {rate:.0f} answers/s, {_latency(latencies)}"


def poisson(served: Served, feeds: list, rate: float, seconds: float) -> str:
    rng, latencies, answered = random.Random(1), [], threading.Condition()
    sent = 0
    at = time.monotonic()
    end = at + seconds
    while at < end:
        at += rng.expovariate(rate)
        time.sleep(max(0.0, at - time.monotonic()))

        def note(outputs, failure, since=time.monotonic()):
            with answered:
                latencies.append(time.monotonic() - since)
                answered.notify_all()
        served.runtime.submit([Query(rng.choice(feeds), note)])
        sent += 1
    with answered:
        answered.wait_for(lambda: len(latencies) >= sent, 60)
    return f"Poisson {rate:.0f}/s: {len(latencies)}/{sent} answered, {_latency(latencies)}"


def _latency(latencies: list[float]) -> str:
    return f"mean {np.mean(latencies) * 1000:.1f} ms, p99 {np.percentile(latencies, 99) * 1000:.1f} ms"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--dataset", default="glue:RTE")
    p.add_argument("--policy", default="auto")
    p.add_argument("--closed", default="16,64")
    p.add_argument("--rates", default="200,450,700,900")
    p.add_argument("--seconds", type=float, default=8)
    args = p.parse_args()
    feeds = [r.inputs for r in glue(interface_of(args.model_dir), args.dataset, args.tokenizer)]
    runs = [(closed, int(c)) for c in args.closed.split(",") if c]
    runs += [(poisson, float(r)) for r in args.rates.split(",") if r]
    for measure, level in runs:
        served = Served(args.model_dir, args.policy)
        line = measure(served, feeds, level, args.seconds)
        print(f"{line}; {served.close()}", flush=True)


if __name__ == "__main__":
    main()
