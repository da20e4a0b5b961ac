"""Added latency of the multi-entry multi-exit runtime at batch window 0 (not a test).

    python -m tools.bench_overhead [--model resnet_like] [--stages 4] [--seconds 5]
                                   [--concurrency 1] [--rows 1] [--rounds 3]

Serves, from one tritonserver, the same example model three ways:

- ``whole``: the unsliced model as ZeroBatch (``tools.baselines``): Triton's dynamic batcher (delay
  0) hands it batches and each runs to completion (single-entry single-exit);
- ``dva1``: the model as one stage through the ``dvabatch`` runtime (entry, one executor, exit);
- ``dvaN``: the model sliced into ``--stages`` stages through the runtime (pass policy, window 0).

Closed loop: ``--concurrency`` clients each send the next request when the last is answered.
The three models take turns in ``--rounds`` rounds, so all are measured side by side in one
run. Reports mean/p50/p99 latency and the added latency per query against ``whole``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from backend.manifest import Manifest
from slicer.sample import sample_inputs
from slicer.slicing import VERSION, SliceOptions, slice_model
from tools.baselines import write_baseline
from tools.bench import Bench
from tools.build_examples import CACHE, EXAMPLES
from tools.load.runner import Phase, fixed
from tools.load.stats import summarize
from tools.load.workload import Request
from tools.synthetic import BUILDERS, save


def build_repository(model: str, stages: int, folder: Path) -> None:
    """``whole``, ``dva1`` and ``dva<stages>`` for ``model`` in the repository ``folder``."""
    source = save(BUILDERS[model](), CACHE / "sources" / f"{model}.onnx")
    max_batch = next(e.max_batch_size for e in EXAMPLES if e.name == model)
    for count in (1, stages):
        # The backend's defaults (pass policy, no batch window): the overhead of the runtime alone.
        slice_model(source, folder / f"dva{count}",
                    SliceOptions(stages=count, max_batch_size=max_batch, policy_defaults=False))
    write_baseline(folder / "dva1", folder, "whole", delay_us=0, ragged=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet_like", choices=sorted(BUILDERS))
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5, help="seconds per model per round (default 5)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rows", type=int, default=1, help="rows per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    console = Console()
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-bench-"))
    try:
        build_repository(args.model, args.stages, folder)
        models = ["whole", "dva1", f"dva{args.stages}"]
        manifest = Manifest.load(folder / "dva1" / VERSION)
        requests = [Request(sample_inputs(manifest.inputs, args.rows, default=16, seed=0), args.rows)]
        records: dict[str, list] = {m: [] for m in models}
        with Bench(folder, log=folder / "triton.log") as bench:
            for model in models:
                bench.load(model)
                bench.run(model, requests, fixed([Phase(1.0, concurrency=args.concurrency)]))  # warm up
            for _ in range(args.rounds):
                for model in models:
                    run = bench.run(model, requests, fixed([Phase(args.seconds, concurrency=args.concurrency)]))
                    records[model] += run.records
        table = Table(title=f"{args.model}, closed loop, concurrency {args.concurrency}, {args.rows} row(s)/request")
        for column in ("model", "requests", "mean ms", "p50 ms", "p99 ms", "added mean ms", "added p50 ms"):
            table.add_column(column, justify="right")
        base = summarize(records["whole"], 0, float("inf"))
        for model in models:
            s = summarize(records[model], 0, float("inf"))
            table.add_row(model, str(s.ok), f"{s.mean_ms:.3f}", f"{s.percentiles_ms[50]:.3f}",
                          f"{s.percentiles_ms[99]:.3f}", f"{s.mean_ms - base.mean_ms:+.3f}",
                          f"{s.percentiles_ms[50] - base.percentiles_ms[50]:+.3f}")
        console.print(table)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
