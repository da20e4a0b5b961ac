"""Measurements that ``tools.compare`` and ``tools.tune`` share: several models of one repository
served by one tritonserver, loaded side by side with the same requests.

- ``peak``: the paper's stepping load (Poisson, rising in steps) until a step's latency passes
  the QoS; the peak is the last rate every step up to which stayed within it;
- ``window``: Poisson arrivals at a rate for a while, after an unmeasured warm-up at that rate,
  with the metrics the backend exported meanwhile (batch sizes formed, meta operations);
- ``capacity``: closed-loop throughput, to place the stepping load's rates.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools import metrics as prom
from tools.load.runner import LoadGenerator, Phase, Run, fixed, stepping
from tools.load.stats import Record, Summary
from tools.load.transport import make_transport
from tools.load.workload import ModelInterface, Request
from tools.serve import Server

METRICS_SETTLE_S = 1.3  # the backend exports its counters about once a second


def stepping_rates(capacity: float, steps: int) -> list[float]:
    """Requests/s of the stepping load: tenths of ``capacity`` up to it, then 15 % more each step,
    so that a configuration batching far better than the one probed still meets its peak."""
    rates = [capacity * (i + 1) / 10 for i in range(min(steps, 10))]
    while len(rates) < steps:
        rates.append(rates[-1] * 1.15)
    return [round(r, 1) for r in rates]


@dataclass(frozen=True)
class Stepping:
    """One stepping load: every step's rate and numbers, every request, and the peak."""

    rates: tuple[float, ...]
    steps: tuple[Summary, ...]
    records: tuple[Record, ...]
    peak: float  # requests/s of the last step within the QoS (0: not even the first)
    peak_throughput: float  # what came back per second during that step
    capped: bool = False  # every step met the QoS: the peak is at least ``peak``


@dataclass(frozen=True)
class Window:
    rate: float
    summary: Summary
    batches: dict[tuple[int, int], float] = field(default_factory=dict)  # (stage, rows) -> batch items
    meta: dict[str, float] = field(default_factory=dict)  # meta operation -> count


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    """A tritonserver on free local ports serving ``repository``, which loads models only when
    told to (``load``), so that candidates can be written while it runs; a context manager."""

    def __init__(self, repository: Path, log: Path | None = None, timeout_s: float = 60.0):
        self.server = Server(repository, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                             log=log, extra_args=["--model-control-mode=explicit"])
        self.timeout_s = timeout_s

    def load(self, model: str) -> None:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            client.load_model(model)

    def unload(self, model: str) -> None:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            client.unload_model(model)

    def __enter__(self) -> Bench:
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    @property
    def metrics_url(self) -> str:
        return f"http://{self.server.host}:{self.server.metrics_port}/metrics"

    def interface(self, model: str) -> ModelInterface:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(self.server.grpc_url) as client:
            return ModelInterface.from_config(client.get_model_config(model, as_json=True)["config"])

    def run(self, model: str, requests: Sequence[Request], plan, seed: int = 0, percentiles=(99,)) -> Run:
        outputs = self.interface(model).outputs
        transport = make_transport("grpc", self.server.grpc_url, model, "", requests, outputs)
        generator = LoadGenerator(transport, requests, "poisson", timeout_s=self.timeout_s, seed=seed)
        return generator.run(plan, percentiles=percentiles)

    def capacity(self, model: str, requests: Sequence[Request], concurrency: int, seconds: float) -> float:
        """Requests/s a closed loop of ``concurrency`` gets answered (after a warm-up of a third)."""
        run = self.run(model, requests, fixed([Phase(seconds / 3, concurrency=concurrency),
                                               Phase(seconds, concurrency=concurrency)]))
        summary = run.summary(run.phases[1:])
        return summary.throughput / max(1, requests[0].rows)

    def peak(self, model: str, requests: Sequence[Request], rates: Sequence[float], step_s: float, qos_ms: float,
             percentile: int | None = 99, seed: int = 0) -> Stepping:
        run = self.run(model, requests, stepping(rates, step_s, qos_ms, percentile), seed)
        steps = tuple(run.summary([p], (percentile,) if percentile else ()) for p in run.phases)
        peak = throughput = 0.0
        passed = 0
        for rate, step in zip(rates, steps):
            latency = step.latency(percentile)
            if step.failures or not latency <= qos_ms:
                break
            peak, throughput, passed = rate, step.throughput, passed + 1
        return Stepping(tuple(rates[:len(steps)]), steps, tuple(run.records), peak, throughput,
                        capped=passed == len(rates))

    def window(self, model: str, requests: Sequence[Request], rate: float, seconds: float, warmup_s: float,
               seed: int = 0) -> Window:
        before = prom.scrape(self.metrics_url)
        run = self.run(model, requests, fixed([Phase(warmup_s, rate=rate), Phase(seconds, rate=rate)]), seed)
        time.sleep(METRICS_SETTLE_S)
        grown = prom.delta(before, prom.scrape(self.metrics_url))
        batches, meta = {}, {}
        for labels, value in prom.select(grown, "dvabatch_batches_total", model=model).items():
            labels = dict(labels)
            if value:
                batches[(int(labels["stage"]), int(labels["rows"]))] = value
        for labels, value in prom.select(grown, "dvabatch_meta_operations_total", model=model).items():
            if value:
                meta[dict(labels)["kind"]] = value
        return Window(rate, run.summary(run.phases[1:], (99,)), batches, meta)
