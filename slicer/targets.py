"""What the slicer builds for: ONNX Runtime sessions on the CPU, torch on a GPU (or the CPU), or
TensorRT engines on a GPU.

A target profiles the nodes of the (optimised) source model and turns each stage's ONNX graph
into the file its engine loads. Everything else in the slicer is the same for both.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx

from backend.device import CpuDevice, CudaDevice, Device
from backend.engine import ort_options
from backend.manifest import TensorSpec
from slicer.errors import SliceError
from slicer.profile import NodeProfile, Progress
from backend.sample import sample_inputs, sizes_at

# ONNX Runtime's offline graph optimisation levels that keep a model portable across machines
# ("all" adds layout changes tied to the CPU it ran on).
OPTIMIZATION_LEVELS = ("none", "basic", "extended")


# The shapes named tensors take when the source model runs (rows, named axis sizes): for a
# TensorRT profile of a stage whose inputs have axes that vary with the length axis.
Probe = Callable[[Sequence[str], int, Mapping[str, int]], dict[str, tuple[int, ...]]]


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


def _feed(inputs: Sequence[TensorSpec], batch: int, length: int | None, axis: str | None,
          dim_sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    return sample_inputs(inputs, batch, sizes_at(dim_sizes, axis, length), seed=batch)


class OnnxRuntimeTarget:
    """CPU: stages are ONNX files run by ONNX Runtime; nodes are timed by its profiler."""

    name = engine = "onnxruntime"
    suffix = ".onnx"
    optimizations = ("extended", "basic", "none")
    graphs = False

    def __init__(self, precision: str = "fp32"):
        if precision != "fp32":
            raise SliceError(f"--precision {precision}: the onnxruntime target runs FP32 only (use --target torch)")
        self.device = CpuDevice()

    def profile_nodes(self, model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads, progress):
        """Median kernel time per node (ms) for each (length, batch) in ``configs``.

        One profiled session runs every configuration; each node event is assigned to the run
        whose ``model_run`` span holds it. Further optimisation is off so that the profiled
        nodes are exactly the graph's nodes.
        """
        import onnxruntime as ort

        index = {name: i for i, name in enumerate(nodes)}
        with tempfile.TemporaryDirectory() as scratch:
            options = ort_options(threads)  # the threads each stage's session will have
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.enable_profiling = True
            options.profile_file_prefix = str(Path(scratch) / "profile")
            session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
            plan = []  # config index of each run, -1 for warm-up runs
            for c, (length, batch) in enumerate(configs):
                feed = _feed(inputs, batch, length, axis, dim_sizes)
                for r in range(warmup + repeats):
                    session.run(None, feed)
                    plan.append(c if r >= warmup else -1)
                if progress:
                    progress("node profile", c + 1, len(configs))
            events = json.loads(Path(session.end_profiling()).read_text())
        starts = np.array(sorted(e["ts"] for e in events if e.get("name") == "model_run"))
        if len(starts) != len(plan):
            raise SliceError(f"ONNX Runtime's profile has {len(starts)} runs, {len(plan)} were made")
        per_run = np.zeros((len(plan), len(nodes)))
        for event in events:
            if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
                continue
            node = index.get(event["name"][: -len("_kernel_time")])
            if node is not None:
                run = int(np.searchsorted(starts, event["ts"], side="right")) - 1
                per_run[run, node] += event["dur"] / 1000
        plan_array = np.array(plan)
        return np.stack([np.median(per_run[plan_array == c], axis=0) for c in range(len(configs))])

    def build_stage(self, onnx_path: Path, inputs: Sequence[TensorSpec], out: Path, probe: Probe) -> None:
        shutil.copyfile(onnx_path, out)

    def synchronize(self) -> None:
        pass


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
            raise SliceError("--target torch needs torch (pip install torch==2.13.0 for the CPU build)") from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu", "cuda"):
            raise SliceError(f"--device must be auto, cpu or cuda, not {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise SliceError("--device cuda: no CUDA GPU is visible (torch.cuda.is_available() is False)")
        from backend.onnx_torch import PRECISIONS

        if precision not in PRECISIONS:
            raise SliceError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self._torch = torch
        self.device = CudaDevice() if device == "cuda" else CpuDevice()
        self.graphs = device == "cuda"
        self.precision = precision

    def profile_nodes(self, model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads, progress):
        """Median time per node (ms) for each (length, batch) in ``configs``."""
        from backend.engine import TorchEngine
        from backend.onnx_torch import node_timer

        engine = TorchEngine(Path(model_path), [], self.device, threads, self.precision)  # as served
        graph, index = engine.graph, {name: i for i, name in enumerate(nodes)}
        result = []
        for c, (length, batch) in enumerate(configs):
            feed = {k: self.device.from_host(v) for k, v in _feed(inputs, batch, length, axis, dim_sizes).items()}
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
            raise SliceError(f"--target tensorrt cannot run here: {reason}")
        import tensorrt as trt

        if precision not in ("fp32", "tf32", "fp16"):
            raise SliceError(f"--precision must be fp32, tf32 or fp16, not {precision!r}")
        if precision == "fp16" and not hasattr(trt.BuilderFlag, "FP16"):
            raise SliceError(f"--precision fp16: TensorRT {trt.__version__} builds strongly typed networks only; "
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
            raise SliceError(f"TensorRT cannot parse {onnx_path.name}: {errors}")
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
            raise SliceError(f"TensorRT could not build an engine for {onnx_path.name} (see its log above)")
        return bytes(plan)

    def build_stage(self, onnx_path: Path, inputs: Sequence[TensorSpec], out: Path, probe: Probe) -> None:
        out.write_bytes(self._build(onnx_path, inputs, probe, detailed=False))

    def profile_nodes(self, model_path, nodes, inputs, configs, axis, dim_sizes, warmup, repeats, threads, progress):
        from backend.engine import TensorRTEngine

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
            feed = {k: self.device.from_host(v) for k, v in _feed(inputs, batch, length, axis, dim_sizes).items()}
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


TARGETS = ("onnxruntime", "torch", "tensorrt")


def make_target(name: str, device: str = "auto", precision: str = "fp32", **shape_args) -> Target:
    if name == "onnxruntime":
        return OnnxRuntimeTarget(precision)
    if name == "torch":
        return TorchTarget(device, precision)
    if name == "tensorrt":
        return TensorRTTarget(**shape_args, precision=precision)
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
