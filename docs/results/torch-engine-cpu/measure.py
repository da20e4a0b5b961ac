"""The torch engine's interpreter against ONNX Runtime on this CPU: largest difference and median
time per run, each model optimised as the torch target cuts it (ONNX Runtime ``basic``).

    .venv/bin/python docs/results/torch-engine-cpu/measure.py [SOURCE.onnx ...]

Default sources: the example models (``make examples``) and MiniLM when ``make models`` built it.
Runs alternate between the two engines, so a slow moment of the machine hits both.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from backend.device import CpuDevice
from backend.engines import OnnxRuntimeEngine, TorchEngine
from backend.host import cpus
from slicer.graph import input_specs
from backend.sample import sample_inputs
from slicer.targets import optimize
from tools.lib.paths import SOURCES

RUNS = 30


def main(paths: list[Path]) -> None:
    print("| model | batch (x length) | max abs difference | ONNX Runtime ms | torch ms | torch / ORT |")
    print("|---|---|---:|---:|---:|---:|")
    for src in paths:
        with tempfile.TemporaryDirectory() as scratch:
            graph = optimize(src, Path(scratch) / "basic.onnx", "basic")
            outputs = [o.name for o in graph.graph.output]
            ort = OnnxRuntimeEngine(Path(scratch) / "basic.onnx", outputs, cpus().threads)
            torch = TorchEngine(Path(scratch) / "basic.onnx", outputs, CpuDevice(), cpus().threads)
            specs = input_specs(graph)
            text = any("sequence" in spec.dims for spec in specs)
            for batch, length in ((1, 16), (8, 64)):
                feed = sample_inputs(specs, batch, {"sequence": length}, seed=batch)
                want, got = ort.run(feed), torch.run(feed)
                diff = max(float(np.abs(got[n].astype(np.float64) - want[n]).max()) for n in outputs)
                times: dict[str, list[float]] = {"ort": [], "torch": []}
                for _ in range(RUNS):
                    for name, engine in (("ort", ort), ("torch", torch)):
                        began = time.perf_counter()
                        engine.run(feed)
                        times[name].append((time.perf_counter() - began) * 1000)
                a, b = np.median(times["ort"]), np.median(times["torch"])
                shape = f"{batch} x {length}" if text else f"{batch}"
                print(f"| {src.stem} | {shape} | {diff:.1e} | {a:.2f} | {b:.2f} | {b / a:.2f}x |", flush=True)


if __name__ == "__main__":
    given = [Path(p) for p in sys.argv[1:]]
    main(given or sorted(p for p in SOURCES.glob("*.onnx") if p.stem in ("bert_like", "resnet_like", "unet_like",
                                                                        "minilm")))
