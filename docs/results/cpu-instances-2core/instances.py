"""Answers/s of one sliced model as one CPU instance, two instances, and two instances with one
ONNX Runtime thread a session set by hand (``intra_op_thread_count: 1``), side by side in one
tritonserver, closed loops, two rounds.

    python docs/results/cpu-instances-2core/instances.py MODEL_DIR [CONCURRENCIES, default 1,8]
"""
import re
import sys
import tempfile
from pathlib import Path

from tools.lib.harness import Bench
from tools.lib.peers import write_variant
from tools.lib.perf_analyzer import Load
from tools.lib.workload import interface_of, synthetic, write_input_data

WAYS = {"one": (1, {}), "two": (2, {}), "two_1thread": (2, {"intra_op_thread_count": "1"})}


def main(source: Path, concurrencies: list[int]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-instances-"))
    for name, (count, overrides) in WAYS.items():
        config = write_variant(source, folder, name, overrides) / "config.pbtxt"
        config.write_text(re.sub(r"count: \d+", f"count: {count}", config.read_text()))
    data = write_input_data(synthetic(interface_of(folder / "one"), 1, {}, lengths=(64,)), folder / "data.json")
    with Bench(folder, log=folder / "triton.log") as bench:
        for name in WAYS:
            bench.load(name)
            bench.capacity(name, data, max(concurrencies), 1.0)  # warm up
        found: dict[tuple[int, str], list[float]] = {}
        for _ in range(2):
            for concurrency in concurrencies:
                for name in WAYS:
                    window = bench.window(name, Load(concurrency=concurrency), data, 3, 1).window
                    found.setdefault((concurrency, name), []).append(window.throughput)
    for (concurrency, name), values in found.items():
        print(concurrency, name, [round(v) for v in values])
    print("server log:", folder / "triton.log")


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "1,8").split(",")])
