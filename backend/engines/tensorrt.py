"""The ``tensorrt`` engine: a stage as a TensorRT 10 or 11 engine on the instance's GPU, and its
slicer target (one engine per stage, an optimization profile covering every batch size and length;
nodes timed by TensorRT's per-layer profiler). Needs the ``gpu`` extra and a GPU."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..device import CpuDevice, CudaDevice, Device
from ..errors import TargetError
from ..manifest import TensorSpec
from ..sample import Probe, feed_at, sample_inputs, sizes_at
from .base import Tensors


class TensorRTEngine:
    """A stage as a TensorRT engine (10 or 11) on the instance's GPU: one execution context,
    inputs and outputs bound by tensor name, shapes set per batch within the engine's
    optimization profile, work enqueued on the executor's current stream."""

    def __init__(self, path: Path, output_names: Sequence[str], device: Device, profiler: Any = None):
        try:
            import tensorrt as trt
            import torch
        except ImportError as exc:
            raise RuntimeError(f"{path.name}: TensorRT engines need tensorrt and torch with CUDA "
                               "(pip install '.[gpu]')") from exc
        if isinstance(device, CpuDevice):
            raise ValueError(f"{path.name}: a TensorRT engine runs on a GPU instance (KIND_GPU)")
        self._torch, self._device = torch, device.device
        with torch.cuda.device(self._device):  # the instance's GPU, not whichever is current
            runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self._engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if self._engine is None:
                raise RuntimeError(f"{path.name}: TensorRT could not deserialize the engine (built by another "
                                   "version?)")
            self._context = self._engine.create_execution_context()
        if profiler is not None:  # a trt.IProfiler: the slicer times layers this way
            self._context.profiler = profiler
        self._outputs = list(output_names)
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._dtypes = {name: torch.from_numpy(np.empty(0, trt.nptype(self._engine.get_tensor_dtype(name)))).dtype
                        for name in names}

    def names(self) -> tuple[list[str], list[str]]:
        import tensorrt as trt

        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        taken = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        return taken, [n for n in names if n not in taken]

    def run(self, inputs: Mapping[str, Any]) -> Tensors:
        torch = self._torch
        bound = []  # contiguous copies stay referenced until the work is enqueued (then stream order protects them)
        for name, tensor in inputs.items():
            if tensor.dtype != self._dtypes[name]:
                raise TypeError(f"TensorRT input '{name}' is {tensor.dtype}; the engine was built for "
                                f"{self._dtypes[name]}")
            tensor = tensor.contiguous()
            bound.append(tensor)
            if not self._context.set_input_shape(name, tuple(tensor.shape)):
                raise ValueError(f"TensorRT input '{name}' of shape {tuple(tensor.shape)} is outside the engine's "
                                 "optimization profile (sliced for other batch sizes or lengths)")
            self._context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self._outputs:
            shape = tuple(self._context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, dtype=self._dtypes[name], device=self._device)
            self._context.set_tensor_address(name, outputs[name].data_ptr())
        if not self._context.execute_async_v3(torch.cuda.current_stream(self._device).cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return outputs


TENSORRT_MAJORS = (10, 11)


def tensorrt_missing() -> str | None:
    """Why ``--target tensorrt`` cannot run here, or None when it can."""
    try:
        import tensorrt
    except ImportError:
        return "the tensorrt Python package is not installed (pip install -e '.[gpu]' on a machine with an NVIDIA GPU)"
    if int(tensorrt.__version__.split(".")[0]) not in TENSORRT_MAJORS:
        return f"TensorRT {' or '.join(map(str, TENSORRT_MAJORS))} is needed, found {tensorrt.__version__}"
    try:
        import torch
    except ImportError:
        return "torch with CUDA is needed to run TensorRT engines (pip install torch)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def profile_shapes(names: Sequence[str], probe: Probe, max_batch: int, axis: str | None, max_length: int | None,
                   dim_sizes: Mapping[str, int]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shapes of an engine's inputs for a TensorRT optimization profile: the
    shapes the tensors take when the source model runs one row at length 1 and ``max_batch``
    rows at ``max_length`` (other named axes at their sizes), so an intermediate tensor's axes
    that follow the length axis (``[-1, 32]``, ``[4, -1, -1]``) cover every length served. opt
    is the largest shape, where the pipeline is busiest."""
    low = probe(names, 1, sizes_at(dim_sizes, axis, 1 if axis else None))
    high = probe(names, max_batch, sizes_at(dim_sizes, axis, max_length))
    ranges = {}
    for name in names:
        small = tuple(map(min, low[name], high[name]))
        large = tuple(map(max, low[name], high[name]))
        ranges[name] = (small, large, large)
    return ranges


def feed_shapes(inputs: Sequence[TensorSpec]) -> Probe:
    """A probe of the model's own inputs: the shapes ``sample_inputs`` gives them."""
    specs = {spec.name: spec for spec in inputs}

    def probe(names: Sequence[str], batch: int, sizes: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        return {n: tuple(a.shape) for n, a in sample_inputs([specs[n] for n in names], batch, sizes).items()}
    return probe


_FOREIGN = re.compile(r"ForeignNode\[(.+?)\.\.\.(.+?)\]")
_SEPARATORS = re.compile(r" \+ |, |PWN\(|\)|\(|\{|\}")


def attribute_layer_times(layer_times: Mapping[str, float], nodes: Sequence[str]) -> np.ndarray:
    """Spread TensorRT layer times over the ONNX nodes each layer was built from.

    Layer names list their nodes: ``"a + b"`` (fused), ``"PWN(a, b)"`` (pointwise fusion),
    ``"{ForeignNode[first...last]}"`` (a Myelin region: every node from ``first`` to ``last`` in
    order) or ``"Reformatting CopyNode for Input Tensor 0 to a"`` (a copy in front of ``a``). A
    layer's time is shared evenly among its nodes; layers naming no known node are dropped.
    """
    index = {name: i for i, name in enumerate(nodes)}
    by_length = sorted(index, key=len, reverse=True)
    times = np.zeros(len(nodes))
    for layer, ms in layer_times.items():
        found: list[int] = []
        for first, last in _FOREIGN.findall(layer):
            if first in index and last in index:
                found += range(index[first], index[last] + 1)
        if not found:
            found = [index[t.strip()] for t in _SEPARATORS.split(layer) if t.strip() in index]
        if not found:
            for name in by_length:
                if len(name) >= 3 and name in layer:
                    found = [index[name]]
                    break
        if found:
            times[found] += ms / len(found)
    return times


class TensorRTTarget:
    """GPU: one TensorRT engine per stage (TensorRT 10 or 11), built from the stage's ONNX graph
    with an optimization profile covering batch 1..max and lengths 1..max; nodes are timed by
    TensorRT's per-layer profiler on an engine of the whole model. FP32 builds keep TF32 off,
    so stages verify against ONNX Runtime at the slicer's tolerance; ``tf32`` leaves it on.
    ``fp16`` sets TensorRT 10's FP16 flag; TensorRT 11 builds strongly typed networks only, so
    an FP16 engine there comes from an FP16 source model (ModelOpt AutoCast), sliced at fp32."""

    name = engine = "tensorrt"
    suffix = ".plan"
    # Extended ONNX Runtime fusions emit com.microsoft operators TensorRT's parser does not know.
    optimizations = ("basic", "none")
    graphs = False

    def __init__(self, max_batch: int, axis: str | None, max_length: int | None, dim_sizes: Mapping[str, int],
                 precision: str = "fp32"):
        reason = tensorrt_missing()
        if reason:
            raise TargetError(f"--target tensorrt cannot run here: {reason}")
        import tensorrt as trt

        if precision not in ("fp32", "tf32", "fp16"):
            raise TargetError(f"--precision must be fp32, tf32 or fp16, not {precision!r}")
        if precision == "fp16" and not hasattr(trt.BuilderFlag, "FP16"):
            raise TargetError(f"--precision fp16: TensorRT {trt.__version__} builds strongly typed networks only; "
                             "convert the source to FP16 first (python -m modelopt.onnx.autocast --onnx_path SRC.onnx) "
                             "and slice that at --precision fp32")
        self._trt = trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self.device = CudaDevice()
        self.precision = precision
        self._shape_args = (max_batch, axis, max_length, dim_sizes)

    def _build(self, onnx_path: Path, inputs: Sequence[TensorSpec], probe: Probe, detailed: bool) -> bytes:
        trt = self._trt
        builder = trt.Builder(self._logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TargetError(f"TensorRT cannot parse {onnx_path.name}: {errors}")
        config = builder.create_builder_config()
        if hasattr(trt.BuilderFlag, "TF32") and self.precision != "tf32":
            config.clear_flag(trt.BuilderFlag.TF32)
        if self.precision == "fp16":
            config.set_flag(trt.BuilderFlag.FP16)
        if detailed:
            config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
        profile = builder.create_optimization_profile()
        for name, shapes in profile_shapes([spec.name for spec in inputs], probe, *self._shape_args).items():
            profile.set_shape(name, *shapes)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise TargetError(f"TensorRT could not build an engine for {onnx_path.name} (see its log above)")
        return bytes(plan)

    def build_stage(self, onnx_path: Path, inputs: Sequence[TensorSpec], out: Path, probe: Probe) -> None:
        out.write_bytes(self._build(onnx_path, inputs, probe, detailed=False))

    def profile_nodes(self, model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads, progress):

        trt = self._trt

        class Layers(trt.IProfiler):
            def __init__(self):
                trt.IProfiler.__init__(self)
                self.times: dict[str, float] = {}

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                self.times[layer_name] = self.times.get(layer_name, 0.0) + ms

        with tempfile.TemporaryDirectory() as scratch:
            plan = Path(scratch) / "whole.plan"
            plan.write_bytes(self._build(Path(model_path), inputs, feed_shapes(inputs), detailed=True))
            outputs = [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]
            layers = Layers()
            engine = TensorRTEngine(plan, outputs, self.device, profiler=layers)
        result = []
        for c, (length, batch) in enumerate(configs):
            feed = {k: self.device.from_host(v) for k, v in feed_at(inputs, batch, length, axis, dim_sizes).items()}
            per_run = []
            for r in range(warmup + repeats):
                layers.times = {}
                engine.run(feed)
                self.synchronize()
                if r >= warmup:
                    per_run.append(attribute_layer_times(layers.times, nodes))
            result.append(np.median(per_run, axis=0))
            if progress:
                progress("node profile", c + 1, len(configs))
        return np.stack(result)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()
