"""python -m tools.engine_profile: a timed profile of an engine from two published figures.

    python -m tools.engine_profile NAME --one-ms 0.62 --full-ms 15.15 --full-rows 128
           [--at-length 128] [--stages 2] [--fixed-shares 4,1] [--row-shares 1,4]
           [--max-batch-size 64] [--lengths 16,32,64,128] [--out docs/profiles]

Where no GPU is at hand, an engine's speed is what its vendor publishes: demoBERT (TensorRT,
FP16, A100) runs BERT-base at 128 tokens in 0.62 ms for one query and 15.15 ms for 128. A
compiled engine's time is a fixed launch cost plus work proportional to the tokens it computes,
so two figures give the line ``fixed + per_row * rows * length / at_length``; the profile
tabulates it for every batch size up to ``--max-batch-size`` and each of ``--lengths``, cut into
``--stages`` stages (each with its share of the fixed cost: one engine launch split in parts),
with the whole model's own table beside them. Stages are equal unless ``--fixed-shares`` and
``--row-shares`` say how the fixed cost and the work a row divide among them: a stage heavy in
fixed cost gains from large batches, one heavy in work a row hardly does, which is the paper's
operator diversity (a CNN's late layers, where batching has saturated, beside its early ones).
Attention's quadratic term is left out: at 128 tokens and below BERT's time is dominated by its
linear layers.

``tools.simulate`` serves the profile (timed stages, the real runtime, a real tritonserver)
and ``tools.compare`` / ``tools.bench_cost`` measure it against the plain model and the ensemble.
``--one-ms 0 --full-ms 0`` writes a near-zero-compute profile: what is left is the serving cost.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tools.lib.cli import numbers
from tools.lib.profiles import profile

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("name")
    parser.add_argument("--one-ms", type=float, required=True, help="ms for one query at --at-length tokens")
    parser.add_argument("--full-ms", type=float, required=True, help="ms for --full-rows queries at --at-length")
    parser.add_argument("--full-rows", type=int, required=True)
    parser.add_argument("--at-length", type=int, default=128)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--fixed-shares", type=numbers(float), help="each stage's share of the fixed cost")
    parser.add_argument("--row-shares", type=numbers(float), help="each stage's share of the work a row")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--lengths", type=numbers(int), default="16,32,64,128")
    parser.add_argument("--source", default="", help="where the figures come from (kept in the profile)")
    parser.add_argument("--out", type=Path, default=Path("docs/profiles"))
    args = parser.parse_args(argv)
    try:
        data = profile(args.name, args.one_ms, args.full_ms, args.full_rows, args.at_length, args.stages,
                       args.max_batch_size, list(args.lengths), args.source,
                       args.fixed_shares and list(args.fixed_shares), args.row_shares and list(args.row_shares))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
