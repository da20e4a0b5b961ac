"""Triton's entry point for every model whose config.pbtxt says ``backend: "dvabatch"``.

Only Triton glue lives here: requests become ``Query`` objects for the server ``serving.serve``
built (``serving.Server``; the requests of a call without a deadline run inside ``execute``,
just their inputs: ``Server.run_straight``), which says per ``execute`` whether the batch runs
inside it or is handed over. Handed over, ``execute`` returns at once or once stage 0 has computed them (where
the CPU caps the pipeline: meanwhile Triton gathers the requests that arrive into its next
batch; ``decide.waits``), so Triton hands over the next batch while earlier ones are still
running (Triton 24.06+ allows this in the default, non-decoupled mode); responses ready by then
go back in the list ``execute`` returns, the rest from their requests' own response senders
(``query.Handover``). Run inside (a model served plain, a lone batch: ``decide``), every
response goes back in the list ``execute`` returns, in the one message it sends anyway, where
each ``send()`` is a round trip of its own; on engines that run ahead of the host (a GPU;
timed) the responses are built while they compute. A decoupled model (``model_transaction_policy``,
for streaming clients) sends every response through its request's sender and returns none. The
runtime's counters reach Triton's metrics endpoint through the custom metrics API. What
config.pbtxt says of the model's tensors is checked against the sliced model when it loads
(``interface.py``).
"""

import dataclasses
import gc
import importlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from operator import methodcaller
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

from . import interface
from .arrival import TritonQueue
from .config import QueuePolicy, RuntimeConfig, triton_parameters
from .device import make_device
from .host import instances_of
from .manifest import Manifest
from .calibrate import process_cpu_s
from .metrics import FAMILIES, SERVING, Metrics
from .query import Handover, Query, Responder, rows_of
from .serving import serve

METRICS_INTERVAL_S = 1.0
_TIMEOUT = methodcaller("timeout")  # a request's own timeout, in us (0: none)
log = logging.getLogger(__name__)


def refuse_numpy_this_stub_cannot_pass() -> None:
    """Refuse to load where this stub would answer every request empty. Triton 24.10's stubs
    (pybind11 2.10) read numpy 2's dtypes at numpy 1's offsets: every tensor they build from
    numpy has no bytes (outputs arrive empty, inputs read as zeros) and nothing says so. The stub
    ignores PYTHONPATH and takes its packages from the first ``python3`` on tritonserver's PATH.
    Under numpy 2 a tensor is built through the stub once and compared: a stub that handles
    numpy 2 loads."""
    import numpy as np

    if int(np.__version__.split(".")[0]) < 2:
        return
    probe = np.arange(6, dtype=np.float32)
    if not np.array_equal(pb_utils.Tensor.from_dlpack("probe", probe).as_numpy(), probe):
        raise RuntimeError(
            f"this Python backend stub passes numpy {np.__version__}'s tensors empty (it was built for numpy 1; "
            f"numpy from {Path(np.__file__).parent}): give tritonserver a Python with numpy<2 first on its PATH "
            "(the stub ignores PYTHONPATH and takes the first python3 on PATH; tools/gpu_host.sh makes one)")


class MetricsExporter(threading.Thread):
    """Copies the runtime's counters into Triton's custom metrics about once a second (and once
    more when the model unloads), so the hot path never waits on the Triton process.

    A model's instances (``instance_group`` count) export into the same series, which Triton
    keeps once per family and labels: a counter, which each adds only its growth to, is their
    sum, as Triton's own per-model counters are. A gauge is set, so each instance's own carries
    an ``instance`` label (``instance``: Triton's instance name): set into one series, the last
    writer's value would stand for all of them (one instance's queries in flight; ``serving``
    flipping between two instances' modes). A stub Triton restarts sets its instance's again."""

    def __init__(self, metrics: Metrics, gauges, labels: dict[str, str], instance: str):
        super().__init__(name="dvabatch-metrics", daemon=True)
        self._metrics, self._gauges = metrics, gauges
        self._labels = {"counter": labels, "gauge": {**labels, "instance": instance}}
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
        except Exception:  # metrics must never take serving down; the next flush catches up
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
                self._series[key] = self._families[name].Metric(labels={**self._labels[family.kind], **dict(labels)})
            # Each call is a round trip to the Triton process, and in Triton 24.10 a gauge's set
            # holds the GIL through it (60 us: execute waits), so only what changed is sent.
            sent = self._sent.get(key)
            if family.kind == "counter" and value > (sent or 0.0):
                self._series[key].increment(value - (sent or 0.0))
            elif family.kind == "gauge" and value != sent:
                self._series[key].set(value)
            self._sent[key] = value


