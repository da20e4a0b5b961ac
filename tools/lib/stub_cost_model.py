"""The model ``tools.stub_cost`` loads: it measures in ``initialize`` and answers nothing.

Copied as ``<repository>/stub_cost/1/model.py``; config.pbtxt's parameter ``settings`` names a
JSON file written by ``tools.stub_cost`` (the project's root, the two models' folders and Triton
configs, the queries, the batch sizes, the rounds, where the results go). In this stub,
``time.sleep`` does nothing, so a timed engine costs only the host's part of its run.
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

REPEATS = 4  # timings of each batch list per round; the least is kept (the others met other work)
BATCHES = 200  # batches per timing


def _requests(path: str, dtypes: dict, outputs: list) -> list:
    """Triton request objects (as a model's BLS calls build them) holding the queries of a
    perf_analyzer input-data file."""
    return [pb_utils.InferenceRequest(model_name="stub_cost", requested_output_names=outputs, inputs=[
        pb_utils.Tensor(name, np.asarray(value["content"], dtypes[name]).reshape(value["shape"])[None])
        for name, value in entry.items()]) for entry in json.loads(Path(path).read_text())["data"]]


def _model(module, folder: str, name: str, config: dict):
    model = module.TritonPythonModel()
    model.initialize({"model_repository": folder, "model_version": "1", "model_name": name,
                      "model_config": json.dumps(config), "model_instance_kind": "CPU",
                      "model_instance_name": f"{name}_0_0", "model_instance_device_id": "0"})
    return model


def _cpu_us_per_request(execute, batches: list, evict: np.ndarray) -> float:
    """The least over ``REPEATS`` of the thread's CPU microseconds per request of ``execute`` on
    ``batches``; ``evict`` (if not empty) is read before each call, untimed, to push the call's
    code and data out of the caches."""
    least = float("inf")
    for _ in range(REPEATS):
        spent = 0.0
        for batch in batches:
            if evict.size:
                evict.sum()
            began = time.thread_time()
            execute(batch)
            spent += time.thread_time() - began
        least = min(least, spent)
    return least / sum(map(len, batches)) * 1e6


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        settings = json.loads(Path(config["parameters"]["settings"]["string_value"]).read_text())
        time.sleep = lambda seconds: None
        sys.path.insert(0, settings["root"])
        from backend import model as ours_module
        from backend.decide import Mode
        from backend.whole import WholeBatch

        plain_file = Path(settings["plain"]["folder"]) / "1" / "model.py"
        spec = importlib.util.spec_from_file_location("plain_model", plain_file)
        plain_module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(plain_module)
        ours = _model(ours_module, **settings["ours"])
        plain = _model(plain_module, **settings["plain"])
        server = ours._server  # how it serves, as the backend decided when it loaded
        if not isinstance(server, WholeBatch):
            if server.watch is None or server.watch.switch.pinned:  # (a configured policy: pipelines always)
                ours.finalize()
                raise ValueError(f"{settings['ours']['name']} pipelines here: stub_cost measures a model served "
                                 "inside execute (auto, served plain, or batching: triton)")
            server.watch.stop()  # auto on engines that overlap, as its mode switch serves it plain
            server.mode = Mode.IN_TURN
        sent = _requests(settings["sent"], settings["dtypes"], settings["outputs"])
        padded = _requests(settings["padded"], settings["dtypes"], settings["outputs"])
        ways = {"ours": (ours.execute, sent), "plain": (plain.execute, padded)}
        if settings["padded"] != settings["sent"]:
            ways["ours, padded"] = (ours.execute, padded)
        evict = np.ones(settings["evict_mb"] * 2**20 // 8)
        rng = np.random.default_rng(0)
        results = {}
        for _ in range(settings["rounds"]):
            for size in settings["batch_sizes"]:
                picks = [rng.choice(len(sent), size) for _ in range(BATCHES)]
                for way, (execute, requests) in ways.items():
                    batches = [[requests[i] for i in pick] for pick in picks]
                    results.setdefault(f"{size}", {}).setdefault(way, []).append(
                        _cpu_us_per_request(execute, batches, evict))
        ours.finalize()
        Path(settings["results"]).write_text(json.dumps(results))

    def execute(self, requests: list) -> list:
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("stub_cost answers nothing")) for _ in requests]
