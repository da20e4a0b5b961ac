"""Added latency of the multi-entry multi-exit runtime at batch window 0 (not a test).

    python -m tools.bench_overhead [--model resnet_like] [--stages 4] [--requests 300]
                                   [--concurrency 1] [--rows 1] [--rounds 3]

Serves, from one tritonserver, the same example model three ways:

- ``whole``: the unsliced ONNX model in a plain Python-backend model; Triton's dynamic batcher
  (delay 0) hands it batches and each runs to completion (single-entry single-exit);
- ``dva1``: the model as one stage through the ``dvabatch`` runtime (entry, one executor, exit);
- ``dvaN``: the model sliced into ``--stages`` stages through the runtime (pass policy, window 0).

Closed loop: ``--concurrency`` clients each send the next request when the last is answered.
The three models take turns in ``--rounds`` rounds, so all are measured side by side in one
run. Reports mean/p50/p99 latency and the added latency per query against ``whole``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
from rich.console import Console
from rich.table import Table

from backend.manifest import Manifest
from slicer.sample import sample_inputs
from slicer.slicing import VERSION, SliceOptions, slice_model
from tools.build_examples import CACHE, EXAMPLES
from tools.client import infer
from tools.serve import Server
from tools.synthetic import BUILDERS, save


def build_repository(model: str, stages: int, folder: Path) -> None:
    """``whole``, ``dva1`` and ``dva<stages>`` for ``model`` in the repository ``folder``."""
    source = save(BUILDERS[model](), CACHE / "sources" / f"{model}.onnx")
    max_batch = next(e.max_batch_size for e in EXAMPLES if e.name == model)
    for count in (1, stages):
        # The backend's defaults (pass policy, no batch window): the overhead of the runtime alone.
        slice_model(source, folder / f"dva{count}",
                    SliceOptions(stages=count, max_batch_size=max_batch, policy_defaults=False))
    whole = folder / "whole" / VERSION
    whole.mkdir(parents=True)
    shutil.copy(source, whole / "model.onnx")
    shutil.copy(Path(__file__).parent / "baseline" / "model.py", whole / "model.py")
    config = (folder / "dva1" / "config.pbtxt").read_text()
    (folder / "whole" / "config.pbtxt").write_text(
        config.replace('name: "dva1"', 'name: "whole"').replace('backend: "dvabatch"', 'backend: "python"')
        .replace("dynamic_batching { }", "dynamic_batching { max_queue_delay_microseconds: 0 }"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def closed_loop(url: str, model: str, feed, requests: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    left = [requests]

    def client_loop():
        with grpcclient.InferenceServerClient(url) as client:
            while True:
                with lock:
                    if left[0] == 0:
                        return
                    left[0] -= 1
                began = time.perf_counter()
                infer(client, model, feed)
                with lock:
                    latencies.append((time.perf_counter() - began) * 1000)

    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet_like", choices=sorted(BUILDERS))
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--requests", type=int, default=300, help="requests per model per round")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rows", type=int, default=1, help="rows per request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grpc-port", type=int, default=8101)
    args = parser.parse_args(argv)
    console = Console()
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-bench-"))
    try:
        build_repository(args.model, args.stages, folder)
        models = ["whole", "dva1", f"dva{args.stages}"]
        manifest = Manifest.load(folder / "dva1" / VERSION)
        feed = sample_inputs(manifest.inputs, args.rows, default=16, seed=0)
        results: dict[str, list[float]] = {m: [] for m in models}
        with Server(folder, grpc_port=args.grpc_port, http_port=args.grpc_port + 1,
                    metrics_port=args.grpc_port + 2, log=folder / "triton.log") as server:
            for model in models:  # warm up
                closed_loop(server.grpc_url, model, feed, 20, args.concurrency)
            for _ in range(args.rounds):
                for model in models:
                    results[model] += closed_loop(server.grpc_url, model, feed, args.requests, args.concurrency)
        table = Table(title=f"{args.model}, closed loop, concurrency {args.concurrency}, {args.rows} row(s)/request")
        for column in ("model", "requests", "mean ms", "p50 ms", "p99 ms", "added mean ms", "added p50 ms"):
            table.add_column(column, justify="right")
        base = results["whole"]
        for model in models:
            lat = results[model]
            table.add_row(model, str(len(lat)), f"{statistics.mean(lat):.3f}", f"{percentile(lat, 50):.3f}",
                          f"{percentile(lat, 99):.3f}", f"{statistics.mean(lat) - statistics.mean(base):+.3f}",
                          f"{percentile(lat, 50) - percentile(base, 50):+.3f}")
        console.print(table)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
