"""python -m tools.perf_analyzer.install: the real perf_analyzer in the virtualenv, without root.

NVIDIA ships perf_analyzer as a binary inside the ``tritonclient`` wheels up to 2.57 (2.58-2.60
need glibc 2.38, later ones ship none). We take it from 2.51.0, the release of the Triton that
``nvidia-pytriton`` serves (24.10); the ``tritonclient`` Python package stays at the version
pyproject.toml asks for. The binary needs two libraries that no dependency of ours carries:

- ``libb64.so.0d``: Debian's ``libb64-0d`` (10 kB), taken from the system if it has it, else
  fetched with ``apt-get download`` from the machine's own package sources (apt checks their
  signatures); unpacked without dpkg or root;
- ``libcudart.so.12``: from the ``nvidia-cuda-runtime-cu12`` wheel; loaded at start, never used
  on a CPU.

Everything lands in ``<venv>/lib/perf_analyzer/``, and ``<venv>/bin/perf_analyzer`` is a wrapper
that puts that folder on LD_LIBRARY_PATH. Running it again does nothing once the wrapper answers
``--version`` with the pinned version. Downloads are kept in ``$DVABATCH_CACHE/wheels``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.lib.perf_analyzer import VERSION
from tools.lib.perf_analyzer_install import InstallError, install

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.perf_analyzer.install", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", type=Path, help="install into this prefix (default: the running virtualenv)")
    parser.add_argument("--force", action="store_true", help="install again even if it runs")
    args = parser.parse_args(argv)
    try:
        wrapper = install(args.prefix, args.force)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"perf_analyzer {VERSION}: {wrapper}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
