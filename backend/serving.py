"""How a model serves, decided once when it loads: through the pipeline, or as a plain model.

- ``PIPELINE``: the multi-entry multi-exit runtime (``runtime.py``), each query answered from its
  own response sender as soon as its rows leave.
- ``FUSED``: the policy found that the pipeline cannot pay on this model (``Policy.fuses``), so
  the stages run as one ONNX Runtime session on the batch Triton's batcher formed, inside
  ``execute``, and the responses go back in the list ``execute`` returns: what a plain Python
  model does, with no threads, hand-offs or per-response round trips to pay for.
- ``TRITON``: ``batching: triton``, the same single-entry single-exit serving with every stage
  run in turn (the stages as sliced, for comparisons).

Nothing here imports Triton, so the choice can be tested directly.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path

from .config import RuntimeConfig
from .device import Device
from .engine import cpu_cores, load_engines
from .manifest import Manifest
from .metrics import Metrics
from .runtime import Runtime
from .whole import WholeBatch


class Mode(Enum):
    PIPELINE = "pipeline"
    FUSED = "fused"
    TRITON = "triton"


def mode(manifest: Manifest, config: RuntimeConfig) -> Mode:
    if config.batching == "triton":
        return Mode.TRITON
    return Mode.FUSED if config.policy.fuses(manifest) else Mode.PIPELINE


def serve(manifest: Manifest, version_dir: Path, config: RuntimeConfig, device: Device, metrics: Metrics,
          on_death: Callable[[str], None] | None = None) -> tuple[Mode, WholeBatch | Runtime]:
    """The model's engines loaded and its server built: a ``WholeBatch`` (``execute`` runs each
    batch) or a ``Runtime`` (``execute`` hands over and returns)."""
    chosen = mode(manifest, config)
    metrics.serving(chosen.value)
    fused = chosen is Mode.FUSED
    alone = chosen is not Mode.PIPELINE or len(manifest.stages) == 1  # one session runs at a time
    engines = load_engines(manifest, version_dir, device, config.intra_op_thread_count or cpu_cores(),
                           config.spins(alone), fused)
    if chosen is Mode.PIPELINE:
        return chosen, Runtime(manifest, engines, config, device, metrics=metrics, on_death=on_death)
    manifest = manifest.fused() if fused else manifest
    config.bind(manifest)
    return chosen, WholeBatch(manifest, engines, device, metrics, config.pad_values, config.size_limits(manifest))