def _round_trip():
    """One call to Triton's process and back, as a response's ``send()`` makes (``calibrate.py``
    times it): reading a gauge of this backend's own family."""
    family = pb_utils.MetricFamily(name=SERVING.name, description=SERVING.description,
                                   kind=pb_utils.MetricFamily.GAUGE)
    gauge = family.Metric(labels={"probe": "round_trip"})
    return lambda: (family, gauge.value())  # the family must outlive its metric


def _trace_file(model: str):
    """With ``DVABATCH_TRACE=PREFIX`` in tritonserver's environment, each model instance writes
    ``PREFIX-<model>-<pid>.tsv``: a line per ``execute`` call and per batch item a stage ran
    (what, began and ended in ``time.monotonic()`` seconds, requests or rows), to see where a
    pipeline waits (``python -m tools.trace``); a batch run inside ``execute`` (``decide``)
    shows as its ``execute`` line alone. Off by default: it costs a write per item."""
    prefix = os.environ.get("DVABATCH_TRACE")
    return open(f"{prefix}-{model}-{os.getpid()}.tsv", "w", buffering=1) if prefix else None


def _windows_log(model: str) -> Callable[[str], None] | None:
    """With ``DVABATCH_LOG_WINDOWS=1`` in tritonserver's environment, the log gets a line for each
    window the mode switch read (each second a model under ``auto`` serves): what it measured and
    how it read each way, so that a choice can be followed back to its figures on the host that
    made it. Off by default: a line a second is noise in a server's log. (Triton's own
    ``--log-verbose`` would also log every request.)"""
    if os.environ.get("DVABATCH_LOG_WINDOWS", "0") in ("", "0"):
        return None
    return lambda line: pb_utils.Logger.log_info(f"{model}: {line}")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        refuse_numpy_this_stub_cannot_pass()
        version_dir = Path(args["model_repository"]) / args["model_version"]
        self._manifest = Manifest.load(version_dir)
        config = json.loads(args["model_config"])
        interface.check(config, self._manifest)
        # Decoupled (``model_transaction_policy``, for gRPC streaming clients): each request's one
        # response goes through its sender, flagged final, and ``execute`` returns none.
        self._decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        batch = int(config["max_batch_size"])
        self._queue = QueuePolicy.from_model_config(config)
        self._reached = TritonQueue(batch, self._queue.delay_us / 1e6)
        runtime_config = dataclasses.replace(RuntimeConfig.from_parameters(triton_parameters(config)),
                                             queue=self._queue)
        device = make_device(args.get("model_instance_kind", "CPU"), int(args.get("model_instance_device_id", 0)))
        metrics = Metrics()
        self._trace = _trace_file(args["model_name"])
        stage_ran = None if self._trace is None else (lambda stage, item, began, ended: self._trace.write(
            f"stage{stage}\t{began:.6f}\t{ended:.6f}\t{item.num}\n"))
        decision, server = serve(self._manifest, version_dir, runtime_config, device, metrics, on_death=self._died,
                                 trace=stage_ran, round_trip=_round_trip(),
                                 server_cpu_s=lambda: process_cpu_s(os.getppid()),
                                 said=lambda line: pb_utils.Logger.log_info(f"{args['model_name']}: {line}"),
                                 instances=instances_of(config), decoupled=self._decoupled,
                                 windows=_windows_log(args["model_name"]), model=args["model_name"])
        pb_utils.Logger.log_info(f"{args['model_name']}: {decision.describe()} (backend/decide/)")
        if decision.moved:
            pb_utils.Logger.log_warn(f"{args['model_name']}: {decision.moved}")
        self._server = server
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self._metrics = metrics
        self._exporter = MetricsExporter(metrics, server.gauges, labels, args["model_instance_name"])
        self._exporter.start()
        # What loading made (modules, graphs, tables) lives as long as the model: keep the
        # collector from scanning it again at every full collection (a few ms each, paused
        # execute; with numpy alone 24k objects, 3.7 ms).
        gc.freeze()

    @staticmethod
    def _died(reason: str) -> None:
        """An executor thread died and the runtime answered what it held. Triton cannot be told
        that a Python model is not ready, but it does notice a stub that exits: the stub ends
        itself a moment later (its answers flushed), and ``tools.serve``'s StubWatch (or an
        operator's reload) brings the model back."""
        pb_utils.Logger.log_error(f"dvabatch: {reason}; this model's stub exits so that it can be loaded again")
        threading.Timer(1.0, os._exit, args=(1,)).start()

    def is_ready(self) -> bool:
        """Asked by Triton 26.03 and newer (python_backend PR #430; older releases never call
        it): false once the pipeline cannot serve (an executor died; the stub then exits so that
        the model can be loaded again), so that a server run with ``--strict-readiness`` reports
        not ready meanwhile. A model served as a plain one has no threads to lose."""
        return self._server.ready

    def execute(self, requests: list) -> list | None:
        began = time.monotonic()
        returned = 0
        try:
            responses, returned = self._execute(requests, began)
            return responses
        finally:
            ended = time.monotonic()
            self._metrics.executed(ended - began, self._reached.ended(began, ended), returned)
            if self._trace is not None:
                self._trace.write(f"execute\t{began:.6f}\t{ended:.6f}\t{len(requests)}\n")

    def _execute(self, requests: list, began: float) -> tuple[list | None, int]:
        """What ``execute`` returns, and how many queries it ran and returned itself (0 where
        the pipeline answers them). The way of most calls served plain (none with a deadline:
        ``Server.run_straight``) is written out here, calling as few functions as it can: in a
        stub every function a call touches costs microseconds of cold caches, more than its work
        (a dozen steps of this path cost 1-4 us a call each at near-zero compute, measured section by
        section in a stub: docs/results/served-plain-flat)."""
        if not requests:
            return None if self._decoupled else [], 0
        inputs = [{tensor.name(): tensor.as_numpy() for tensor in request.inputs()} for request in requests]
        server = self._server
        inline = server.runs_inline(inputs)
        if inline and not self._queue.any_deadline(map(_TIMEOUT, requests)):
            responses: list = []  # built while the engines compute (``Server.run_straight``)
            rows = server.run_straight(inputs, lambda replies: responses.extend(map(self._response_of, replies)))
            if rows:
                self._reached.called(len(requests), rows, began)
                return self._returned(requests, responses), len(requests)
        elif not inline:  # out of Triton's shared memory: the pipeline runs them after execute() returned
            inputs = [{name: array.copy() for name, array in tensors.items()} for tensors in inputs]
        # Every call moves on when the next one's requests are taken to have reached Triton
        # (``arrival.py``); each request's deadline counts from when this one's did. Each request
        # has a row at least: only a call of fewer requests than a full batch counts them.
        count = len(requests)
        reached = self._reached.spread(count, count if count >= self._reached.max_rows else sum(map(rows_of, inputs)),
                                       began)
        if not inline:
            handover = Handover([self._sender(request) for request in requests], keeps=not self._decoupled)
            self._server.submit(self._queries(requests, inputs, reached, lambda i: lambda outputs, failure:
                                              handover.deliver(i, self._response_of((outputs, failure)))))
            responses = handover.close()
            return None if self._decoupled else responses, 0
        # Every query is answered, its reply kept on it, before the engines are done: the
        # responses are built meanwhile, on arrays filled by the time run returns.
        queries = self._queries(requests, inputs, reached)
        responses = []
        self._server.run(queries, lambda: responses.extend([self._response_of(q.reply) for q in queries]))
        return self._returned(requests, responses), len(requests)

    def _returned(self, requests: list, responses: list) -> list | None:
        """What ``execute`` returns of the responses of a call run inside it: the list, or, where the
        model is decoupled, none, each sent through its request's sender."""
        if not self._decoupled:
            return responses
        for request, response in zip(requests, responses):
            self._sender(request)(response)
        return None

    def _queries(self, requests: list, inputs: list[dict], reached: tuple[float, float],
                 respond: Callable[[int], Responder] | None = None) -> list[Query]:
        """The requests, with their ``inputs`` (read in one pass over each request's tensors:
        Triton admits only the inputs config.pbtxt names, and a missing one is left out, for
        validation to name; get_input_tensor_by_name walks them again for every input), as
        Queries, the i-th answered through ``respond(i)`` or, without it, keeping its reply. A
        deadline counts from when its request is taken to have reached Triton (``reached``: the
        first at ``since + step / 2``, the next ``step`` later, ``TritonQueue.spread``): it may
        have waited in Triton's queue while this instance was busy."""
        now = time.monotonic()
        since, step = reached
        queries = []
        for i, (request, tensors) in enumerate(zip(requests, inputs)):
            timeout_us = self._queue.timeout_us(request.timeout())  # 0: none
            deadline = min(now, since + step * (i + 0.5)) + timeout_us / 1e6 if timeout_us else None
            queries.append(Query(tensors, None if respond is None else respond(i), now, deadline, request.is_cancelled))
        return queries

    def finalize(self) -> None:
        self._server.close()
        self._exporter.stop()
        if self._trace is not None:
            self._trace.close()

    @staticmethod
    def _sender(request):
        return lambda response: request.get_response_sender().send(
            response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _response_of(reply: tuple | None):
        """The InferenceResponse of a query's (outputs, failure); an error response where there
        is none or it cannot be built, so that no request is left hanging."""
        if reply is None:
            log.error("a request was not answered")
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("the request was not answered (a bug)"))
        outputs, failure = reply
        try:
            if failure is None:
                return pb_utils.InferenceResponse([pb_utils.Tensor(n, a) for n, a in outputs.items()])
            code = getattr(pb_utils.TritonError, failure.code.name, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(failure.message, code))
        except Exception as exc:  # a bad output fails its own request, logged
            log.exception("could not build a response")
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"the response could not be built: {type(exc).__name__}: {exc}"))
