"""Engines run one stage. Each kind sits behind the same small interface.

ONNX Runtime runs stages on the CPU. TensorRT (GPU) and the timed engine (deterministic
schedule tests) come with the multi-entry multi-exit runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np

from .manifest import StageSpec


class Engine(Protocol):
    """Computes a stage's outputs from its inputs; row i of every output belongs to input row i."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class OnnxRuntimeEngine:
    """A stage as an ONNX Runtime session on the CPU."""

    def __init__(self, path: Path, output_names: list[str]):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._outputs = output_names

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._outputs, self._session.run(self._outputs, dict(inputs))))


ENGINES = {"onnxruntime": OnnxRuntimeEngine}


def load_engine(stage: StageSpec, version_dir: Path) -> Engine:
    """The engine the manifest names for ``stage``, loaded from ``version_dir``."""
    if stage.engine not in ENGINES:
        raise ValueError(f"stage {stage.index}: unknown engine {stage.engine!r}; known: {sorted(ENGINES)}")
    path = Path(version_dir) / stage.file
    if not path.is_file():
        raise FileNotFoundError(f"stage {stage.index}: {path} is missing; re-run the slicer")
    return ENGINES[stage.engine](path, [t.name for t in stage.outputs])
