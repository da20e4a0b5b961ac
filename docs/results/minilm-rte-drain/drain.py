"""How fast the fused MiniLM drains a burst of GLUE RTE queries in-process (no Triton), as
served by ``policy: auto`` now, by ``auto`` with its old predictions (lengths rounded up to the
tabulated ones, so Policy I padded queries of one tabulated length together), and one query
at a time (what Triton's batcher does with unpadded RTE queries, whose lengths rarely match).
Run from the repository root after ``make models``:

    .venv/bin/python docs/results/minilm-rte-drain/drain.py [--burst 40] [--repeats 5]
"""

import argparse
import random
import statistics
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from backend.config import RuntimeConfig
from backend.engines import load_engines
from backend.host import cpus
from backend.manifest import LatencyTable, Manifest
from backend.query import Query
from backend.runtime import Runtime
from tools.lib.workload import ModelInterface, glue

MODEL = Path("model_repository_real/minilm/1")
TOKENIZER = Path.home() / ".cache/dvabatch/sources/minilm.tokenizer.json"


def rte_inputs(manifest: Manifest) -> list[dict[str, np.ndarray]]:
    """Every RTE dev query as the load generator sends it: tokenized, unpadded."""
    interface = ModelInterface("minilm", manifest.max_batch_size, manifest.inputs,
                               tuple(t.name for t in manifest.outputs))
    return [request.inputs for request in glue(interface, "glue:RTE", TOKENIZER)]


@contextmanager
def rounded_up_predictions():
    """The predictions before they read between lengths: the tabulated length at or above."""
    now = LatencyTable.predict

    def rounded(self, batch, length=None, statistic="mean"):
        if self.lengths is not None and length is not None and length <= self.lengths[-1]:
            length = next(n for n in self.lengths if n >= length)
        return now(self, batch, length, statistic)

    LatencyTable.predict = rounded
    try:
        yield
    finally:
        LatencyTable.predict = now


def through_runtime(manifest: Manifest, engines: list, feeds: list[dict[str, np.ndarray]],
                    rounded: bool) -> tuple[float, float]:
    """Seconds until the last answer and mean latency, the burst submitted at once to ``auto``."""
    done, answered, lock = threading.Event(), [], threading.Lock()

    def respond(outputs, failure):
        with lock:
            answered.append(time.monotonic())
            if len(answered) == len(feeds):
                done.set()

    with rounded_up_predictions() if rounded else nullcontext():
        runtime = Runtime(manifest, engines, RuntimeConfig.from_parameters({"policy": "auto"}))
        start = time.monotonic()
        runtime.submit([Query(dict(feed), respond, arrived=start) for feed in feeds])
        done.wait(120)
        runtime.close()
    return max(answered) - start, statistics.mean(t - start for t in answered)


def one_at_a_time(engines: list, feeds: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    start, ends = time.monotonic(), []
    for feed in feeds:
        engines[0].run(feed)
        ends.append(time.monotonic() - start)
    return ends[-1], statistics.mean(ends)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    manifest = Manifest.load(MODEL)
    engines = load_engines(manifest, MODEL, threads=cpus().threads, spinning=True, fused=True)
    feeds, rng = rte_inputs(manifest), random.Random(0)
    bursts = [rng.sample(feeds, args.burst) for _ in range(args.repeats)]
    modes = {"auto": lambda chosen: through_runtime(manifest, engines, chosen, rounded=False),
             "auto, lengths rounded up": lambda chosen: through_runtime(manifest, engines, chosen, rounded=True),
             "one at a time": lambda chosen: one_at_a_time(engines, chosen)}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for chosen in bursts:  # the modes take turns on each burst
        for name, mode in modes.items():
            results[name].append(mode(chosen))
    for name, values in results.items():
        drains, means = zip(*values)
        print(f"{name:26s} burst of {args.burst}: drained in {statistics.median(drains) * 1000:7.1f} ms "
              f"(median of {args.repeats}; {min(drains) * 1000:.0f}-{max(drains) * 1000:.0f}), "
              f"mean latency {statistics.median(means) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
