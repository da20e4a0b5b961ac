"""python -m tools.baselines: the plain model and the ensemble a Triton user would deploy instead.

    python -m tools.baselines MODEL_DIR [--delay-us 0] [--preferred 8,16] [--ragged] [--no-spinning]
        [--threads N] [--backend python|onnxruntime|tensorrt] [--source SRC.onnx] [--repository DIR]

Writes, beside the sliced model (or into ``--repository``):

- ``<name>_plain``: the unsliced source model as one plain model behind Triton's dynamic batcher;
- ``<name>_ensemble`` with ``<name>_ensemble_s0`` ...: the sliced model's stages, each its own plain
  model with its own dynamic batcher, wired by Triton's ensemble scheduler.

``--delay-us`` is the batcher's ``max_queue_delay_microseconds`` and ``--preferred`` its
``preferred_batch_size`` (the ensemble's first step's);
``--ragged`` lets the plain model batch queries of different lengths, padded to the longest.
The source is found by the sha256 the manifest records (``--source`` to point at it).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from slicer.errors import SliceError
from tools.lib.cli import numbers
from tools.lib.peers import BACKENDS, Peer, write_ensemble, write_plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.baselines", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a model directory written by python -m slicer")
    parser.add_argument("--source", type=Path, help="the unsliced ONNX model (default: found by its sha256)")
    parser.add_argument("--delay-us", type=int, default=0, help="the dynamic batcher's delay (default 0)")
    parser.add_argument("--preferred", type=numbers(int, empty=True), default="",
                        help="the dynamic batcher's preferred batch sizes, comma-separated (default none)")
    parser.add_argument("--ragged", action="store_true",
                        help="plain model: queries of different lengths share a batch, padded to the longest")
    parser.add_argument("--no-spinning", action="store_true", help="ONNX Runtime's idle threads sleep")
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime's intra-op threads (default: its own)")
    parser.add_argument("--backend", choices=BACKENDS, default="python",
                        help="Triton backend of the plain model and of each step (default python)")
    parser.add_argument("--repository", type=Path, help="where to write them (default: beside MODEL_DIR)")
    args = parser.parse_args(argv)
    repository = args.repository or args.model_dir.parent
    name = args.model_dir.name
    peer = Peer(args.delay_us, not args.no_spinning, args.ragged, args.backend, args.threads, preferred=args.preferred)
    try:
        if args.backend == "tensorrt":
            print("no plain model: a plain TensorRT model is the whole model as one engine "
                  "(python -m slicer SRC --stages 1 --target tensorrt)")
        else:
            plain = write_plain(args.model_dir, repository, f"{name}_plain", peer, args.source)
            print(f"wrote {plain}: the unsliced model behind Triton's batcher (delay {args.delay_us} us)")
        *steps, ensemble = write_ensemble(args.model_dir, repository, f"{name}_ensemble",
                                          replace(peer, ragged=False))
        print(f"wrote {ensemble}: an ensemble of {len(steps)} steps ({', '.join(s.name for s in steps)})")
    except (SliceError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
