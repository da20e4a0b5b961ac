"""The ``onnxruntime`` engine: a stage as an ONNX Runtime session on the CPU, and its slicer
target (ONNX files; nodes timed by ONNX Runtime's own profiler)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..device import CpuDevice
from ..errors import TargetError
from ..manifest import TensorSpec
from ..sample import Probe, feed_at


def ort_options(threads: int | None = None, spinning: bool = False, between_runs: bool = False,
                pins: Sequence[Sequence[int]] = ()):
    """ONNX Runtime session options: quiet, and with ``threads`` set, that many intra-op threads
    that sleep rather than spin when idle unless ``spinning`` (an idle stage must not take cores
    from a busy one; a lone model on idle cores may gain from spinning). Spinning threads stop
    when a run ends (``session.force_spinning_stop``) unless ``between_runs``: where other
    sessions share the cores (a pipeline's stages, stages run in turn), the cores then belong to
    the threads that admit and answer queries and to the next stage (on MiniLM through a
    pipeline this beat both spinning between runs and never spinning); a session that runs
    alone (a fused model) keeps ONNX Runtime's default, as a plain model's session does (its
    threads are still spinning when the next batch comes: a 224x224 image model at one in flight
    0.84x the plain model's answers with the stop, 0.91x without; MiniLM level either way).
    ``pins``: the CPUs of each worker thread (``threads - 1`` of them; ``host.Cpus.pins``), for a
    session that runs alone, as ONNX Runtime pins a plain model's by default."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        options.add_session_config_entry("session.force_spinning_stop",
                                         "1" if spinning and not between_runs else "0")
        if pins:  # ONNX Runtime's processor ids count from 1
            options.add_session_config_entry("session.intra_op_thread_affinities",
                                             ";".join(",".join(str(cpu + 1) for cpu in core) for core in pins))
    return options


class OnnxRuntimeEngine:
    """A stage (a file, or a serialised model) as an ONNX Runtime session on the CPU (``threads``:
    see ``ort_options``)."""

    def __init__(self, model: Path | bytes, output_names: list[str], threads: int | None = None,
                 spinning: bool = False, between_runs: bool = False, pins: Sequence[Sequence[int]] = ()):
        import onnxruntime as ort

        options = ort_options(threads, spinning, between_runs, pins)
        self.pins = tuple(map(tuple, pins))  # each worker thread's CPUs, where pinned (for the model's log)
        model = model if isinstance(model, bytes) else str(model)
        self._session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self._outputs = output_names

    def names(self) -> tuple[list[str], list[str]]:
        return [i.name for i in self._session.get_inputs()], [o.name for o in self._session.get_outputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = {name: np.ascontiguousarray(array) for name, array in inputs.items()}
        return dict(zip(self._outputs, self._session.run(self._outputs, feed)))


class OnnxRuntimeTarget:
    """CPU: stages are ONNX files run by ONNX Runtime; nodes are timed by its profiler."""

    name = engine = "onnxruntime"
    suffix = ".onnx"
    optimizations = ("extended", "basic", "none")
    graphs = False

    def __init__(self, precision: str = "fp32"):
        if precision != "fp32":
            raise TargetError(f"--precision {precision}: the onnxruntime target runs FP32 only (use --target torch)")
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
                feed = feed_at(inputs, batch, length, axis, dim_sizes)
                for r in range(warmup + repeats):
                    session.run(None, feed)
                    plan.append(c if r >= warmup else -1)
                if progress:
                    progress("node profile", c + 1, len(configs))
            events = json.loads(Path(session.end_profiling()).read_text())
        starts = np.array(sorted(e["ts"] for e in events if e.get("name") == "model_run"))
        if len(starts) != len(plan):
            raise TargetError(f"ONNX Runtime's profile has {len(starts)} runs, {len(plan)} were made")
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
