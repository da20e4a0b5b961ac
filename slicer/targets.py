"""What the slicer builds for: ONNX Runtime sessions on the CPU, torch on a GPU (or the CPU), or
TensorRT engines on a GPU. Each engine's target lives beside its engine (``backend/engines/``):
it profiles the nodes of the (optimised) source model and turns each stage's ONNX graph into the
file its engine loads. Here is what is the same for every target: the graph optimisation before
cutting, choosing a target, and the node profile over every configuration; a target's
``TargetError`` becomes the slicer's ``SliceError``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from backend.device import Device
from backend.engines import ort_options
from backend.engines.onnxruntime import OnnxRuntimeTarget
from backend.engines.tensorrt import TensorRTTarget
from backend.engines.torch import TorchTarget
from backend.errors import TargetError
from backend.manifest import TensorSpec
from backend.sample import Probe
from slicer.errors import SliceError
from slicer.profile import NodeProfile, Progress

# ONNX Runtime's offline graph optimisation levels that keep a model portable across machines
# ("all" adds layout changes tied to the CPU it ran on).
OPTIMIZATION_LEVELS = ("none", "basic", "extended")


class Target(Protocol):
    name: str
    engine: str  # the manifest's engine name
    suffix: str  # stage file suffix
    optimizations: tuple[str, ...]  # the levels its engine can load; the first is the default
    device: Device
    graphs: bool  # its stages are served as CUDA graphs per shape bucket (so timed and verified)

    def profile_nodes(self, model_path: Path, nodes: Sequence[str], inputs: Sequence[TensorSpec],
                      configs: Sequence[tuple[int | None, int]], axis: str | None, dim_sizes: Mapping[str, int],
                      warmup: int, repeats: int, threads: int, progress: Progress | None) -> np.ndarray: ...

    def build_stage(self, onnx_path: Path, inputs: Sequence[TensorSpec], out: Path, probe: Probe) -> None: ...

    def synchronize(self) -> None: ...


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every node a unique name: profiles and the summary refer to nodes by name."""
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        name = node.name or f"{node.op_type}_{index}"
        while name in seen:
            name = f"{name}_{index}"
        node.name = name
        seen.add(name)


def optimize(src: Path, dst: Path, level: str) -> onnx.ModelProto:
    """The source graph after ONNX Runtime's constant folding and fusions at ``level``, saved to
    ``dst``. The slicer cuts this graph, as the paper slices after the compiler optimised."""
    import onnxruntime as ort

    if level not in OPTIMIZATION_LEVELS:
        raise SliceError(f"--optimize must be one of {', '.join(OPTIMIZATION_LEVELS)}, not {level!r}")
    model = onnx.load(str(src))
    name_nodes(model)
    if level != "none":
        with tempfile.TemporaryDirectory() as scratch:
            named = Path(scratch) / "named.onnx"
            onnx.save(model, str(named))
            options = ort_options()
            options.graph_optimization_level = {
                "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            }[level]
            options.optimized_model_filepath = str(dst)
            ort.InferenceSession(str(named), options, providers=["CPUExecutionProvider"])
        model = onnx.load(str(dst))
        name_nodes(model)
    onnx.save(model, str(dst))
    return model


TARGETS = ("onnxruntime", "torch", "tensorrt")


def make_target(name: str, device: str = "auto", precision: str = "fp32", **shape_args) -> Target:
    try:
        if name == "onnxruntime":
            return OnnxRuntimeTarget(precision)
        if name == "torch":
            return TorchTarget(device, precision)
        if name == "tensorrt":
            return TensorRTTarget(**shape_args, precision=precision)
    except TargetError as exc:
        raise SliceError(str(exc)) from None
    raise SliceError(f"--target must be one of {', '.join(TARGETS)}, not {name!r}")


def profile(target: Target, model_path: Path, nodes: Sequence[str], inputs: Sequence[TensorSpec],
            batch_sizes: Sequence[int], lengths: Sequence[int | None], axis: str | None,
            dim_sizes: Mapping[str, int], warmup: int, repeats: int, threads: int,
            progress: Progress | None) -> NodeProfile:
    """The node profile over every (length, batch size), timed."""
    began = time.perf_counter()
    configs = [(length, batch) for length in lengths for batch in batch_sizes]
    flat = target.profile_nodes(model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads,
                                progress)
    times = np.asarray(flat).reshape(len(lengths), len(batch_sizes), len(nodes))
    return NodeProfile(nodes=tuple(nodes), batch_sizes=tuple(batch_sizes), lengths=tuple(lengths),
                       times=times, seconds=time.perf_counter() - began)
