"""python -m slicer SRC.onnx --stages N --out DIR [--max-batch-size B] [--dim NAME=SIZE ...]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from slicer.graph import SliceError
from slicer.slicing import slice_model


def _dim(text: str) -> tuple[str, int]:
    name, _, size = text.partition("=")
    if not name or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME=SIZE with SIZE >= 1, got {text!r}")
    return name, int(size)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slicer",
        description="Cut an ONNX model into stages and write a Triton model directory for the dvabatch backend.",
    )
    parser.add_argument("src", type=Path, help="the source ONNX model (first axis of every input dynamic)")
    parser.add_argument("--stages", type=int, required=True, help="number of stages")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write; its name is the model name")
    parser.add_argument("--max-batch-size", type=int, default=8, help="Triton max_batch_size (default 8)")
    parser.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=SIZE",
                        help="size of a named dynamic axis for probing and verifying (default 8)")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest absolute difference allowed between stages and source (default 1e-4)")
    args = parser.parse_args(argv)
    console = Console()
    began = time.perf_counter()
    try:
        result = slice_model(args.src, args.out, args.stages, args.max_batch_size, dict(args.dim), args.tolerance)
    except (SliceError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    table = Table(title=f"{args.out.name}: {len(result.manifest.stages)} stages of {args.src.name}")
    for column in ("stage", "nodes", "inputs", "outputs", "carried"):
        table.add_column(column, overflow="fold")
    for stage in result.manifest.stages:
        table.add_row(str(stage.index), str(stage.nodes), ", ".join(t.name for t in stage.inputs),
                      ", ".join(t.name for t in stage.outputs), ", ".join(stage.carry) or "-")
    console.print(table)
    console.print(f"max abs error against the source model: {result.max_abs_error:.3g}")
    console.print(f"wrote {result.model_dir} in {time.perf_counter() - began:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
