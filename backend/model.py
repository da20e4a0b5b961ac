"""Triton's entry point for every model whose config.pbtxt says ``backend: "dvabatch"``.

Only Triton glue lives here: requests become ``Query`` objects answered from their own response
senders, and ``execute`` returns None at once, so Triton can hand over the next batch while
earlier ones are still running (Triton 24.06+ allows this in the default, non-decoupled mode).
With ``batching: triton`` (the baselines) ``execute`` runs its batch to completion first. The
runtime's counters reach Triton's metrics endpoint through the custom metrics API.
"""

import dataclasses
import importlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils

# Triton's stub imports this file as a top-level module. Import the folder it lives in as a
# package, whatever it is called (backend/ in the repository, dvabatch/ in a Triton install),
# so the runtime modules beside this file can use relative imports.
if not __package__:
    _HERE = Path(__file__).resolve().parent
    sys.path.insert(0, str(_HERE.parent))
    importlib.import_module(_HERE.name)
    __package__ = _HERE.name

from .config import QueuePolicy, RuntimeConfig, triton_parameters  # noqa: E402
from .device import make_device  # noqa: E402
from .engine import cpu_cores, load_engines  # noqa: E402
from .manifest import Manifest  # noqa: E402
from .metrics import FAMILIES, Metrics  # noqa: E402
from .query import Query  # noqa: E402
from .runtime import Runtime  # noqa: E402
from .whole import WholeBatch  # noqa: E402

METRICS_INTERVAL_S = 1.0
log = logging.getLogger(__name__)


class MetricsExporter(threading.Thread):
    """Copies the runtime's counters into Triton's custom metrics about once a second (and once
    more when the model unloads), so the hot path never waits on the Triton process."""

    def __init__(self, metrics: Metrics, gauges, labels: dict[str, str]):
        super().__init__(name="dvabatch-metrics", daemon=True)
        self._metrics, self._gauges, self._labels = metrics, gauges, labels
        self._families: dict = {}
        self._series: dict = {}
        self._sent: dict = {}
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(METRICS_INTERVAL_S):
            self.flush()

    def stop(self) -> None:
        self._stopping.set()
        self.join()
        self.flush()

    def flush(self) -> None:
        try:
            self._flush()
        except Exception:  # noqa: BLE001 - metrics must never take serving down; the next flush catches up
            log.exception("could not export the metrics")

    def _flush(self) -> None:
        values = {**self._metrics.snapshot(), **{(f.name, ()): v for f, v in self._gauges().items()}}
        for key, value in values.items():
            name, labels = key
            family = FAMILIES[name]
            if key not in self._series:
                if name not in self._families:
                    kind = pb_utils.MetricFamily.COUNTER if family.kind == "counter" else pb_utils.MetricFamily.GAUGE
                    self._families[name] = pb_utils.MetricFamily(name=name, description=family.description, kind=kind)
                self._series[key] = self._families[name].Metric(labels={**self._labels, **dict(labels)})
            if family.kind == "counter":
                if value > self._sent.get(key, 0.0):
                    self._series[key].increment(value - self._sent.get(key, 0.0))
                    self._sent[key] = value
            else:
                self._series[key].set(value)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self._manifest = Manifest.load(version_dir)
        config = json.loads(args["model_config"])
        if config.get("max_batch_size", 0) > self._manifest.max_batch_size:
            raise ValueError(
                f"max_batch_size {config['max_batch_size']} in config.pbtxt exceeds the "
                f"{self._manifest.max_batch_size} the model was sliced for"
            )
        self._queue = QueuePolicy.from_model_config(config)
        runtime_config = dataclasses.replace(RuntimeConfig.from_parameters(triton_parameters(config)),
                                             queue=self._queue)
        device = make_device(args.get("model_instance_kind", "CPU"), int(args.get("model_instance_device_id", 0)))
        whole = runtime_config.batching == "triton"
        threads = runtime_config.intra_op_thread_count or cpu_cores()
        fused = not whole and runtime_config.policy.fuses(self._manifest)
        if fused:
            pb_utils.Logger.log_info(
                f"{args['model_name']}: policy {runtime_config.policy.name} runs the {len(self._manifest.stages)} "
                "stages back to back in one executor (the pipeline cannot pay on this model; backend/diversity.py)")
        alone = whole or fused or len(self._manifest.stages) == 1  # one session runs at a time
        engines = load_engines(self._manifest, version_dir, device, threads, runtime_config.spins(alone), fused)
        metrics = Metrics()
        if whole:
            runtime_config.bind(self._manifest)
            self._whole, self._runtime = WholeBatch(self._manifest, engines, device, metrics, runtime_config.pad_values,
                                                    runtime_config.size_limits(self._manifest)), None
        else:
            self._whole, self._runtime = None, Runtime(self._manifest, engines, runtime_config, device,
                                                       metrics=metrics, on_death=self._died)
        gauges = self._runtime.gauges if self._runtime is not None else dict
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self._exporter = MetricsExporter(metrics, gauges, labels)
        self._exporter.start()

    @staticmethod
    def _died(reason: str) -> None:
        """An executor thread died and the runtime answered what it held. Triton cannot be told
        that a Python model is not ready, but it does notice a stub that exits: the stub ends
        itself a moment later (its answers flushed), and ``tools.serve``'s StubWatch (or an
        operator's reload) brings the model back."""
        pb_utils.Logger.log_error(f"dvabatch: {reason}; this model's stub exits so that it can be loaded again")
        threading.Timer(1.0, os._exit, args=(1,)).start()

    def execute(self, requests: list) -> None:
        queries = [self._query(request) for request in requests]
        if self._whole is not None:
            self._whole.run(queries)
        else:
            self._runtime.submit(queries)
        return None

    def finalize(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
        self._exporter.stop()

    def _query(self, request) -> Query:
        inputs = {}
        for spec in self._manifest.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is not None:
                # Copy out of Triton's shared memory: the batch runs after execute() returns.
                inputs[spec.name] = tensor.as_numpy().copy()
        sender = request.get_response_sender()

        def respond(outputs, failure):
            if failure is not None:
                code = getattr(pb_utils.TritonError, failure.code.name, pb_utils.TritonError.INTERNAL)
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(failure.message, code))
            else:
                response = pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in outputs.items()])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        arrived = time.monotonic()
        timeout_us = self._queue.timeout_us(request.timeout())  # 0: none
        return Query(inputs=inputs, respond=respond, requested_outputs=tuple(request.requested_output_names()),
                     arrived=arrived, deadline=arrived + timeout_us / 1e6 if timeout_us else None,
                     cancelled=request.is_cancelled)
