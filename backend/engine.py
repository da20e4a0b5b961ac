"""Engines run one stage. Each kind sits behind the same small interface.

- ``onnxruntime``: the stage as an ONNX Runtime session (CPU device).
- ``torch``: the stage's ONNX graph run by torch (``onnx_torch.py``) on the instance's device:
  CUDA kernels on the executor's stream for a GPU instance, the CPU's cores for a CPU one.
- ``tensorrt``: the stage as a TensorRT 10 or 11 engine, dynamic shapes through its optimization
  profile (CUDA device; needs the ``gpu`` extra).
- ``timed``: computes nothing and keeps the stream busy as long as the stage's latency table
  predicts for the batch (``Device.busy``: CUDA, a spinning kernel; CPU, the time ``finish``
  waits out), so a schedule can be tested exactly; like a GPU's work, it runs while the host goes on.
  Its outputs are its inputs, in order: a timed model answers every query with its own rows.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .device import CpuDevice, Device
from .manifest import Manifest, StageSpec
from .sample import batch_sizes_up_to, sample_inputs

Tensors = dict[str, Any]
log = logging.getLogger(__name__)


class Engine(Protocol):
    """Computes a stage's outputs from its inputs on the executor's current stream; row i of
    every output belongs to input row i."""

    def run(self, inputs: Mapping[str, Any]) -> Tensors: ...


def cpu_cores() -> int:
    """CPU threads for each stage's session: every core this process may use. A lone batch's
    stage then runs on all of them, and stages running at the same time share them (idle threads
    sleep, see ``ort_options``)."""
    return len(os.sched_getaffinity(0))


def ort_options(threads: int | None = None, spinning: bool = False, between_runs: bool = False):
    """ONNX Runtime session options: quiet, and with ``threads`` set, that many intra-op threads
    that sleep rather than spin when idle unless ``spinning`` (an idle stage must not take cores
    from a busy one; a lone model on idle cores may gain from spinning). Spinning threads stop
    when a run ends (``session.force_spinning_stop``) unless ``between_runs``: where other
    sessions share the cores (a pipeline's stages, stages run in turn), the cores then belong to
    the threads that admit and answer queries and to the next stage (on MiniLM through a
    pipeline this beat both spinning between runs and never spinning); a session that runs
    alone (a fused model) keeps ONNX Runtime's default, as a plain model's session does (its
    threads are still spinning when the next batch comes: a 224x224 image model at one in flight
    0.84x the plain model's answers with the stop, 0.91x without; MiniLM level either way)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.add_session_config_entry("session.force_spinning_stop",
                                         "1" if spinning and not between_runs else "0")
    return options


class OnnxRuntimeEngine:
    """A stage (a file, or a serialised model) as an ONNX Runtime session on the CPU (``threads``:
    see ``ort_options``)."""

    def __init__(self, model: Path | bytes, output_names: list[str], threads: int | None = None,
                 spinning: bool = False, between_runs: bool = False):
        import onnxruntime as ort

        options = ort_options(threads, spinning, between_runs)
        model = model if isinstance(model, bytes) else str(model)
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._outputs = output_names

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        return dict(zip(self._outputs, self._session.run(self._outputs, feed)))


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

    def run(self, inputs: Mapping[str, Any]) -> Tensors:
        outputs = (self.graphs or self.graph).run(inputs, self._outputs)
        if self.graph.device.type == "cpu":  # host buffers are numpy arrays, as other CPU engines give
            return {name: tensor.numpy() for name, tensor in outputs.items()}
        return outputs


class TimedEngine:
    """Keeps the stream busy for the stage's tabulated latency and passes its inputs through as
    its outputs."""

    def __init__(self, stage: StageSpec, device: Device):
        if stage.latency is None:
            raise ValueError(f"stage {stage.index}: a timed stage needs a 'latency' table")
        if [(t.dtype, t.dims) for t in stage.inputs] != [(t.dtype, t.dims) for t in stage.outputs]:
            raise ValueError(f"stage {stage.index}: a timed stage's outputs must match its inputs one to one")
        self._table = stage.latency
        self._names = [(i.name, o.name) for i, o in zip(stage.inputs, stage.outputs)]
        self._length = _length_axis(stage)
        self._device = device
        device.busy(0)  # (on a GPU, its clock is measured now, not during the first batch)
        # Seconds by (rows, length), read once from the table: a simulated engine must cost the
        # host no more than the plain model's simulator, which indexes a dense table.
        self._seconds: dict[tuple[int, int | None], float] = {}

    def run(self, inputs: Mapping[str, Any]) -> Tensors:
        first = inputs[self._names[0][0]]
        key = (first.shape[0], first.shape[self._length] if self._length is not None else None)
        seconds = self._seconds.get(key)
        if seconds is None:
            seconds = self._seconds[key] = self._table.predict(*key) / 1000
        self._device.busy(seconds)
        return {out: _copy(inputs[src]) for src, out in self._names}


def _length_axis(stage: StageSpec) -> int | None:
    axis = stage.latency.axis
    if axis is None:
        return None
    if axis not in stage.inputs[0].dims:
        raise ValueError(f"stage {stage.index}: latency axis {axis!r} is not a dim of input '{stage.inputs[0].name}'")
    return 1 + stage.inputs[0].dims.index(axis)


def _copy(tensor: Any) -> Any:
    return tensor.copy() if isinstance(tensor, np.ndarray) else tensor.clone()


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


def fusable(manifest: Manifest) -> bool:
    """Whether the stages can run as one engine: ONNX Runtime or torch stages (one graph), or
    timed ones (one sleep for the summed tables, as stages queued on one GPU stream make the
    host wait once)."""
    return {stage.engine for stage in manifest.stages} in ({"onnxruntime"}, {"torch"}, {"timed"})


def on_host_cores(manifest: Manifest, device: Device) -> bool:
    """Whether every stage computes on the host's cores (ONNX Runtime; torch on a CPU instance):
    stages running at once then take turns on the same cores rather than overlap."""
    on_cpu = isinstance(device, CpuDevice)
    return all(s.engine == "onnxruntime" or (s.engine == "torch" and on_cpu) for s in manifest.stages)


Buckets = tuple[tuple[int, ...], tuple[int, ...]]  # (row buckets, length buckets) of CUDA graphs


def load_engines(manifest: Manifest, version_dir: Path, device: Device | None = None, threads: int = 0,
                 spinning: bool = False, fused: bool = False, graphs: bool = False,
                 buckets: Buckets | None = None) -> list[Engine]:
    """Every stage's engine, as the backend serves them (``threads`` 0: every core); with
    ``fused``, the one engine of ``manifest.fused()``: ONNX Runtime or torch stages merged back
    into one graph (one run instead of one per stage, and ONNX Runtime's optimiser sees across
    the cuts), or one timed engine for timed stages. With ``graphs``, torch stages replay a CUDA
    graph per shape bucket (``buckets``, by default ``graph_buckets``: what the slicer profiles
    before the tables exist), each captured here (``warm_up``)."""
    threads = threads or cpu_cores()
    device = device or CpuDevice()
    buckets = buckets or graph_buckets(manifest)
    rows = buckets[0] if graphs else ()
    if not fused:  # one stage is a session alone: its spinning threads may spin on between runs
        engines = [load_engine(stage, version_dir, device, threads, spinning, len(manifest.stages) == 1, rows)
                   for stage in manifest.stages]
        warm_up(engines, manifest, device, buckets)
        return engines
    if not fusable(manifest):
        raise ValueError("only onnxruntime or torch stages, or timed ones, run fused")
    engine = manifest.stages[0].engine
    if engine == "timed":
        return [TimedEngine(manifest.fused().stages[0], device)]
    files = [_stage_file(stage, version_dir) for stage in manifest.stages]
    outputs = [t.name for t in manifest.outputs]
    merged = merge_stages(files, [t.name for t in manifest.inputs], outputs)
    if engine == "torch":
        engines: list[Engine] = [TorchEngine(merged, outputs, device, threads, manifest.stages[0].precision, rows,
                                             "fused stages")]
        warm_up(engines, manifest.fused(), device, buckets)
        return engines
    return [OnnxRuntimeEngine(merged, outputs, threads, spinning, between_runs=True)]


def graph_buckets(manifest: Manifest) -> Buckets:
    """(row buckets, length buckets) of a model's CUDA graphs: the batch sizes and lengths its
    stage tables were measured at (so the tables are the graphs' times), else powers of two up
    to the largest batch and no lengths. A batch's length is padded up to a length bucket
    (``padding.Buckets``); a model with other named axes gets no graphs past its row buckets."""
    table = manifest.stages[0].latency if manifest.stages else None
    rows = tuple(table.batch_sizes) if table is not None else batch_sizes_up_to(manifest.max_batch_size)
    axis = manifest.length_axis
    lengths = tuple(table.lengths) if axis and table is not None and table.axis == axis and table.lengths else ()
    return rows, lengths


def warm_up(engines: Sequence[Engine], manifest: Manifest, device: Device, buckets: Buckets) -> None:
    """Run every bucket once through the stages, the largest first, so that each graphed torch
    stage captures its graphs (and the smaller buckets fit in the memory the largest took); then
    no stage captures again: a shape no graph holds runs eagerly. The graphs' memory is noted on
    each (``ShapeGraphs.reserved``). A model whose inputs have named axes other than the length
    axis, or a length axis but no length buckets, gets no graphs (shapes outside the buckets)."""
    graphed = [e.graphs for e in engines if isinstance(e, TorchEngine) and e.graphs is not None]
    if not graphed:
        return
    rows, lengths = buckets
    axis = manifest.length_axis
    named = {d for spec in manifest.inputs for d in spec.dims if isinstance(d, str)}
    if named - {axis} or (axis and not lengths):
        why = f"named axes {sorted(named - {axis})}" if named - {axis} else f"no length buckets for '{axis}'"
        log.warning("no CUDA graphs: %s (the stages run eagerly)", why)
    else:
        before = _reserved(device)
        stream = device.stream()
        with device.running_on(stream):
            for length in sorted(lengths, reverse=True) or [None]:
                for batch in sorted(rows, reverse=True):
                    feed = sample_inputs(manifest.inputs, batch, {axis: length} if axis else {}, seed=batch)
                    run_stages(engines, manifest.stages, {k: device.from_host(v) for k, v in feed.items()})
        device.finish(stream)
        for graphs in graphed:
            graphs.reserved = (_reserved(device) - before) // len(graphed)
    for graphs in graphed:
        graphs.capturing = False


def _reserved(device: Device) -> int:
    """Bytes the device's memory allocator holds (0 on the CPU), once it has given back what it
    only caches (the warm-up runs' blocks): what the graphs and their static tensors hold."""
    if isinstance(device, CpuDevice):
        return 0
    import torch

    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved(device.device)


def describe_graphs(engines: Sequence[Engine]) -> str:
    """What the CUDA graphs of ``engines`` are, for the model's log; empty where none."""
    graphed = [e.graphs for e in engines if isinstance(e, TorchEngine) and e.graphs is not None]
    if not graphed:
        return ""
    parts = [f"{g.name}: {g.graphs} graphs" + (f", {len(g.failures)} shapes eager ({next(iter(g.failures.values()))})"
                                               if g.failures else "") for g in graphed]
    total = sum(g.reserved for g in graphed)
    return f"CUDA graphs over row buckets {list(graphed[0].rows)}: {'; '.join(parts)}; {total / 2**20:.0f} MiB"


def merge_stages(files: Sequence[Path], inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """The stage graphs joined back into one model. Stages meet at tensor names and carried
    tensors keep theirs, so the union of the nodes is the sliced graph; constants the slicer
    cloned into several stages are kept once."""
    import onnx
    from onnx import helper

    models = [onnx.load(str(path)) for path in files]
    nodes, produced, initializers, opsets = [], set(), {}, {}
    for model in models:
        for node in model.graph.node:
            if node.output and all(name in produced for name in node.output):
                continue
            nodes.append(node)
            produced.update(node.output)
        for tensor in model.graph.initializer:
            initializers.setdefault(tensor.name, tensor)
        for opset in model.opset_import:
            opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)
    declared_in = {info.name: info for model in models for info in model.graph.input}
    declared_out = {info.name: info for model in models for info in model.graph.output}
    graph = helper.make_graph(nodes, "fused", [declared_in[name] for name in inputs],
                              [declared_out[name] for name in outputs], list(initializers.values()))
    merged = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                               ir_version=max(model.ir_version for model in models))
    return merged.SerializeToString()


