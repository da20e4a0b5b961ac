"""A plain Triton Python-backend model: the baseline a Triton user writes by hand.

``tools.baselines`` copies this file as ``<model>/1/model.py`` beside the engine it runs, and
nothing of the dvabatch backend is on its path. Triton's dynamic batcher forms each batch;
``execute`` runs it and returns every response at once, as the Python backend's examples do.

The engine is ``model.onnx`` in the version folder (one ONNX Runtime session; with ``engine:
torch``, the torch interpreter ``onnx_torch.py`` copied beside it, on the instance's GPU or the
CPU at the ``precision`` the model was sliced for, as the dvabatch torch engine runs it, and with
``graph_rows`` replaying a CUDA graph per shape bucket through ``torch_graphs.py``, captured at
load: a batch's rows padded up to a bucket of ``graph_rows``, its length up to one of
``length_buckets``), or, for a simulated model,
``latency_ms.json``: it computes nothing, sleeps for the batch's tabulated time
(``ms[rows - 1][length]``, proportionally longer past the last length) and answers input i as
output i (an input ``work`` scales the time by its batch's largest value, as the dvabatch timed
engine does). config.pbtxt parameters:

- ``intra_op_thread_count``: ONNX Runtime's threads (the name Triton's onnxruntime backend uses;
  default: ONNX Runtime's own choice); ``allow_spinning``: ``false`` makes idle threads sleep
  (default: ONNX Runtime's, they spin);
- ``length_inputs`` / ``length_outputs`` (``name:axis,...``, axes without the batch axis): the
  tensors with a length axis; with ``ragged: true`` (and ``allow_ragged_batch`` on those inputs)
  requests of different lengths share a batch, padded with zeros to the longest (and on to a
  length bucket), and those outputs are cut back to each request's own length.

Without ragged inputs Triton batches only requests of equal shapes. A batch that fails runs
again request by request, so that only a request that cannot run gets an error.

With ``DVABATCH_TRACE=PREFIX`` in tritonserver's environment it writes a line per ``execute``
to ``PREFIX-<model>-<pid>.tsv``, as the dvabatch backend does (``python -m tools.trace``): how
long each call held the instance, beside ours, tells the Python inside ``execute`` from the
rest of a request's way.
"""

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

LAZY_GRAPHS = 64  # shapes an ensemble step captures as they first come (then it runs new ones eagerly)


def _axes(text: str) -> dict:
    return {name: int(axis) for name, _, axis in (item.partition(":") for item in text.split(",") if item)}


