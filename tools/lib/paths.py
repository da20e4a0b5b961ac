"""Where things are: the repository, its backend and model repositories, and the cache outside git
(``$DVABATCH_CACHE``, default ``~/.cache/dvabatch``) that holds source models and downloads."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
BACKEND_DIR = ROOT / "backend"
DEFAULT_REPOSITORY = ROOT / "model_repository"  # the example models (make examples)
REAL_REPOSITORY = ROOT / "model_repository_real"  # the real models (make models)
CACHE = Path(os.environ.get("DVABATCH_CACHE", Path.home() / ".cache" / "dvabatch"))
SOURCES = CACHE / "sources"  # source ONNX files, never in git
WHEELS = CACHE / "wheels"  # downloaded wheels and packages
