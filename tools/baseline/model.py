"""Baseline for benchmarks: the unsliced ONNX model run to completion per batch.

Triton's dynamic batcher (delay 0) hands ``execute`` a batch; the whole batch runs in one ONNX
Runtime call and every request is answered when it ends (single-entry single-exit). The model
file is ``model.onnx`` beside this file in the version folder.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        options = ort.SessionOptions()
        options.log_severity_level = 3
        path = Path(__file__).parent / "model.onnx"
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i["name"] for i in config["input"]]
        self._outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        feeds = [{n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self._inputs} for r in requests]
        rows = [len(next(iter(f.values()))) for f in feeds]
        if all(f[n].shape[1:] == feeds[0][n].shape[1:] for f in feeds for n in self._inputs):
            stacked = {n: np.concatenate([f[n] for f in feeds]) for n in self._inputs}
            outputs = self._session.run(self._outputs, stacked)
            bounds = np.cumsum([0, *rows])
            per_request = [[o[a:b] for o in outputs] for a, b in zip(bounds, bounds[1:])]
        else:  # shapes differ (no padding here): run them one by one
            per_request = [self._session.run(self._outputs, f) for f in feeds]
        return [pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in zip(self._outputs, arrays)])
                for arrays in per_request]
