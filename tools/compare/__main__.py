"""python -m tools.compare: the paper's comparison of DVABatch with Triton's own batcher, one command.

    python -m tools.compare MODEL_DIR [--dataset glue:RTE --tokenizer FILE | --input-data ...]
        [--variant NAME:key=value,...] [--qos-ms 200] [--percentile 99] [--loads 0.25,0.6,0.9]
        [--rounds 3] [--window 10] [--step-seconds 3] [--out DIR]

1. Serve, from one tritonserver, the sliced model (and ``--variant``s of its parameters) and the
   baseline candidates: the unsliced model behind Triton's dynamic batcher at delay 0 (ZeroBatch)
   and at several delays (DelayBatch), ONNX Runtime threads spinning or not; text sent unpadded
   (Triton batching equal shapes only, or ragged batches padded by the server) or padded by the
   client to ``--max-length``.
2. Find every configuration's peak under the QoS with the stepping load (Poisson arrivals,
   ``--step-seconds`` per step, rates rising by a tenth of the measured capacity up to it, then
   by 15 % per step). Baselines are
   tuned greedily: spinning or not on ZeroBatch, then for each way of sending, longer delays
   while the peak still rises. The best ZeroBatch and DelayBatch are the candidates with the
   highest peaks; the best of the two is *the* baseline.
3. Run low, medium and high load (``--loads`` of the best baseline's peak, Poisson) for the best
   ZeroBatch, the best DelayBatch and ours, interleaved, ``--rounds`` times, with the batch
   sizes each formed (from the backend's metrics).
4. Write ``summary.md``, CSV files and PNG plots into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from tritonclient.utils import InferenceServerException

from backend.manifest import Manifest
from slicer.errors import SliceError
from slicer.slicing import VERSION
from tools.baselines import whole_model
from tools.bench import Bench, stepping_rates
from tools.compare import configs as cfg
from tools.compare import output
from tools.compare.results import Level, Results
from tools.load.workload import WorkloadError, add_workload_arguments, from_arguments


def _fractions(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected fractions such as 0.25,0.6,0.9, got {text!r}") from None
    if not values or any(not 0 < v for v in values):
        raise argparse.ArgumentTypeError(f"fractions must be positive, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path, help="a model directory written by python -m slicer")
    add_workload_arguments(p)
    p.add_argument("--source", type=Path, help="the unsliced ONNX model (default: found by its sha256)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...",
                   help="also serve the model with these config.pbtxt parameters (e.g. pass:policy=pass)")
    p.add_argument("--qos-ms", type=float, default=200, help="latency target of the peaks (default 200)")
    p.add_argument("--percentile", type=int, default=99, help="latency percentile held to the QoS (default 99)")
    p.add_argument("--loads", type=_fractions, default=(0.25, 0.6, 0.9),
                   help="low, medium, high load as fractions of the best baseline's peak (default 0.25,0.6,0.9)")
    p.add_argument("--rounds", type=int, default=3, help="times each load is measured for each configuration")
    p.add_argument("--window", type=float, default=10, help="seconds measured per load and round (default 10)")
    p.add_argument("--warmup", type=float, default=2, help="unmeasured seconds before each (default 2)")
    p.add_argument("--step-seconds", type=float, default=5, help="seconds per step of the stepping load (default 5)")
    p.add_argument("--steps", type=int, default=30, help="steps of the stepping load: tenths of the capacity "
                                                         "up to it, then 15%% more each (default 30)")
    p.add_argument("--delays-us", help="DelayBatch delays to try, comma-separated (default: from the model's times)")
    p.add_argument("--no-spinning", action="store_true", help="do not try ONNX Runtime threads that spin")
    p.add_argument("--out", type=Path, help="folder for the results (default results/<model>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 150)
    model_dir = args.model_dir.resolve()
    out = args.out or Path("results") / model_dir.name
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    try:
        manifest = Manifest.load(model_dir / VERSION)
        console.print(f"[bold]{model_dir.name}[/bold]: the unsliced model as one stage for the baselines ...")
        whole = whole_model(model_dir, args.source)
    except (SliceError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    sendings = ("exact", "ragged", "client") if args.dataset and manifest.length_axis else ("exact",)
    on_cpu = all(s.engine == "onnxruntime" for s in manifest.stages)
    spinning = (False, True) if on_cpu and not args.no_spinning else (False,)
    delays = sorted(int(d) for d in args.delays_us.split(",")) if args.delays_us else cfg.delay_candidates(whole)
    with tempfile.TemporaryDirectory(prefix="dvabatch-compare-") as scratch:
        repository = Path(scratch)
        try:
            ours = cfg.ours(model_dir, repository, args.variant)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            return 2
        console.print(f"baseline candidates: delays {', '.join(f'{d / 1000:g} ms' for d in delays)}, queries sent "
                      f"{', '.join(sendings)}" + (", threads spinning or not" if len(spinning) > 1 else ""))
        with Bench(repository, log=out / "tritonserver.log") as bench:
            try:
                for config in ours:
                    bench.load(config.model)
            except InferenceServerException as exc:
                console.print(f"[red]error:[/red] {config.label} does not load: {exc.message()}")
                return 2
            try:
                interface = bench.interface(ours[0].model)
                requests = {False: from_arguments(args, interface)}
                if "client" in sendings:
                    requests[True] = from_arguments(args, interface, pad_to=args.max_length)
            except WorkloadError as exc:
                console.print(f"[red]error:[/red] {exc}")
                return 2
            search = Search(bench, whole, repository, model_dir.name, manifest.max_batch_size, requests, args, console)
            results = search.run(ours, delays, spinning, sendings)
    results.seconds = time.monotonic() - began
    output.write(results, out)
    console.print(output.console_table(results))
    console.print(f"wrote {out}/summary.md, CSV files and plots in {results.seconds / 60:.1f} min")
    return 0


class Search:
    """Peaks of the configurations (baselines tuned greedily), then the loads."""

    def __init__(self, bench: Bench, whole: Path, repository: Path, name: str, max_bs: int, requests: dict,
                 args: argparse.Namespace, console: Console):
        self.bench, self.whole, self.repository, self.name, self.max_bs = bench, whole, repository, name, max_bs
        self.requests, self.args, self.console = requests, args, console
        self.rates: list[float] = []
        self.results = Results(model=name, qos_ms=args.qos_ms, percentile=args.percentile, capacity=0.0,
                               dataset=args.dataset)

    def run(self, ours: list[cfg.Config], delays: list[int], spinning: tuple[bool, ...],
            sendings: tuple[str, ...]) -> Results:
        results, args = self.results, self.args
        first = self.candidate(0, False, "exact")
        results.capacity = self.bench.capacity(first.model, self.requests[False], 2 * self.max_bs,
                                               2 * args.step_seconds)
        self.rates = stepping_rates(results.capacity, args.steps)
        self.console.print(f"capacity of {first.label} in a closed loop: {results.capacity:.1f} requests/s; stepping "
                           f"load {self.rates[0]:g} .. {self.rates[-1]:g} requests/s, {args.step_seconds:g} s per step")
        spin = max((self.peak(self.candidate(0, s, "exact")) for s in spinning), key=lambda c: results.peaks[c].peak)
        spin = spin.spinning
        for sending in sendings:  # each delay in turn while the peak still rises
            best = self.peak(self.candidate(0, spin, sending))
            for delay in delays:
                config = self.peak(self.candidate(delay, spin, sending))
                if results.peaks[config].peak < results.peaks[best].peak:
                    break
                best = config
        for config in ours:
            self.peak(config)
        best_zero = max((c for c in results.peaks if c.kind == "zero"), key=lambda c: results.peaks[c].peak)
        best_delay = max((c for c in results.peaks if c.kind == "delay"), key=lambda c: results.peaks[c].peak)
        results.best_baseline = max(best_zero, best_delay, key=lambda c: results.peaks[c].peak)
        results.measured = [best_zero, best_delay, *ours]
        for model in {c.model for c in results.peaks if c.baseline} - {c.model for c in results.measured}:
            self.bench.unload(model)  # candidates that lost: their threads and memory go
        self.loads()
        return results

    def candidate(self, delay_us: int, spinning: bool, sending: str) -> cfg.Config:
        config = cfg.baseline(self.whole, self.repository, self.name, delay_us, spinning, sending)
        self.bench.load(config.model)
        return config

    def peak(self, config: cfg.Config) -> cfg.Config:
        """Step ``config`` up to the QoS (once) after a second of warm-up."""
        if config not in self.results.peaks:
            requests = self.requests[config.padded]
            self.bench.capacity(config.model, requests, self.max_bs, self.args.warmup)
            stepping = self.bench.peak(config.model, requests, self.rates, self.args.step_seconds, self.args.qos_ms,
                                       self.args.percentile, seed=self.args.seed)
            self.results.peaks[config] = stepping
            self.console.print(f"  peak of {config.label}: {'>= ' if stepping.capped else ''}{stepping.peak:g} "
                               "requests/s", highlight=False)
        return config

    def loads(self) -> None:
        results, args = self.results, self.args
        peak = results.peaks[results.best_baseline].peak
        if peak <= 0:
            self.console.print(f"[yellow]no baseline met the QoS of {args.qos_ms:g} ms at the lowest rate; the loads "
                               "use the lowest step instead[/yellow]")
            peak = self.rates[0]
        names = ("low", "medium", "high") if len(args.loads) == 3 else tuple(f"{f:g}" for f in args.loads)
        results.levels = [Level(n, f, round(peak * f, 1)) for n, f in zip(names, args.loads)]
        measured = results.measured
        for round_ in range(args.rounds):
            for index, level in enumerate(results.levels):
                shift = round_ % len(measured)  # each round starts with another configuration
                for config in measured[shift:] + measured[:shift]:
                    window = self.bench.window(config.model, self.requests[config.padded], level.rate, args.window,
                                               args.warmup, seed=args.seed + 100 * round_ + index)
                    results.windows.setdefault((config, level.name), []).append(window)
                    s = window.summary
                    self.console.print(f"  round {round_ + 1}, {level.name} load {level.rate:g}/s, {config.label}: "
                                       f"mean {s.mean_ms:.1f} ms, p99 {s.percentiles_ms[99]:.1f} ms"
                                       + (f", {sum(s.failures.values())} failed" if s.failures else ""),
                                       highlight=False)


if __name__ == "__main__":
    sys.exit(main())
