"""python -m tools.gpu_bundle [OUT.tar.xz] [--python 3.12] [--no-project]: what a GPU host without network needs.

One archive under 64 MiB (what travels to a lent GPU machine) holding, under ``dvabatch-gpu/``:

- ``triton/``: tritonserver 2.51 and its Python backend from the ``nvidia-pytriton`` wheel, the
  backend stub built for ``--python`` (the host's), and in ``lib/`` exactly the shared libraries
  they load (the wheel's 115 MB of libraries, less those nothing needs);
- ``perf_analyzer/``: perf_analyzer 2.51.0 with libcudart 12 and libb64, as ``make setup``
  installs it;
- ``wheels/``: numpy 1.26 (the stubs pass tensors wrong under numpy 2), python-rapidjson,
  tritonclient and protobuf, for ``--python``; everything else (torch with CUDA, onnx,
  onnxruntime, grpcio, transformers, rich, tokenizers, matplotlib, pytest) the host must have;
- ``glue/``: GLUE RTE and SST-2 dev sets; ``tokenizer.json``: MiniLM's (BERT's uncased
  vocabulary), when ``make models`` has built MiniLM here;
- ``project/``: this repository's files as they are now (tracked, and new ones git does not ignore),
  unless ``--no-project``: where a checkout travels beside the bundle (the working tree a lent GPU
  machine gets holds it already), ``host.sh --project DIR`` runs that one, and the bundle leaves
  the room to the tree;
- ``host.sh`` (``tools/gpu_host.sh``): ``check``, ``setup``, ``models``, ``test``, ``measure``, ``engine``,
  ``cost`` and ``gpu`` (one short lease's run)
  (``--dry-run`` prints what it would run); ``BUNDLE.txt``: the commit and every file's size.

No model weights travel: the host exports BERT-base and ResNet-50 with random weights (which cost
what real ones do) from its own transformers and torchvision (``tools.models``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tools.lib.bundle import LIMIT, TOP, BundleError, build, tree_bytes
from tools.lib.paths import ROOT

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=ROOT / ".bundle" / "dvabatch-gpu.tar.xz",
                        help="the archive to write (default .bundle/dvabatch-gpu.tar.xz, ignored by git)")
    parser.add_argument("--python", default="3.12",
                        help="the GPU host's Python, MAJOR.MINOR (default 3.12, the lent H100/H200 machines')")
    parser.add_argument("--no-project", dest="project", action="store_false",
                        help="leave the repository out (host.sh --project DIR gives it on the host)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        sizes = build(args.out, args.python, args.project)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    size = args.out.stat().st_size
    beside = "" if args.project else (f", {(size + tree_bytes()) / 2**20:.1f} of the {LIMIT // 2**20} MiB that travel "
                                      "with the working tree")
    print(f"{args.out}: {size / 2**20:.1f} MiB ({sum(sizes.values()) / 2**20:.0f} MiB in "
          f"{len(sizes)} files{beside}) for Python {args.python}, in {time.perf_counter() - began:.0f} s; on the host: "
          f"tar xf {args.out.name} && {TOP}/host.sh {'' if args.project else '--project CHECKOUT '}"
          "check setup models test measure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
