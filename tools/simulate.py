"""python -m tools.simulate: serve a model whose stages take another machine's times.

    python -m tools.simulate SOURCE --out REPOSITORY [--name NAME]

``SOURCE`` is a model directory written by the slicer (its latency tables are this machine's)
or a JSON profile with the tables of another machine, for example a GPU::

    {"name": "minilm_h100", "max_batch_size": 8,
     "inputs": [{"name": "input_ids", "dtype": "int64", "dims": ["sequence"]}, ...],
     "stages": [{"latency": {"batch_sizes": [1, 2, 4, 8], "axis": "sequence", "lengths": [16, 128],
                             "mean": [[...], [...]]}}, ...],
     "whole": {"latency": {...}},             # optional: the unsliced model's own table
     "parameters": {"policy": "pass"}}        # optional: config.pbtxt parameters (default: policy auto)

It writes ``REPOSITORY/NAME``: the same interface and stages, each stage ``"engine": "timed"``
(it computes nothing, passes the inputs through and takes its table's time), served by the real
runtime in a real tritonserver. The baselines of ``tools.compare`` and ``tools.baselines`` for it
are one timed stage with the whole model's table (``whole``, else the sum of the stage tables),
kept in the cache like every one-stage baseline; where the runtime serves the stages fused it
takes the same table, so neither side gains what the profile's tables disagree on. Every tool
then runs on it as on a real model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from backend.manifest import Manifest
from slicer.slicing import VERSION
from slicer.triton_config import parameters_of
from tools.lib.timed import from_profile, timed_whole, write_timed

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.simulate", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a sliced model directory or a JSON profile")
    parser.add_argument("--out", type=Path, required=True, help="the model repository to write into")
    parser.add_argument("--name", help="model name (default: the source's name with _sim)")
    args = parser.parse_args(argv)
    try:
        if args.source.is_dir():
            sliced = Manifest.load(args.source / VERSION)
            name = args.name or f"{args.source.name}_sim"
            tables = [s.latency for s in sliced.stages]
            if any(t is None for t in tables):
                raise ValueError(f"{args.source}: every stage needs a latency table")
            whole, parameters = sliced.whole, parameters_of((args.source / "config.pbtxt").read_text())
            source = (f"{args.source.name}-tables.json",
                      hashlib.sha256(json.dumps([str(t) for t in tables]).encode()).hexdigest())
            inputs, max_bs = sliced.inputs, sliced.max_batch_size
        else:
            name, profiled, parameters = from_profile(args.source)
            name, whole = args.name or name, profiled.whole
            tables = [s.latency for s in profiled.stages]
            source, inputs, max_bs = (profiled.source_file, profiled.source_sha256), profiled.inputs, \
                profiled.max_batch_size
        manifest = write_timed(name, inputs, tables, max_bs, *source, args.out / name, parameters, whole)
        whole_dir = timed_whole(manifest)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / name} ({len(tables)} timed stages; whole model for the peers in {whole_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
