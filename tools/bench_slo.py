"""python -m tools.bench_slo: Orloj's SLO-aware batching (``policy: slo``) as its paper measures it.

    python -m tools.bench_slo [--workloads rte,bimodal] [--slos 2,5] [--loads 0.3,0.6] [--seconds 10]
                              [--warmup 3] [--rounds 1] [--models M,...] [--peak-of M,...]
                              [--profile P.json] [--out docs/results/RUN]

The measure is the paper's **finish rate**: the share of requests answered within their SLO.
Every request carries its SLO as its Triton timeout (gRPC ``timeout``, what a client sets), sent
open-loop at Poisson times by this tool's client (perf_analyzer sets no per-request timeout). A
request refused with Triton's timeout error, or answered late, did not finish. SLOs are multiples
(``--slos``; the paper's tight and relaxed: 2 and 5) of the lone latency: a query of the
workload's 99th-percentile length through the whole model's table at full work.

One timed profile (default ``docs/profiles/early_exit_2stages.json``: an early-exit model whose
``work`` input scales a batch's time by its largest row's value) and two workloads:

- ``rte``: GLUE RTE's dev sentences (tokenized with the MiniLM tokenizer in the cache), each its
  own length, every row at full work: input diversity;
- ``bimodal``: 64 tokens, 70 % of the rows leave at a quarter of the time and 30 % run it all
  (the paper's bimodal distribution): execution time the scheduler cannot know in advance.

Models, one tritonserver: ``triton`` (the whole model as a plain model behind Triton's dynamic
batcher, its queue policy refusing what waited past its timeout), ``slo`` (ours: Orloj's rule),
``edf`` (ours: ``policy: slo`` with ``rule: edf``), ``pass`` and ``auto`` (ours, the policies
without deadlines but the entry's refusal of expired queries), ``slo-plain`` (``policy: slo``
served plain, ``batching: triton``: Triton's batcher forms each batch, as for ``triton``, and
the slo rule refuses inside ``execute`` what the batch would make late) and ``slo-auto``
(``policy: slo`` with ``policy.auto: true``: served as ``auto`` decides). ``--models`` measures
some of them. The Poisson rates are ``--loads`` times the best closed-loop throughput at 64 in
flight (which no SLO bounds: under a tight one far less finishes in time) of ``--peak-of``'s
models (default ``triton``, ``pass`` and ``auto``; ``triton`` alone to load a model served plain
within what it can serve). ``--out`` keeps summary.md, finish.csv and tritonserver's log.
"""

from __future__ import annotations

import argparse
import csv
import math
import queue
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from rich.console import Console
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tools.lib.cli import names, numbers, table_console
from tools.lib.harness import Bench
from tools.lib.paths import ROOT
from tools.lib.peers import Peer, write_plain
from tools.lib.perf_analyzer import PerfAnalyzerError
from tools.lib.real_models import minilm_tokenizer
from tools.lib.timed import from_profile, timed_whole, write_timed
from tools.lib.workload import Request, glue, interface_of, synthetic, write_input_data

PROFILE = ROOT / "docs" / "profiles" / "early_exit_2stages.json"
PEAK_CONCURRENCY = 64
SHORT, SHORT_SHARE = 0.25, 0.7  # the bimodal workload: this share of the rows needs this share of the time
QUEUE_DEFAULT_US = 60_000_000  # the plain model's queue policy default (a request's own timeout is shorter)
MODELS = ("triton", "slo", "edf", "pass", "auto", "slo-plain", "slo-auto")
WORKLOADS = ("rte", "bimodal")
# The finish rates compared: slo against Triton and against our best other policy ("ours"); served plain,
# against Triton's batcher that forms its batches too.
RATIOS = (("slo", "triton"), ("slo", "ours"), ("slo-plain", "triton"))


@dataclass(frozen=True)
class Outcome:
    """What became of one window's requests."""

    sent: int
    finished: int  # answered within the SLO
    refused: int  # Triton's timeout error
    late: int  # answered after the SLO
    failed: int  # any other error, or no answer

    @property
    def rate(self) -> float:
        return self.finished / self.sent if self.sent else math.nan


