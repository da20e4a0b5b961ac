"""How a model serves, decided once when it loads: through the pipeline, or as a plain model.

- ``PIPELINE``: the multi-entry multi-exit runtime (``runtime.py``), each query answered as soon
  as its rows leave.
- ``FUSED``: the policy stepped aside (``Policy.choose``), so the stages run as one engine
  (``engine.fusable``: one ONNX Runtime session, or one timed engine) on the batch Triton's
  batcher formed, inside ``execute``, and the responses go back in the list ``execute``
  returns: what a plain Python model does, with no threads, hand-offs or per-response round
  trips to pay for.
- ``IN_TURN``: the same single-entry single-exit serving with the stages run one after another:
  where the policy stepped aside on engines that cannot fuse (TensorRT), and for ``batching:
  triton`` (the stages as sliced, for comparisons).

Nothing here imports Triton, so the choice can be tested directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .config import RuntimeConfig
from .device import CpuDevice, Device
from .engine import cpu_cores, fusable, load_engines, on_host_cores
from .executor import Trace
from .manifest import Manifest
from .metrics import Metrics
from .policy import Choice
from .runtime import Runtime
from .whole import WholeBatch, together


class Mode(Enum):
    PIPELINE = "pipeline"
    FUSED = "fused"
    IN_TURN = "in_turn"


@dataclass(frozen=True)
class Decision:
    mode: Mode
    choice: Choice


def decide(manifest: Manifest, config: RuntimeConfig, cores: int | None = None,
           device: Device | None = None) -> Decision:
    """How the model serves on ``cores`` (default: those this process may use) of a host whose
    stages run on ``device`` (default: the CPU), and why."""
    if config.batching == "triton":
        return Decision(Mode.IN_TURN, Choice(False, "batching: triton"))
    choice = config.policy.choose(manifest, cores or cpu_cores(), on_host_cores(manifest, device or CpuDevice()))
    if choice.pipeline:
        return Decision(Mode.PIPELINE, choice)
    return Decision(Mode.FUSED if fusable(manifest) else Mode.IN_TURN, choice)


def serve(manifest: Manifest, version_dir: Path, config: RuntimeConfig, device: Device, metrics: Metrics,
          on_death: Callable[[str], None] | None = None, trace: Trace | None = None
          ) -> tuple[Decision, WholeBatch | Runtime]:
    """The model's engines loaded and its server built: a ``WholeBatch`` (``execute`` runs each
    batch) or a ``Runtime`` (``execute`` hands over and returns once stage 0 has computed them)."""
    decision = decide(manifest, config, device=device)
    metrics.serving(decision.mode.value, decision.choice.capacity)
    chosen = decision.mode
    fused = chosen is Mode.FUSED
    alone = chosen is not Mode.PIPELINE or len(manifest.stages) == 1  # one session runs at a time
    engines = load_engines(manifest, version_dir, device, config.intra_op_thread_count or cpu_cores(),
                           config.spins(alone), fused)
    if chosen is Mode.PIPELINE:
        return decision, Runtime(manifest, engines, config, device, trace=trace, metrics=metrics, on_death=on_death)
    manifest = manifest.fused() if fused else manifest
    config.bind(manifest)
    # Where compute is dear (ONNX Runtime on the CPU's cores) the policy's clusters by length save
    # it; on engines that overlap (a GPU; timed) the host's CPU is what is dear, and one padded run
    # per batch spends least of it.
    clusters = config.batching != "triton" and on_host_cores(manifest, device)
    form = (lambda queries: [batch for batch, _ in config.policy.form(queries, manifest.max_batch_size,
                                                                       time.monotonic())]) if clusters else together
    return decision, WholeBatch(manifest, engines, device, metrics, config.pad_values, config.size_limits(manifest),
                                form)
