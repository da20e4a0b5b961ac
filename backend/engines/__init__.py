"""Engines run one stage, each kind behind the same small interface (``Engine``), one module each
with its serving engine and its slicer target (``OnnxRuntimeTarget``, ``TorchTarget``,
``TensorRTTarget``: how the slicer builds and profiles stages for it):

- ``onnxruntime``: the stage as an ONNX Runtime session (CPU device);
- ``torch``: the stage's ONNX graph run by torch (``onnx_torch.py``) on the instance's device,
  each shape bucket a CUDA graph on a GPU (``torch_graphs.py``);
- ``tensorrt``: the stage as a TensorRT 10 or 11 engine (CUDA device; the ``gpu`` extra);
- ``timed``: computes nothing and keeps the stream busy for the stage's tabulated time.

This module loads them as the backend serves them (``load_engines``: each stage, or the stages
fused into one; CUDA graphs captured at load, ``warm_up``) and runs them in turn
(``run_stages``). A new engine is one module here and a line in ``load_engine``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..device import CpuDevice, Device
from ..host import Cpus
from ..host import cpus as host_cpus
from ..manifest import Manifest, StageSpec
from ..sample import batch_sizes_up_to, feed_at
from .base import Engine, Tensors
from .onnxruntime import OnnxRuntimeEngine, ort_options
from .tensorrt import TensorRTEngine
from .timed import TimedEngine
from .torch import TorchEngine

__all__ = ["Engine", "OnnxRuntimeEngine", "TensorRTEngine", "TimedEngine", "TorchEngine",
           "describe_graphs", "describe_pins", "fusable", "graph_buckets", "load_engine", "load_engines",
           "merge_stages", "on_host_cores", "ort_options", "run_stages", "warm_up", "Buckets"]

log = logging.getLogger(__name__)


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
                 buckets: Buckets | None = None, cpus: Cpus | None = None) -> list[Engine]:
    """Every stage's engine, as the backend serves them (``threads`` 0: ``cpus.threads``, by
    default this process's; a session that runs alone has its workers pinned as ``cpus.pins``
    says); with ``fused``, the one engine of ``manifest.fused()``: ONNX Runtime or torch stages
    merged back into one graph (one run instead of one per stage, and ONNX Runtime's optimiser
    sees across the cuts), or one timed engine for timed stages. With ``graphs``, torch stages replay a CUDA
    graph per shape bucket (``buckets``, by default ``graph_buckets``: what the slicer profiles
    before the tables exist), each captured here (``warm_up``)."""
    cpus = cpus or host_cpus()
    threads = threads or cpus.threads
    pins = cpus.pins(threads)
    device = device or CpuDevice()
    buckets = buckets or graph_buckets(manifest)
    rows = buckets[0] if graphs else ()
    if not fused:  # one stage is a session alone: its spinning threads may spin on between runs
        alone = len(manifest.stages) == 1
        engines = [load_engine(stage, version_dir, device, threads, spinning, alone, rows, pins if alone else ())
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
    else:
        engines = [OnnxRuntimeEngine(merged, outputs, threads, spinning, between_runs=True, pins=pins)]
    check_names(engines[0], manifest.fused().stages[0], "the stages fused")
    warm_up(engines, manifest.fused(), device, buckets)
    return engines


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
    graphed = _graphed(engines)
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
                    feed = feed_at(manifest.inputs, batch, length, axis, {})
                    run_stages(engines, manifest.stages, {k: device.from_host(v) for k, v in feed.items()})
        device.finish(stream)
        for graphs in graphed:  # the stages captured in turns: each is given an even share
            graphs.reserved = (_reserved(device) - before) // len(graphed)
    for graphs in graphed:
        graphs.capturing = False


def _graphed(engines: Sequence[Engine]) -> list:
    """The CUDA graphs (``torch_graphs.ShapeGraphs``) of the torch engines that have them."""
    return [e.graphs for e in engines if isinstance(e, TorchEngine) and e.graphs is not None]


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
    graphed = _graphed(engines)
    if not graphed:
        return ""
    parts = [f"{g.name}: {g.graphs} graphs" + (f", {len(g.failures)} shapes eager ({next(iter(g.failures.values()))})"
                                               if g.failures else "") for g in graphed]
    total = sum(g.reserved for g in graphed)
    return f"CUDA graphs over row buckets {list(graphed[0].rows)}: {'; '.join(parts)}; {total / 2**20:.0f} MiB"


def describe_pins(engines: Sequence[Engine]) -> str:
    """Where ONNX Runtime sessions among ``engines`` pin their worker threads, for the model's
    log (``host.Cpus.pins``); empty where none does."""
    pins = {getattr(engine, "pins", ()) for engine in engines} - {()}
    return "; ".join(f"ONNX Runtime's workers pinned to CPUs {', '.join('+'.join(map(str, core)) for core in p)}"
                     for p in sorted(pins))


def merge_stages(files: Sequence[Path], inputs: Sequence[str], outputs: Sequence[str]) -> bytes:
    """The stage graphs joined back into one model. Stages meet at tensor names and carried
    tensors keep theirs, so the union of the nodes is the sliced graph; constants the slicer
    cloned into several stages are kept once."""
    import onnx
    from onnx import helper

    models = []
    for path in files:
        with _naming(path):
            models.append(onnx.load(str(path)))
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
                graph_rows: Sequence[int] = (), pins: Sequence[Sequence[int]] = ()) -> Engine:
    """The engine the manifest names for ``stage``, loaded from ``version_dir`` for ``device``
    (``threads``, ``spinning``, ``between_runs``, ``pins``: see ``ort_options``; ``graph_rows``: a torch
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
    with _naming(path, f"stage {stage.index}: "):
        if stage.engine == "torch":
            engine = TorchEngine(path, outputs, device, threads, stage.precision, graph_rows, f"stage {stage.index}")
        elif not on_cpu:
            engine = TensorRTEngine(path, outputs, device)
        else:
            engine = OnnxRuntimeEngine(path, outputs, threads, spinning, between_runs, pins)
    check_names(engine, stage, path.name)
    return engine


@contextlib.contextmanager
def _naming(path: Path, prefix: str = "") -> Iterator[None]:
    """A stage file that cannot be read or loaded fails naming it (what it raises alone, a
    protobuf ``DecodeError`` for one, does not)."""
    try:
        yield
    except Exception as exc:
        raise RuntimeError(f"{prefix}{path} cannot be loaded ({type(exc).__name__}: {exc}); re-run the slicer") from exc


def check_names(engine: Engine, stage: StageSpec, what: str) -> None:
    """Refuse an engine that does not take the inputs the manifest feeds the stage, or cannot
    compute the outputs it reads (a stage file from another slicing; a hand-edited manifest):
    loaded, every batch through it would fail."""
    takes, gives = map(set, engine.names())
    fed, read = {t.name for t in stage.inputs}, {t.name for t in stage.outputs}
    wrong = ([f"takes {sorted(takes - fed)}, which manifest.json does not give it"] if takes - fed else []) + (
        [f"does not compute {sorted(read - gives)}, which manifest.json reads from it"] if read - gives else [])
    if wrong:
        raise ValueError(f"stage {stage.index} ({what}) {' and '.join(wrong)}: the stage files and manifest.json "
                         "are from different slicings; re-run the slicer")


def _stage_file(stage: StageSpec, version_dir: Path) -> Path:
    path = Path(version_dir) / stage.file
    if not path.is_file():
        raise FileNotFoundError(f"stage {stage.index}: {path} is missing; re-run the slicer")
    return path


def run_stages(engines: Sequence[Engine], stages: Sequence[StageSpec], buffer: Mapping[str, Any],
               clock: list[float] | None = None) -> Tensors:
    """Run ``buffer`` through the stages in order, each seeing only the previous one's outputs and
    carried tensors: the chain the executors run, without the pipeline (the slicer verifies with
    it; a model served plain serves with it). ``clock`` gets ``time.monotonic()`` as each stage
    returns (a list append, not a callback: a model served plain pays it per stage and batch)."""
    current = dict(buffer)
    for engine, stage in zip(engines, stages):
        computed = engine.run({t.name: current[t.name] for t in stage.inputs})
        current = {**{name: current[name] for name in stage.carry}, **computed} if stage.carry else computed
        if clock is not None:
            clock.append(time.monotonic())
    return current
