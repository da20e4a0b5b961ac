"""The ``torch`` engine: a stage's ONNX graph run by torch (``onnx_torch.py``) on the instance's
device (CUDA kernels on the executor's stream, each shape bucket a CUDA graph: ``torch_graphs.py``;
or the CPU's cores), and its slicer target (standard ONNX files; nodes timed one by one).

torch is imported where it is used: a model of ONNX Runtime stages never loads it."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..device import CpuDevice, CudaDevice, Device
from ..errors import TargetError
from ..manifest import TensorSpec
from ..sample import Probe, feed_at
from .base import Tensors


class TorchEngine:
    """A stage (a file, or a serialised model) run by torch on ``device``: on CUDA its kernels go
    to the executor's current stream and read and write the buffers in place; on the CPU it takes
    and gives numpy arrays as the other CPU engines do, with ``threads`` intra-op threads (torch
    has one pool per process, so the last engine loaded sets it). ``precision`` (the stage's):
    fp32 keeps TF32 off, so that FP32 results match ONNX Runtime's within the slicer's tolerance;
    tf32 lets matmuls and convolutions use it; fp16 runs the graph in half
    (``onnx_torch.TorchGraph``). With row buckets (``graph_rows``) it replays a CUDA graph per
    shape bucket (``torch_graphs.ShapeGraphs``; on the CPU the same buckets on static buffers)."""

    def __init__(self, model: Path | bytes, output_names: list[str], device: Device, threads: int | None = None,
                 precision: str = "fp32", graph_rows: Sequence[int] = (), name: str = "stage"):
        import torch

        from .onnx_torch import TorchGraph
        from .torch_graphs import ShapeGraphs

        on_cpu = isinstance(device, CpuDevice)
        if on_cpu and threads:
            torch.set_num_threads(threads)
        if not on_cpu:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        self.graph = TorchGraph(model, "cpu" if on_cpu else device.device, precision)
        self.graphs = ShapeGraphs(self.graph, graph_rows, name) if graph_rows else None
        self._outputs = output_names

    def names(self) -> tuple[list[str], list[str]]:
        return self.graph.inputs, self.graph.outputs

    def run(self, inputs: Mapping[str, Any]) -> Tensors:
        outputs = (self.graphs or self.graph).run(inputs, self._outputs)
        if self.graph.device.type == "cpu":  # host buffers are numpy arrays, as other CPU engines give
            return {name: tensor.numpy() for name, tensor in outputs.items()}
        return outputs


class TorchTarget:
    """Stages stay standard ONNX files run by torch (``backend/onnx_torch.py``) on ``device``
    (``cuda``, or ``cpu``; ``auto``: a GPU where torch sees one) at ``precision``; nodes are
    timed one by one as the interpreter runs them (CUDA events on a GPU, wall time on the CPU).
    On a GPU the stages are verified and timed as they serve: as CUDA graphs per shape bucket."""

    name = engine = "torch"
    suffix = ".onnx"
    # Extended ONNX Runtime fusions emit com.microsoft operators the interpreter does not know.
    optimizations = ("basic", "none")

    def __init__(self, device: str = "auto", precision: str = "fp32"):
        try:
            import torch
        except ImportError:
            raise TargetError("--target torch needs torch (pip install torch==2.13.0 for the CPU build)") from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise TargetError(f"--device must be auto, cpu or cuda, not {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise TargetError("--device cuda: no CUDA GPU is visible (torch.cuda.is_available() is False)")
        from .onnx_torch import PRECISIONS

        if precision not in PRECISIONS:
            raise TargetError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self._torch = torch
        self.device = CudaDevice() if device == "cuda" else CpuDevice()
        self.graphs = device == "cuda"
        self.precision = precision

    def profile_nodes(self, model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads, progress):
        """Median time per node (ms) for each (length, batch) in ``configs``."""
        from .onnx_torch import node_timer

        try:
            engine = TorchEngine(Path(model_path), [], self.device, threads, self.precision)  # as served
        except NotImplementedError as exc:  # an operator the interpreter lacks: the user's model, not a bug
            raise TargetError(f"--target torch: {exc}; or slice with --target onnxruntime") from None
        graph, index = engine.graph, {name: i for i, name in enumerate(nodes)}
        result = []
        for c, (length, batch) in enumerate(configs):
            feed = {k: self.device.from_host(v) for k, v in feed_at(inputs, batch, length, axis, dim_sizes).items()}
            per_run = []
            for r in range(warmup + repeats):
                times = np.zeros(len(nodes))

                def record(node: str, ms: float, times=times) -> None:
                    if node in index:
                        times[index[node]] += ms
                timer = node_timer(graph.device, record)
                graph.run(feed, timer=timer)
                timer.flush()
                if r >= warmup:
                    per_run.append(times)
            result.append(np.median(per_run, axis=0))
            if progress:
                progress("node profile", c + 1, len(configs))
        return np.stack(result)

    def build_stage(self, onnx_path: Path, inputs: Sequence[TensorSpec], out: Path, probe: Probe) -> None:
        shutil.copyfile(onnx_path, out)

    def synchronize(self) -> None:
        if isinstance(self.device, CudaDevice):
            self._torch.cuda.synchronize()
