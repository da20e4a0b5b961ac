"""Build the example model repository: generate source models, slice them into model_repository/.

    python -m tools.build_examples [--force]

What is built and where: ``tools/lib/examples.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.lib.examples import EXAMPLES, build
from tools.lib.paths import DEFAULT_REPOSITORY

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.build_examples", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="re-slice even when up to date")
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY)
    args = parser.parse_args(argv)
    built = build(args.repository, args.force)
    print(f"model repository {args.repository}: {len(built)} rebuilt, {len(EXAMPLES) - len(built)} up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