def load_engine(stage: StageSpec, version_dir: Path, device: Device | None = None,
                threads: int | None = None, spinning: bool = False, between_runs: bool = False,
                graph_rows: Sequence[int] = ()) -> Engine:
    """The engine the manifest names for ``stage``, loaded from ``version_dir`` for ``device``
    (``threads``, ``spinning``, ``between_runs``: see ``ort_options``; ``graph_rows``: a torch
    stage's CUDA graph buckets, see ``TorchEngine``)."""
    device = device or CpuDevice()
    on_cpu = isinstance(device, CpuDevice)
    if stage.engine == "timed":
        return TimedEngine(stage, device)
    if stage.engine not in ("onnxruntime", "torch", "tensorrt"):
        raise ValueError(f"stage {stage.index}: unknown engine {stage.engine!r}; "
                         "known: onnxruntime, torch, tensorrt, timed")
    if stage.engine != "torch" and (stage.engine == "onnxruntime") != on_cpu:
        raise ValueError(f"stage {stage.index}: a {stage.engine} stage cannot run on {device.name}; "
                         "onnxruntime stages run on KIND_CPU instances, tensorrt stages on KIND_GPU")
    path = _stage_file(stage, version_dir)
    outputs = [t.name for t in stage.outputs]
    if stage.engine == "torch":
        return TorchEngine(path, outputs, device, threads, stage.precision, graph_rows, f"stage {stage.index}")
    if not on_cpu:
        return TensorRTEngine(path, outputs, device)
    return OnnxRuntimeEngine(path, outputs, threads, spinning, between_runs)


def _stage_file(stage: StageSpec, version_dir: Path) -> Path:
    path = Path(version_dir) / stage.file
    if not path.is_file():
        raise FileNotFoundError(f"stage {stage.index}: {path} is missing; re-run the slicer")
    return path


def run_stages(engines: Sequence[Engine], stages: Sequence[StageSpec], buffer: Mapping[str, Any],
               ran: Callable[[int, float], None] | None = None) -> Tensors:
    """Run ``buffer`` through the stages in order, each seeing only the previous one's outputs and
    carried tensors: the chain the executors run, without the pipeline (the slicer verifies with
    it; ``batching: triton`` serves with it). ``ran(stage, seconds)`` hears how long each took."""
    current = dict(buffer)
    for engine, stage in zip(engines, stages):
        began = time.monotonic()
        computed = engine.run({t.name: current[t.name] for t in stage.inputs})
        current = {**{name: current[name] for name in stage.carry}, **computed} if stage.carry else computed
        if ran is not None:
            ran(stage.index, time.monotonic() - began)
    return current
