"""Added latency of the multi-entry multi-exit runtime at batch window 0 (not a test).

    python -m tools.bench_overhead [--model resnet_like] [--stages 4] [--seconds 5]
                                   [--concurrency 1] [--rounds 3]

Serves, from one tritonserver, the same example model three ways:

- ``plain``: the unsliced model as a plain Python-backend model (``tools.baselines``): Triton's
  dynamic batcher (delay 0) hands it batches and each runs to completion (single-entry single-exit);
- ``dva1``: the model as one stage through the ``dvabatch`` runtime (entry, one executor, exit);
- ``dvaN``: the model sliced into ``--stages`` stages through the runtime (pass policy, window 0).

Closed loop (perf_analyzer): ``--concurrency`` requests in flight. The three models take turns in
``--rounds`` rounds, so all are measured side by side in one run. Reports mean/p50/p99 latency,
the added latency per query against ``plain``, and the ratio of means with its 95 % interval.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from slicer.slicing import SliceOptions, slice_model
from tools.baselines import write_plain
from tools.bench import Bench
from tools.build_examples import CACHE, EXAMPLES
from tools.input_data import interface_of
from tools.intervals import pooled, ratio
from tools.perf_analyzer import Load, Window
from tools.synthetic import BUILDERS, save
from tools.workload import synthetic, write_input_data


def build_repository(model: str, stages: int, folder: Path) -> None:
    """``plain``, ``dva1`` and ``dva<stages>`` for ``model`` in the repository ``folder``."""
    source = save(BUILDERS[model](), CACHE / "sources" / f"{model}.onnx")
    max_batch = next(e.max_batch_size for e in EXAMPLES if e.name == model)
    for count in (1, stages):
        # The backend's defaults (pass policy, no batch window): the overhead of the runtime alone.
        slice_model(source, folder / f"dva{count}",
                    SliceOptions(stages=count, max_batch_size=max_batch, policy_defaults=False))
    write_plain(folder / "dva1", folder, "plain", source=source)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet_like", choices=sorted(BUILDERS))
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5, help="seconds per model per round (default 5)")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    console = Console()
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-bench-"))
    try:
        repository = folder / "repository"
        build_repository(args.model, args.stages, repository)
        models = ["plain", "dva1", f"dva{args.stages}"]
        queries = synthetic(interface_of(repository / "dva1"), 1, {}, lengths=(16,))
        data = write_input_data(queries, folder / "data.json")
        windows: dict[str, list[Window]] = {m: [] for m in models}
        load = Load(concurrency=args.concurrency)
        with Bench(repository, log=folder / "triton.log") as bench:
            for model in models:
                bench.load(model)
                bench.capacity(model, data, args.concurrency, 1.0)  # warm up
            for _ in range(args.rounds):
                for model in models:
                    batched = (model,) if model == "plain" else ()
                    windows[model].append(bench.window(model, load, data, args.seconds, 1.0, batched).window)
        table = Table(title=f"{args.model}, closed loop, concurrency {args.concurrency} (perf_analyzer)")
        for column in ("model", "requests", "mean ms", "p50 ms", "p99 ms", "added mean ms", "mean vs plain"):
            table.add_column(column, justify="right")
        base = pooled(windows["plain"], "mean")
        for model in models:
            latency = np.concatenate([w.latency_ms for w in windows[model]])
            mean = pooled(windows[model], "mean")
            table.add_row(model, str(len(latency)), f"{mean:.3f}", f"{np.percentile(latency, 50):.3f}",
                          f"{np.percentile(latency, 99):.3f}", f"{mean - base:+.3f}",
                          str(ratio(windows[model], windows["plain"], "mean")) if model != "plain" else "")
        console.print(table)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
