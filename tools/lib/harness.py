"""What ``tools.compare`` and ``tools.tune`` share: models of one repository served by one
tritonserver and measured with the real perf_analyzer, the same data sent to each.

- ``window``: one perf_analyzer window (closed loop, Poisson rate or intervals) after a warm-up,
  with the batches each model formed meanwhile (Triton's statistics for models it batches, the
  backend's metrics for dvabatch models);
- ``capacity``: closed-loop throughput, to know where to look for the peak;
- ``peak``: the highest Poisson rate whose p99 (``percentile``) stays within the QoS, found by
  bisection: up by half while probes pass, down by half while they fail, then halving the bracket
  until it is within ``tolerance`` of the rate (5 % by default).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tools.lib import prometheus as prom
from tools.lib.perf_analyzer import PROTOCOL, Load, PerfAnalyzerError, Window, WindowLost, measure, protocol
from tools.lib.processes import free_port
from tools.lib.triton import Server

METRICS_SETTLE_S = 1.3  # the backend exports its counters about once a second
PEAK_TOLERANCE = 0.05  # a peak's bisection stops once its bracket is this close (``bisect_peak``)


@dataclass(frozen=True)
class Measured:
    """A window and the batches formed during it: (stage, rows) -> batches; and for a dvabatch
    model, its warm-up included, the seconds it served each way (mode -> seconds:
    ``dvabatch_serving_seconds_total``) and its ``execute`` calls (``executes``), with those in
    which a lone batch ran inline while it pipelined (``inline``: ``decide.LoneRuns``); both
    empty for a model Triton batches."""

    window: Window
    batches: dict[tuple[int, int], float] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    calls: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    rate: float
    window: Window
    passed: bool


@dataclass(frozen=True)
class Peak:
    """The last rate that met the QoS and the first above it that did not (inf: none failed)."""

    rate: float
    ceiling: float
    probes: tuple[Probe, ...]

    @property
    def reference(self) -> float:
        """What loads are set as fractions of: the peak, or where no probe met the QoS, the
        lowest rate probed."""
        return self.rate if self.rate > 0 else min(p.rate for p in self.probes)

    @property
    def resolution(self) -> float:
        """How far the true peak may lie above ``rate``, as a fraction of it."""
        return (self.ceiling - self.rate) / self.rate if self.rate > 0 else math.inf




class Bench:
    """A tritonserver on free local ports serving ``repository``, which loads models only when
    told to (``load``), so that candidates can be written while it runs; a context manager. Its
    windows go over gRPC, or HTTP where ``$DVABATCH_CLIENT_PROTOCOL`` says so (``measure``)."""

    def __init__(self, repository: Path, log: Path | None = None):
        self.server = Server(repository, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                             log=log, extra_args=["--model-control-mode=explicit"])

    def __enter__(self) -> Bench:
        sends = protocol()  # (a setting it cannot use is refused before the server starts)
        if sends != "grpc":
            print(f"dvabatch: perf_analyzer sends over {sends.upper()} ({PROTOCOL})", file=sys.stderr)
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()

    @property
    def url(self) -> str:
        return self.server.grpc_url

    def measure(self, model: str, load: Load, data: str | Path, seconds: float, warmup_s: float) -> Window:
        """One perf_analyzer window of ``load`` on ``model`` (``perf_analyzer.measure``), by the
        protocol ``$DVABATCH_CLIENT_PROTOCOL`` names."""
        return measure(model, self.url, load, data, seconds, warmup_s, http_url=self.server.http_url)

    @property
    def metrics_url(self) -> str:
        return f"http://{self.server.host}:{self.server.metrics_port}/metrics"

    def client(self):
        """A gRPC client of the server (a context manager)."""
        import tritonclient.grpc as grpcclient

        return grpcclient.InferenceServerClient(self.url)

    def load(self, model: str) -> None:
        with self.client() as client:
            client.load_model(model)

    def unload(self, model: str) -> None:
        with self.client() as client:
            client.unload_model(model)

    def _triton_batches(self, models: Sequence[str]) -> dict[tuple[int, int], float]:
        """Executions per (step, batch size) of models Triton batches, from its statistics."""
        counts = {}
        with self.client() as client:
            for step, model in enumerate(models):
                stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
                for entry in stats.get("batch_stats", []):
                    counts[(step, int(entry["batch_size"]))] = float(entry["compute_infer"]["count"])
        return counts

    def dvabatch_counts(self, model: str) -> tuple[dict[tuple[int, int], float], dict[str, float],
                                                   dict[str, float]]:
        """A dvabatch model's counts so far: batches by (stage, rows), seconds served by mode,
        and its calls (``Measured.calls``)."""
        values = prom.scrape(self.metrics_url)
        batches = prom.select(values, "dvabatch_batches_total", model=model)
        served = prom.select(values, "dvabatch_serving_seconds_total", model=model)
        calls = {"executes": sum(prom.select(values, "dvabatch_executes_total", model=model).values()),
                 "inline": sum(prom.select(values, "dvabatch_lone_batches_total", model=model, ran="inline").values())}
        return ({(int(dict(k)["stage"]), int(dict(k)["rows"])): v for k, v in batches.items()},
                {dict(k)["mode"]: v for k, v in served.items()}, calls)

    def serving(self, model: str) -> str:
        """How a dvabatch model serves now, by its ``dvabatch_serving`` gauge (``pipeline``,
        ``fused`` or ``in_turn``: ``backend/decide/``); "" where it exports none (a plain model,
        or before its first export)."""
        values = prom.select(prom.scrape(self.metrics_url), "dvabatch_serving", model=model)
        return next((dict(labels)["mode"] for labels, value in values.items() if value == 1), "")

    def window(self, model: str, load: Load, data: str | Path, seconds: float, warmup_s: float,
               batched_by_triton: Sequence[str] = ()) -> Measured:
        """One window of ``load``; ``batched_by_triton``: the models whose batches Triton forms (a
        plain model, an ensemble's steps), else the backend's own batches of ``model`` are read."""
        count = (lambda: (self._triton_batches(batched_by_triton), {}, {})) if batched_by_triton \
            else (lambda: self.dvabatch_counts(model))
        before = count()
        window = self.measure(model, load, data, seconds, warmup_s)
        if not batched_by_triton:
            time.sleep(METRICS_SETTLE_S)
        after = count()
        grown = [{key: value - then.get(key, 0.0) for key, value in now.items()} for then, now in zip(before, after)]
        return Measured(window, *({key: value for key, value in g.items() if value > 0} for g in grown))

    def warm(self, model: str, load: Load, data: str | Path, seconds: float) -> None:
        """``load`` on ``model`` for ``seconds``, unmeasured: a model loaded afresh sees the load
        before its next window does."""
        self.measure(model, load, data, seconds, warmup_s=0.5)

    def reload(self, models: Sequence[str], load: Load, data: str | Path, warmup_s: float) -> None:
        """A new life of ``models``: each unloaded, then in this order loaded afresh (its stub a
        new process: a model's process keeps a speed of its own while it lives,
        docs/results/check-process-lives) and run unmeasured at ``load`` for ``warmup_s``, so that
        ``auto`` has seen the load again before its next window (it learns afresh from loading
        on). Callers rotate the order from one life to the next (``check_cell.in_turn``)."""
        for model in models:
            self.unload(model)
        for model in models:
            self.load(model)
            try:
                self.warm(model, load, data, warmup_s)
            except PerfAnalyzerError:  # a warm-up perf_analyzer lost: the window's own warm-up follows
                pass

    def capacity(self, model: str, data: str | Path, concurrency: int, seconds: float, rows: int = 1) -> float:
        """Answers per second of a closed loop of ``concurrency`` (requests of ``rows``)."""
        load = Load(concurrency=concurrency, rows=rows)
        return self.measure(model, load, data, seconds, warmup_s=1.0).throughput

    def peak(self, model: str, data: str | Path, start: float, qos_ms: float, percentile: float = 99,
             probe_s: float = 5.0, warmup_s: float = 1.0, tolerance: float = PEAK_TOLERANCE, max_probes: int = 12,
             on_probe=None, rows: int = 1, cap: float = math.inf) -> Peak:
        """The highest Poisson rate (requests/s, of ``rows`` each) whose p``percentile`` latency is
        within ``qos_ms``, by bisection from ``start``, probing no rate above ``cap`` (``bisect_peak``)."""
        probes: list[Probe] = []

        def probe(rate: float) -> bool:
            window = self.measure(model, Load(rate=rate, rows=rows), data, probe_s, warmup_s)
            probes.append(Probe(rate, window, window.percentile_ms(percentile) <= qos_ms))
            if on_probe:
                on_probe(probes[-1])
            return probes[-1].passed

        low, high = bisect_peak(probe, start, tolerance, max_probes, cap)
        return Peak(low, high, tuple(probes))


def bisect_peak(passes: Callable[[float], bool], start: float, tolerance: float = PEAK_TOLERANCE,
                max_probes: int = 12, cap: float = math.inf) -> tuple[float, float]:
    """(the highest rate that ``passes``, the lowest above it that did not; inf: none failed):
    up by half while probes pass, down by half while they fail, then halving the bracket until
    it is within ``tolerance`` of the rate. The rate that closes the bracket from above is probed
    once more first: on a host the load generator shares, one window in a few dozen can miss the
    QoS by a hiccup (a p99 of 204 ms between windows of 10-20 ms), and a peak must not stop there.
    A probe whose window was lost at every attempt (``WindowLost``: perf_analyzer 2.51 hangs now
    and then, more often past capacity) is taken to have missed the QoS, and the bisection goes on
    below it (six hung windows at 2,100 requests/s of 8 rows once ended a check after 20 minutes);
    where every probe was lost, the last loss is raised. No rate above ``cap`` is probed: where a
    probe at it passes, it is the peak, and nothing above it failed (inf). Past capacity an open
    load's requests pile up, and over HTTP perf_analyzer holds a connection for each: near-zero
    compute probed past the 8,242/s a closed loop of 64 had answered (at 10,300/s among others)
    left tritonserver with 20,000 open sockets, its limit, and its listener failing every accept
    from then on (docs/results/borrowed-late)."""
    low, high, rate, probes, again = 0.0, math.inf, start, 0, set()
    lost: list[WindowLost] = []
    while probes < max_probes and rate >= 0.1:
        probes += 1
        try:
            passed = passes(rate)
        except WindowLost as exc:
            print(f"    {exc}: {rate:g}/s taken to miss the QoS", file=sys.stderr, flush=True)
            lost.append(exc)
            passed = False
        if passed:
            low = rate
            if rate >= high:  # the failure above was a hiccup: look higher again
                high = math.inf
        else:
            high = rate
        if low > 0 and high - low <= tolerance * low:
            if high in again:
                break
            again.add(high)
            rate = high
            continue
        if low >= cap:
            break
        rate = min(rate * 1.5, cap) if high == math.inf else rate / 2 if low == 0 else (low + high) / 2
        rate = float(f"{rate:.3g}")
        if rate in (low, high):
            break
    if lost and len(lost) == probes:
        raise lost[-1]
    return low, high


def add_measurement_arguments(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options the measuring commands share (``tools.compare``, ``tools.tune``): the latency
    target a peak holds, the probes that find it, and the measured windows."""
    parser.add_argument("--qos-ms", type=float, default=200, help="latency target of a peak (default 200)")
    parser.add_argument("--percentile", type=int, default=99, help="latency percentile held to the QoS (default 99)")
    parser.add_argument("--probe-seconds", type=float, default=5, help="seconds of each probe of a peak (default 5)")
    parser.add_argument("--window", type=float, default=10, help="seconds measured per window (default 10)")
    parser.add_argument("--rounds", type=int, default=rounds, help=f"windows of each configuration (default {rounds})")
    parser.add_argument("--warmup", type=float, default=2, help="unmeasured seconds before each window (default 2)")
