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
from tokenizers import Tokenizer

from backend.config import RuntimeConfig
from backend.engine import cpu_cores, load_engines
from backend.manifest import LatencyTable, Manifest
from backend.query import Query
from backend.runtime import Runtime
from tools.load.workload import glue_texts

MODEL = Path("model_repository_real/minilm/1")
TOKENIZER = Path.home() / ".cache/dvabatch/sources/minilm.tokenizer.json"


def rte_inputs() -> list[dict[str, np.ndarray]]:
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128)
    feeds = []
    for texts in glue_texts("RTE"):
        encoding = tokenizer.encode(*texts)
        feeds.append({name: np.array([getattr(encoding, field)], np.int64) for name, field in
                      (("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids"))})
    return feeds


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


def burst(runtime: Runtime, feeds: list[dict[str, np.ndarray]]) -> tuple[float, float]:
    """Seconds until the last answer, mean latency in seconds."""
    done, answered, lock = threading.Event(), [], threading.Lock()

    def respond(outputs, failure):
        with lock:
            answered.append(time.monotonic())
            if len(answered) == len(feeds):
                done.set()

    start = time.monotonic()
    runtime.submit([Query(dict(feed), respond, arrived=start) for feed in feeds])
    done.wait(120)
    return max(answered) - start, statistics.mean(t - start for t in answered)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    manifest = Manifest.load(MODEL)
    engine = load_engines(manifest, MODEL, threads=cpu_cores(), spinning=True, fused=True)
    feeds, rng = rte_inputs(), random.Random(0)
    bursts = [rng.sample(feeds, args.burst) for _ in range(args.repeats)]
    results: dict[str, list[tuple[float, float]]] = {"auto": [], "auto, lengths rounded up": [], "one at a time": []}
    for chosen in bursts:
        for name in results:
            if name == "one at a time":
                start, ends = time.monotonic(), []
                for feed in chosen:
                    engine[0].run(feed)
                    ends.append(time.monotonic() - start)
                results[name].append((ends[-1], statistics.mean(ends)))
                continue
            with rounded_up_predictions() if name != "auto" else nullcontext():
                runtime = Runtime(manifest, engine, RuntimeConfig.from_parameters({"policy": "auto"}))
                results[name].append(burst(runtime, chosen))
                runtime.close()
    for name, values in results.items():
        drains, means = zip(*values)
        print(f"{name:26s} burst of {args.burst}: drained in {statistics.median(drains) * 1000:7.1f} ms "
              f"(median of {args.repeats}; {min(drains) * 1000:.0f}-{max(drains) * 1000:.0f}), "
              f"mean latency {statistics.median(means) * 1000:6.1f} ms")


if __name__ == "__main__":
    main()
