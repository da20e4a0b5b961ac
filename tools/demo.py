"""The demo: serve the example repository through `dvabatch` and query it over gRPC.

    python -m tools.demo [--grpc-port P] [--http-port P] [--metrics-port P] [--keep-serving]

Starts a real tritonserver on localhost, sends concurrent requests of different batch sizes (and
sequence lengths) to every model, compares each answer with ONNX Runtime on the unsliced source
model, shows one bad request being refused, and stops the server (or keeps it serving).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from rich.table import Table
from tritonclient.utils import InferenceServerException

from backend.engines import OnnxRuntimeEngine
from backend.manifest import Manifest
from backend.sample import sample_inputs
from slicer.slicing import VERSION
from tools.lib.cli import table_console
from tools.lib.client import infer
from tools.lib.examples import EXAMPLES
from tools.lib.paths import CACHE, DEFAULT_REPOSITORY
from tools.lib.triton import Server

# (rows, size of every named dynamic axis) of each request sent to each model.
REQUESTS = ((1, 5), (3, 12), (2, 7), (8, 16))


def _preview(array: np.ndarray) -> str:
    values = ", ".join(f"{v:.4f}" for v in array.reshape(-1)[:3])
    return f"{list(array.shape)} [{values}, ...]"


def query_model(client: grpcclient.InferenceServerClient, example, repository: Path, table: Table) -> float:
    """Send REQUESTS concurrently; add a row per request; return the worst error against ORT."""
    manifest = Manifest.load(repository / example.name / VERSION)
    reference = OnnxRuntimeEngine(example.source, [o.name for o in manifest.outputs])
    feeds = [sample_inputs(manifest.inputs, rows, default=size, seed=i) for i, (rows, size) in enumerate(REQUESTS)]
    with ThreadPoolExecutor(len(feeds)) as pool:
        answers = list(pool.map(lambda feed: infer(client, example.name, feed), feeds))
    worst = 0.0
    for feed, answer in zip(feeds, answers):
        expected = reference.run(feed)
        error = max(float(np.abs(answer[name] - expected[name]).max()) for name in expected)
        worst = max(worst, error)
        first = manifest.outputs[0].name
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in feed.items())
        stages = f"{len(manifest.stages)}, balance {manifest.slicing.balance:.2f}" if manifest.slicing else \
            str(len(manifest.stages))
        table.add_row(example.name, stages, shapes, f"{first} {_preview(answer[first])}",
                      f"{error:.1e}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--keep-serving", action="store_true", help="leave Triton running until Ctrl-C")
    args = parser.parse_args(argv)
    console = table_console()
    log = CACHE / "demo-tritonserver.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    server = Server(grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port, log=log)
    console.print(f"Starting tritonserver with the dvabatch backend on {DEFAULT_REPOSITORY} (log: {log}) ...")
    try:
        server.start()
    except (RuntimeError, TimeoutError) as exc:
        console.print(f"[red]{exc}[/red]\n" + "".join(log.read_text().splitlines(keepends=True)[-20:]))
        return 1
    with server:
        console.print(f"Triton is serving on localhost: gRPC {server.grpc_url}, HTTP {server.host}:{server.http_port}, "
                      f"metrics http://{server.host}:{server.metrics_port}/metrics")
        table = Table(title="Answers from Triton over gRPC, checked against ONNX Runtime on the unsliced model")
        for column in ("model", "stages", "request inputs", "first output (shape, values)", "max |diff|"):
            table.add_column(column)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            worst = max(query_model(client, example, DEFAULT_REPOSITORY, table) for example in EXAMPLES)
            console.print(table)
            console.print(f"Largest difference from the unsliced models: {worst:.2g}")
            bad_requests = {
                "A float64 image": ("resnet_like", {"image": np.zeros((1, 3, 32, 32), dtype=np.float64)}),
                "Token ids and a mask of different lengths": (
                    "bert_like", {"input_ids": np.ones((1, 6), np.int64), "attention_mask": np.ones((1, 4), np.int64)}),
            }
            for what, (model, feed) in bad_requests.items():
                try:
                    infer(client, model, feed)
                except InferenceServerException as exc:
                    console.print(f"{what} is refused with: [yellow]{exc.message().strip()}[/yellow]")
        if args.keep_serving:
            console.print("Serving until Ctrl-C. Try: perf_analyzer -m resnet_like -i grpc "
                          f"-u {server.grpc_url} --concurrency-range 1:8")
            try:
                server.process.wait()
            except KeyboardInterrupt:
                pass
    console.print("Triton stopped.")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
