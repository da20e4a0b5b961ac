"""The Python each model's ``execute`` runs per request, outside Triton (a measurement aid, not a test).

    python docs/results/fused-path-cost/python_cost.py [--requests N] [--batch B] [--ragged]
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python ... --model auto --requests N

Loads the dvabatch backend's ``model.py`` (``auto``, which steps aside on this profile and serves
fused inside ``execute``) and the plain peer's ``model.py`` on the TensorRT-speed BERT-base
profile, with ``time.sleep`` made free so only their Python counts, and calls ``execute`` on
batches of ``B`` requests. The requests and responses are a minimal stand-in for the Python
backend's ``triton_python_backend_utils`` (the stub's own objects need a running tritonserver;
what they cost is the same for both models). Prints microseconds per request, best of 7 runs.
With ``--ragged`` ours gets RTE-like unpadded lengths and the plain model 128 tokens, as a
client that pads sends them. Run under callgrind at two ``--requests`` to get instructions per
request from the difference (repeatable on a busy machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
PROFILE = ROOT / "docs" / "profiles" / "bert_base_trt_a100_2stages.json"
NAMES = ("input_ids", "attention_mask", "token_type_ids")


def stand_in() -> types.ModuleType:
    """What ``execute`` calls of ``triton_python_backend_utils``, doing nothing more."""
    pb = types.ModuleType("triton_python_backend_utils")

    class Tensor:
        def __init__(self, name, array):
            self._name, self._array = name, array

        def as_numpy(self):
            return self._array

    class TritonError:
        INTERNAL = INVALID_ARG = UNAVAILABLE = CANCELLED = 0

        def __init__(self, message, code=0):
            self.message = message

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self.outputs, self.error = output_tensors, error

    class Request:
        def __init__(self, inputs):
            self.inputs = {n: Tensor(n, a) for n, a in inputs.items()}

        def timeout(self):
            return 0

        def requested_output_names(self):
            return []

        def is_cancelled(self):
            return False

    class Logger:
        log_info = log_error = staticmethod(lambda message: None)

    class MetricFamily:
        COUNTER = GAUGE = 0

        def __init__(self, **kwargs):
            pass

        def Metric(self, labels):  # the Python backend's name
            return types.SimpleNamespace(increment=lambda value: None, set=lambda value: None)

    pb.Tensor, pb.TritonError, pb.InferenceResponse, pb.Request, pb.Logger = \
        Tensor, TritonError, InferenceResponse, Request, Logger
    pb.MetricFamily, pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = MetricFamily, 1
    pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
    return pb


def load(path: Path, repository: Path, name: str):
    from slicer.triton_config import parameters_of

    spec = importlib.util.spec_from_file_location(f"model_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = repository / name
    config = {"max_batch_size": 64, "input": [{"name": n} for n in NAMES],
              "output": [{"name": f"{n}_out"} for n in NAMES],
              "parameters": {k: {"string_value": v} for k, v in
                             parameters_of((folder / "config.pbtxt").read_text()).items()}}
    model = module.TritonPythonModel()
    model.initialize({"model_repository": str(folder), "model_version": "1", "model_config": json.dumps(config),
                      "model_name": name, "model_instance_name": f"{name}_0_0"})
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ragged", action="store_true")
    parser.add_argument("--model", choices=("plain", "auto", "both"), default="both")
    args = parser.parse_args()
    sys.modules["triton_python_backend_utils"] = pb = stand_in()
    from tools.bench_cost import build

    repository = Path(tempfile.mkdtemp(prefix="python-cost-"))
    build(PROFILE, repository, {})
    time.sleep = lambda seconds: None  # before the models load: the timed engine keeps its sleep
    files = {"plain": ROOT / "tools" / "lib" / "plain_model.py", "auto": ROOT / "backend" / "model.py"}
    models = {name: load(path, repository, name) for name, path in files.items() if args.model in (name, "both")}
    random.seed(0)
    lengths = [random.choice((30, 41, 53, 60, 75, 90, 110, 128)) if args.ragged else 64 for _ in range(args.batch)]
    for name, model in models.items():
        sent = [128 if args.ragged and name == "plain" else n for n in lengths]
        requests = [pb.Request({n: np.ones((1, length), np.int64) for n in NAMES}) for length in sent]
        calls = max(1, args.requests // args.batch // 7)
        best = float("inf")
        for _ in range(7):
            began = time.perf_counter()
            for _ in range(calls):
                model.execute(requests)
            best = min(best, (time.perf_counter() - began) / (calls * args.batch))
        print(f"{name}: {best * 1e6:.1f} us a request (batches of {args.batch}{', ragged' if args.ragged else ''})")


if __name__ == "__main__":
    main()