def workload(name: str, model_dir: Path, seed: int = 0) -> list[Request]:
    """The requests of ``name`` (``rte`` or ``bimodal``) for the model in ``model_dir``."""
    full = interface_of(model_dir)
    interface = replace(full, inputs=tuple(spec for spec in full.inputs if spec.name != "work"))
    rng = np.random.default_rng(seed)
    if name == "rte":
        requests = glue(interface, "glue:RTE", minilm_tokenizer(), 128)
        works = np.ones(len(requests))
    elif name == "bimodal":
        requests = synthetic(interface, 1, {}, count=512, lengths=(64,))
        works = np.where(rng.random(len(requests)) < SHORT_SHARE, SHORT, 1.0)
    else:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return [Request({**r.inputs, "work": np.full((1, 1), w, np.float32)}, r.rows, r.length)
            for r, w in zip(requests, works)]


def open_loop(url: str, model: str, requests: list[Request], rate: float, seconds: float, slo_s: float,
              seed: int) -> Outcome:
    """Send ``requests`` in turn at Poisson times of ``rate`` for ``seconds``, each with the timeout
    ``slo_s``, and sort what became of them."""
    prepared = []
    for request in requests:
        inputs = []
        for name, array in request.inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        prepared.append(inputs)
    done: queue.SimpleQueue = queue.SimpleQueue()
    arrivals = random.Random(seed)
    timeout_us = int(slo_s * 1e6)
    with grpcclient.InferenceServerClient(url) as client:
        start = next_at = time.monotonic()
        sent = 0
        while next_at < start + seconds:
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            began = time.monotonic()
            client.async_infer(model, prepared[sent % len(prepared)],
                               lambda result, error, began=began: done.put((time.monotonic() - began, error)),
                               timeout=timeout_us, client_timeout=4 * slo_s + 1)
            sent += 1
            next_at += arrivals.expovariate(rate)
        counts = {"finished": 0, "refused": 0, "late": 0, "failed": 0}
        for _ in range(sent):
            try:
                took, error = done.get(timeout=4 * slo_s + 5)
            except queue.Empty:
                counts["failed"] += 1
                continue
            if error is None:
                counts["finished" if took <= slo_s else "late"] += 1
            else:
                counts["refused" if "timeout" in str(error).lower() else "failed"] += 1
    return Outcome(sent, **counts)


def lone_s(manifest, requests: list[Request]) -> float:
    """A query of the workload's 99th-percentile length through the whole model at full work."""
    lengths = [r.length for r in requests if r.length is not None]
    length = int(np.percentile(lengths, 99)) if lengths else None
    tables = [manifest.whole] if manifest.whole else [s.latency for s in manifest.stages]
    return sum(t.predict(1, length) for t in tables) / 1000