def _refuse_numpy_this_stub_cannot_pass() -> None:
    """As the dvabatch backend's ``model.refuse_numpy_this_stub_cannot_pass`` (nothing of it is
    on this file's path): Triton 24.10's stubs send numpy 2's tensors empty, silently."""
    if int(np.__version__.split(".")[0]) >= 2:
        probe = np.arange(6, dtype=np.float32)
        if not np.array_equal(pb_utils.Tensor.from_dlpack("probe", probe).as_numpy(), probe):
            raise RuntimeError(f"this Python backend stub passes numpy {np.__version__}'s tensors empty (built for "
                               "numpy 1): give tritonserver a Python with numpy<2 first on its PATH")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        _refuse_numpy_this_stub_cannot_pass()
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.length_inputs = _axes(parameters.get("length_inputs", ""))
        self.length_outputs = _axes(parameters.get("length_outputs", ""))
        self.ragged = parameters.get("ragged", "false") == "true"
        self.buckets = [int(v) for v in parameters.get("length_buckets", "").split(",") if v]
        self.session = self.graph = None
        prefix = os.environ.get("DVABATCH_TRACE")  # (the file stays open while the model is loaded: finalize)
        self.trace = open(f"{prefix}-{args['model_name']}-{os.getpid()}.tsv", "w", buffering=1) \
            if prefix else None  # noqa: SIM115
        if (folder / "latency_ms.json").is_file():
            self.table = json.loads((folder / "latency_ms.json").read_text())
            return
        if parameters.get("engine") == "torch":
            self.graph = self._torch_graph(folder, args, parameters)
            rows = [int(v) for v in parameters.get("graph_rows", "").split(",") if v]
            if rows:
                self._capture(folder, rows, config)
            return
        import onnxruntime as ort

        options = ort.SessionOptions()
        if int(parameters.get("intra_op_thread_count", "0")):
            options.intra_op_num_threads = int(parameters["intra_op_thread_count"])
        if parameters.get("allow_spinning", "").lower() == "false":
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])

    def execute(self, requests: list) -> list:
        if self.trace is None:
            return self._execute(requests)
        began = time.monotonic()
        responses = self._execute(requests)
        self.trace.write(f"execute\t{began:.6f}\t{time.monotonic():.6f}\t{len(requests)}\n")
        return responses

    def _execute(self, requests: list) -> list:
        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs}
                 for r in requests]
        responses = [None] * len(requests)
        for group in self._groups(feeds):
            try:
                answers = self._run([feeds[i] for i in group])
            except Exception:  # noqa: BLE001 - run each request alone: only one that cannot run fails
                answers = []
                for i in group:
                    try:
                        answers += self._run([feeds[i]])
                    except Exception as exc:  # noqa: BLE001
                        answers.append(pb_utils.TritonError(f"inference failed: {type(exc).__name__}: {exc}"))
            for i, answer in zip(group, answers):
                responses[i] = pb_utils.InferenceResponse(error=answer) if isinstance(answer, pb_utils.TritonError) \
                    else pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in answer.items()])
        return responses

    def finalize(self) -> None:
        if self.trace is not None:
            self.trace.close()

    def _groups(self, feeds: list) -> list:
        """Requests that run as one batch: all of them where ragged inputs are padded, else
        those of equal shapes."""
        if self.ragged:
            return [list(range(len(feeds)))]
        groups = {}
        for i, feed in enumerate(feeds):
            groups.setdefault(tuple(feed[n].shape for n in self.inputs), []).append(i)
        return list(groups.values())

    def _run(self, feeds: list) -> list:
        """Outputs of each request of one batch."""
        longest = {n: self._bucket(max(f[n].shape[1 + a] for f in feeds)) for n, a in self.length_inputs.items()}
        batch = {n: np.concatenate([self._pad(f[n], n, longest) for f in feeds]) for n in self.inputs}
        outputs = dict(zip(self.outputs, self._engine(batch)))
        answers, start = [], 0
        for feed in feeds:
            rows = feed[self.inputs[0]].shape[0]
            own = {n: feed[n].shape[1 + a] for n, a in self.length_inputs.items()}
            length = next(iter(own.values()), None)
            answer = {}
            for name, array in outputs.items():
                part = array[start:start + rows]
                axis = self.length_outputs.get(name)
                if axis is not None and length is not None and part.shape[1 + axis] != length:
                    part = np.take(part, range(length), axis=1 + axis)
                answer[name] = np.ascontiguousarray(part)
            answers.append(answer)
            start += rows
        return answers

    def _bucket(self, length: int) -> int:
        return next((b for b in self.buckets if b >= length), length)

    def _pad(self, array: np.ndarray, name: str, longest: dict) -> np.ndarray:
        if name not in self.length_inputs:
            return array
        axis = 1 + self.length_inputs[name]
        if array.shape[axis] == longest[name]:
            return array
        width = [(0, 0)] * array.ndim
        width[axis] = (0, longest[name] - array.shape[axis])
        return np.pad(array, width)

    @staticmethod
    def _module(folder: Path, name: str):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (dataclasses look their module up there)
        spec.loader.exec_module(module)
        return module

    def _torch_graph(self, folder: Path, args: dict, parameters: dict):
        import torch

        device = "cpu"
        precision = parameters.get("precision", "fp32")
        if args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args.get('model_instance_device_id', 0)}"
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        return self._module(folder, "onnx_torch").TorchGraph(folder / "model.onnx", device, precision)

    def _capture(self, folder: Path, rows: list, config: dict) -> None:
        """The CUDA graph of every (rows, length) bucket, largest first, from zero-filled inputs.
        Where the inputs' shapes are not known (an ensemble step's other axes), each shape is
        captured when it first comes, up to ``LAZY_GRAPHS`` of them."""
        self.graph = self._module(folder, "torch_graphs").ShapeGraphs(self.graph, rows, "plain model")
        for length in sorted(self.buckets, reverse=True) or [None]:
            for batch in sorted(rows, reverse=True):
                feed = {}
                for tensor in config["input"]:
                    dims = [int(d) for d in tensor["dims"]]
                    axis = self.length_inputs.get(tensor["name"])
                    if axis is not None and length is not None:
                        dims[axis] = length
                    if min(dims, default=0) < 0:
                        self.graph.limit = LAZY_GRAPHS
                        return
                    dtype = pb_utils.triton_string_to_numpy(tensor["data_type"])
                    feed[tensor["name"]] = np.zeros((batch, *dims), dtype)
                self.graph.run(feed, self.outputs)
        self.graph.capturing = False

    def _engine(self, batch: dict) -> list:
        if self.session is not None:
            return self.session.run(self.outputs, batch)
        if self.graph is not None:
            outputs = self.graph.run(batch, self.outputs)
            return [outputs[name].cpu().numpy() for name in self.outputs]
        first = batch[self.inputs[0]]
        rows, axis = first.shape[0], self.table["axis"]
        times = self.table["ms"][min(rows, len(self.table["ms"])) - 1]
        if axis is None:
            ms = times
        else:
            length = first.shape[1 + axis]
            ms = times[length] if length < len(times) else times[-1] * length / (len(times) - 1)
        if "work" in batch:  # an early-exit model's rows need this share of the time; the slowest decides
            ms *= max(float(batch["work"].max()), 0.0)
        if ms > 0:  # time.sleep(0) still takes some 90 us on a 2-core VM: an engine taking no time takes none
            time.sleep(ms / 1000)
        return [batch[name].copy() for name in self.inputs]
