"""Build the example model repository: generate source models, slice them into model_repository/.

    python -m tools.build_examples [--force] [--target torch --device cuda --precision fp16]

What is built and where: ``tools/lib/examples.py``. By default ONNX Runtime stages for CPU
instances; with ``--target torch --device cuda`` stages a GPU instance serves (what
docker-compose.yml's ``slicer`` service builds inside the serving image, with its torch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slicer.errors import SliceError
from slicer.slicing import SliceOptions
from slicer.targets import TARGETS
from tools.lib.examples import EXAMPLES, build
from tools.lib.paths import DEFAULT_REPOSITORY

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.build_examples", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="re-slice even when up to date")
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    parser.add_argument("--target", choices=TARGETS, default="onnxruntime")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="torch target: where")
    parser.add_argument("--precision", choices=("fp32", "tf32", "fp16"), default="fp32")
    args = parser.parse_args(argv)
    try:
        built = build(args.repository, args.force, SliceOptions(target=args.target, device=args.device,
                                                                precision=args.precision))
    except SliceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model repository {args.repository}: {len(built)} rebuilt, {len(EXAMPLES) - len(built)} up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