def run(args: argparse.Namespace, console: Console) -> tuple[list[list[str]], list[str], list[str]]:
    """The finish rates, per workload, load and SLO (rows, header), and what became of the
    requests of every model in each."""
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-slo-"))
    try:
        _, manifest, parameters = from_profile(args.profile)
        tables = [s.latency for s in manifest.stages]
        identity = (manifest.source_file, manifest.source_sha256)
        knobs = {k: v for k, v in parameters.items() if k != "policy" and not k.startswith("policy.")}
        ours = {"slo": {**knobs, "policy": "slo"}, "edf": {**knobs, "policy": "slo", "policy.rule": "edf"},
                "pass": {**knobs, "policy": "pass"}, "auto": parameters,
                "slo-plain": {**knobs, "policy": "slo", "batching": "triton"},
                "slo-auto": {**parameters, "policy": "slo", "policy.auto": "true"}}
        for name, settings in ours.items():
            written = write_timed(name, manifest.inputs, tables, manifest.max_batch_size, *identity, folder / name,
                                  settings, manifest.whole)
        timed_whole(written)
        write_plain(folder / "auto", folder, "triton", Peer(ragged=manifest.length_axis is not None,
                                                            timeout_us=QUEUE_DEFAULT_US))
        models = [m for m in ("triton", *ours) if m in args.models]
        loaded = [*args.peak_of, *(m for m in models if m not in args.peak_of)]
        log = args.out / "tritonserver.log" if args.out else folder / "triton.log"
        rows, details = [], []
        with Bench(folder, log=log) as bench:
            for model in loaded:
                bench.load(model)
            for name in args.workloads:
                requests = workload(name, folder / "auto")
                data = write_input_data(requests, folder / f"{name}.json")
                for model in loaded:  # warm up: a window too short to see an answer has still warmed it
                    try:
                        bench.capacity(model, data, PEAK_CONCURRENCY, 1.0)
                    except PerfAnalyzerError:
                        pass
                peak = max(bench.capacity(m, data, PEAK_CONCURRENCY, args.seconds) for m in args.peak_of)
                lone = lone_s(manifest, requests)
                for load, factor in ((load, factor) for load in args.loads for factor in args.slos):
                    rate = load * peak
                    slo_s = factor * lone
                    outcomes: dict[str, list[Outcome]] = {m: [] for m in models}
                    for round_ in range(args.rounds):
                        for model in models:
                            open_loop(bench.url, model, requests, rate, args.warmup, slo_s, seed=round_ + 100)
                            outcomes[model].append(open_loop(bench.url, model, requests, rate, args.seconds,
                                                             slo_s, seed=round_))
                    finish = {m: sum(o.finished for o in v) / max(sum(o.sent for o in v), 1)
                              for m, v in outcomes.items()}
                    finish["ours"] = max((finish[m] for m in ("edf", "pass", "auto") if m in finish), default=math.nan)
                    said = f"{name} at {load:g} of the peak, SLO {factor:g}x: " + ", ".join(
                        f"{m} {finish[m]:.1%} (of {sum(o.sent for o in v)}: refused {sum(o.refused for o in v)}, "
                        f"late {sum(o.late for o in v)}, failed {sum(o.failed for o in v)})"
                        for m, v in outcomes.items())
                    console.print(said)
                    details.append(said)
                    rows.append([name, f"{factor:g}x = {slo_s * 1000:.0f} ms", f"{load:g} x {peak:.0f}/s",
                                 *(f"{finish[m]:.1%}" for m in models),
                                 *(_ratio(finish.get(a, math.nan), finish.get(b, math.nan)) for a, b in RATIOS)])
        header = ["workload", "SLO", "Poisson", *(f"{m} finish" for m in models),
                  *(f"{a} / {b}" for a, b in RATIOS)]
        return rows, header, details
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x" if b > 0 else ("inf" if a > 0 else "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_slo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=PROFILE, help="a timed profile with a 'work' input")
    parser.add_argument("--workloads", type=names(WORKLOADS), default=",".join(WORKLOADS),
                        help="rte, bimodal (default both)")
    parser.add_argument("--slos", type=numbers(float), default="2,5",
                        help="SLOs as multiples of the lone latency (default 2,5)")
    parser.add_argument("--loads", type=numbers(float), default="0.3,0.6",
                        help="Poisson rates as shares of the peak (default 0.3,0.6)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per window (default 10)")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each (default 3)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--models", type=names(MODELS), default=",".join(MODELS),
                        help=f"of {', '.join(MODELS)} (default all)")
    parser.add_argument("--peak-of", type=names(MODELS), default="triton,pass,auto",
                        help="the models whose best peak the loads are shares of (default triton,pass,auto)")
    parser.add_argument("--out", type=Path, help="write summary.md and finish.csv here")
    args = parser.parse_args(argv)
    console = table_console()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    try:
        rows, header, details = run(args, console)
    except (PerfAnalyzerError, InferenceServerException, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    lines = [f"Finish rate (answered within the SLO) under Poisson loads, {args.profile.name}", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
             *("| " + " | ".join(r) + " |" for r in rows), "", "What became of the requests, all rounds:", "",
             *(f"- {line}" for line in details)]
    console.print("\n".join(lines))
    if args.out:
        (args.out / "summary.md").write_text("\n".join(lines) + "\n")
        with (args.out / "finish.csv").open("w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
