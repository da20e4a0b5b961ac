"""python -m tools.compare: DVABatch against the peers a Triton user would deploy, with perf_analyzer.

    python -m tools.compare MODEL_DIR [--dataset glue:RTE --tokenizer FILE | --input-data FILE | --shape ...]
        [--variant NAME:key=value,...] [--qos-ms 200] [--percentile 99] [--loads 0.25,0.6,0.9]
        [--concurrency 1,16] [--intervals FILE ...] [--ours-sendings exact,client] [--rounds 4] [--window 10]
        [--out DIR]

1. Serve, from one tritonserver, the sliced model (and ``--variant``s of its parameters) and the
   peers (``tools.baselines``): the unsliced model as a plain Python-backend model behind Triton's
   dynamic batcher, and the ensemble of the same stages, each its own model with its own batcher.
2. Find every configuration's peak, the highest Poisson rate whose p99 (``--percentile``) stays
   within ``--qos-ms``, by bisection to ``--tolerance``. The peers are tuned greedily on it:
   ONNX Runtime's threads spinning or sleeping, then how text is sent (unpadded in batches of
   equal shapes, in ragged batches the plain model pads, or padded by the client), then longer
   batcher delays while the peak still rises. The peer with the highest peak is *the* baseline.
3. Measure the best plain model, the best ensemble, the best baseline without its batcher delay
   where it has one (a lone request waits the delay out), a second copy of the best baseline (the
   A/A row: the noise floor) and ours (sent text unpadded, and with ``--ours-sendings exact,client``
   also padded as the plain model's client pads it), in ``--rounds`` interleaved rounds: Poisson loads at
   ``--loads`` of the baseline's peak, closed loops at ``--concurrency``, and ``--intervals``
   files (recorded bursts), each a perf_analyzer window of ``--window`` seconds.
4. Write ``summary.md`` (every ratio to the baseline with its 95 % interval and a verdict:
   better, worse or within noise; goodput: answers per second within the QoS), CSV files and
   plots into ``--out``.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from tritonclient.utils import InferenceServerException

from backend.manifest import Manifest
from slicer.errors import SliceError
from slicer.slicing import VERSION
from tools.lib.peers import delay_candidates, find_source, timed
from tools.lib.cli import names, numbers, table_console
from tools.lib.harness import add_measurement_arguments, Bench, Peak, Probe
from tools.compare import configs as cfg
from tools.compare import output
from tools.compare.results import Level, Results
from tools.lib.perf_analyzer import Load, PerfAnalyzerError
from tools.lib.workload import WorkloadError, add_workload_arguments, from_arguments, interface_of, write_input_data


SENDINGS = ("exact", "ragged", "client")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir", type=Path, help="a model directory written by python -m slicer")
    add_workload_arguments(p)
    p.add_argument("--source", type=Path, help="the unsliced ONNX model (default: found by its sha256)")
    add_measurement_arguments(p, rounds=4)
    p.add_argument("--variant", action="append", default=[], metavar="NAME:key=value,...",
                   help="also serve the model with these config.pbtxt parameters (e.g. pass:policy=pass)")
    p.add_argument("--loads", type=numbers(float, empty=True), default=(0.25, 0.6, 0.9),
                   help="Poisson loads as fractions of the best baseline's peak (default 0.25,0.6,0.9)")
    p.add_argument("--concurrency", type=numbers(int, empty=True), default=(1, 16),
                   help="closed loops to measure, requests in flight (default 1,16; empty: none)")
    p.add_argument("--intervals", type=Path, action="append", default=[],
                   help="a file of microseconds between requests (perf_analyzer's --request-intervals) to measure")
    p.add_argument("--tolerance", type=float, default=0.05, help="bisect the peak to this fraction (default 0.05)")
    p.add_argument("--delays-us", type=numbers(int, empty=True),
                   help="batcher delays to try after 0 (default: from the model's times; empty: none)")
    p.add_argument("--sendings", type=names(SENDINGS), default=SENDINGS,
                   help="ways to send text to try: exact (unpadded, batches of equal shapes), ragged (unpadded, "
                        "batches the plain model pads), client (the client pads); default all")
    p.add_argument("--ours-sendings", type=names(("exact", "client")), default=("exact",),
                   help="ways to send ours text, each measured: exact (unpadded, the default), client (the "
                        "client pads, as it does for the plain model: what serving the lengths costs)")
    p.add_argument("--no-spinning", action="store_true", help="do not try ONNX Runtime threads that spin")
    p.add_argument("--no-ensemble", action="store_true", help="leave the ensemble peer out")
    p.add_argument("--out", type=Path, help="folder for the results (default results/<model>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = table_console()
    model_dir = args.model_dir.resolve()
    out = args.out or Path("results") / model_dir.name
    began = time.monotonic()
    try:
        manifest = Manifest.load(model_dir / VERSION)
        if not timed(manifest):
            find_source(manifest, args.source)
    except (SliceError, FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="dvabatch-compare-"))
    try:
        data = workload_files(args, model_dir, manifest, scratch)
        if "client" in args.ours_sendings and True not in data:
            raise WorkloadError("--ours-sendings client needs text that a client can pad: --dataset, on a model "
                                "with a length axis")
        ours = cfg.ours(model_dir, scratch / "repository", args.variant, args.ours_sendings)
    except (WorkloadError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        shutil.rmtree(scratch, ignore_errors=True)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    try:
        with Bench(scratch / "repository", log=out / "tritonserver.log") as bench:
            try:
                for config in ours:
                    if config.sending == args.ours_sendings[0]:  # each model once
                        bench.load(config.model)
            except InferenceServerException as exc:
                console.print(f"[red]error:[/red] {config.label} does not load: {exc.message()}")
                return 2
            results = Search(bench, model_dir, manifest, data, args, console).run(ours)
    except (PerfAnalyzerError, InferenceServerException) as exc:
        console.print(f"[red]error:[/red] {exc} (server log: {out / 'tritonserver.log'})")
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results.seconds = time.monotonic() - began
    results.command = "python -m tools.compare " + shlex.join(argv if argv is not None else sys.argv[1:])
    output.write(results, out)
    console.print(output.console_table(results))
    console.print(f"wrote {out}/summary.md, CSV files and plots in {results.seconds / 60:.1f} min")
    return 0


def workload_files(args: argparse.Namespace, model_dir: Path, manifest: Manifest, scratch: Path) -> dict[bool, str]:
    """perf_analyzer's input data, keyed by whether the client pads: a JSON file of the queries
    (or the user's own file, sent as it is)."""
    if args.input_data not in ("random", "zero") and not args.dataset:
        if not Path(args.input_data).is_file():
            raise WorkloadError(f"--input-data {args.input_data}: no such file")
        return {False: str(Path(args.input_data).resolve())}
    model = interface_of(model_dir)
    files = {False: str(write_input_data(from_arguments(args, model), scratch / "data.json"))}
    if args.dataset and manifest.length_axis:
        files[True] = str(write_input_data(from_arguments(args, model, pad_to=args.max_length),
                                           scratch / "padded.json"))
    return files


class Search:
    """Peaks of the configurations (peers tuned greedily), then the interleaved windows."""

    def __init__(self, bench: Bench, model_dir: Path, manifest: Manifest, data: dict[bool, str],
                 args: argparse.Namespace, console: Console):
        self.bench, self.model_dir, self.manifest, self.data = bench, model_dir, manifest, data
        self.args, self.console = args, console
        self.repository = Path(bench.server.model_repository)
        self.candidates: dict[tuple, cfg.Config] = {}
        workload = args.dataset or (Path(args.input_data).name if args.input_data not in ("random", "zero")
                                    else f"synthetic ({args.input_data})")
        self.results = Results(model=model_dir.name, qos_ms=args.qos_ms, percentile=args.percentile, capacity=0.0,
                               workload=workload)

    def run(self, ours: list[cfg.Config]) -> Results:
        results, args = self.results, self.args
        first = self.candidate("plain", 0, True, "exact")
        results.capacity = self.bench.capacity(first.model, self.data[False], 2 * self.manifest.max_batch_size,
                                               2 * args.probe_seconds)
        self.console.print(f"{first.label} answers {results.capacity:.1f} requests/s in a closed loop of "
                           f"{2 * self.manifest.max_batch_size}; peaks by bisection to {args.tolerance:.0%}",
                           highlight=False)
        on_cpu = all(s.engine == "onnxruntime" for s in self.manifest.stages)
        spins = ((False,) if args.no_spinning else (True, False)) if on_cpu else (True,)
        delays = list(delay_candidates(self.manifest) if args.delays_us is None else args.delays_us)
        kinds = ("plain",) if args.no_ensemble else ("plain", "ensemble")
        best = {}
        for kind in kinds:
            sendings = [s for s in args.sendings if (s != "client" or True in self.data)
                        and (s != "ragged" or (kind == "plain" and self.manifest.length_axis))] or ["exact"]
            spin = self.best(self.candidate(kind, 0, s, sendings[0]) for s in spins).spinning
            sending = self.best(self.candidate(kind, 0, spin, s) for s in sendings).sending
            best[kind] = self.candidate(kind, 0, spin, sending)
            for delay in delays:  # longer delays while the peak still rises
                config = self.peak(self.candidate(kind, delay, spin, sending))
                if results.peaks[config].rate < results.peaks[best[kind]].rate:
                    break
                best[kind] = config
        for config in ours:
            self.peak(config)
        results.best_baseline = self.best(best.values())
        b = results.best_baseline
        # A batcher delay that raises the peak is waited out by a request that comes alone: the
        # same peer without it is measured too, the fair peer at one in flight and at low loads.
        undelayed = [self.candidate(b.kind, 0, b.spinning, b.sending)] if b.delay_us else []
        copy = cfg.baseline(self.model_dir, self.repository, b.kind, b.delay_us, b.spinning, b.sending,
                            self.args.source, copy=True)
        for model in copy.models:
            self.bench.load(model)
        results.measured = [*best.values(), *undelayed, copy, *ours]
        kept = {m for c in results.measured for m in c.models}
        for model in {m for c in self.candidates.values() for m in c.models} - kept:
            self.bench.unload(model)  # candidates that lost: their stubs and memory go
        self.windows()
        return results

    def candidate(self, kind: str, delay_us: int, spinning: bool, sending: str) -> cfg.Config:
        """A peer, written and loaded once."""
        key = (kind, delay_us, spinning, sending)
        if key not in self.candidates:
            config = cfg.baseline(self.model_dir, self.repository, kind, delay_us, spinning, sending, self.args.source)
            if not any(c.model == config.model for c in self.candidates.values()):
                for model in config.models:
                    self.bench.load(model)
            self.candidates[key] = config
        return self.candidates[key]

    def best(self, configs) -> cfg.Config:
        """The configuration with the highest peak (each bisected once)."""
        return max((self.peak(c) for c in configs), key=lambda c: self.results.peaks[c].rate)

    def peak(self, config: cfg.Config) -> cfg.Config:
        """Bisect ``config``'s peak (once), starting from the best peak so far."""
        if config in self.results.peaks:
            return config
        args, found = self.args, [p.rate for p in self.results.peaks.values() if p.rate > 0]
        start = float(f"{max(found) if found else 0.8 * self.results.capacity:.3g}")
        data = self.data[config.padded]
        self.bench.capacity(config.model, data, self.manifest.max_batch_size, args.warmup)  # warm up

        def shown(probe: Probe) -> None:
            w = probe.window
            self.console.print(f"    {config.label}: {probe.rate:g}/s -> p{args.percentile} "
                               f"{w.percentile_ms(args.percentile):.1f} ms, mean {w.mean_ms:.1f} ms "
                               f"({'within' if probe.passed else 'past'} the QoS)", highlight=False)

        peak: Peak = self.bench.peak(config.model, data, start, args.qos_ms, args.percentile, args.probe_seconds,
                                     min(args.warmup, 1.0), args.tolerance, on_probe=shown)
        self.results.peaks[config] = peak
        self.console.print(f"  peak of {config.label}: {peak.rate:g} requests/s "
                           f"(+{peak.resolution:.0%} at most)", highlight=False)
        return config

    def windows(self) -> None:
        results, args = self.results, self.args
        peak = results.peaks[results.best_baseline].reference
        if results.peaks[results.best_baseline].rate <= 0:
            self.console.print(f"[yellow]no baseline met the QoS of {args.qos_ms:g} ms; the loads are fractions of "
                               f"its lowest probe, {peak:g}/s[/yellow]")
        names = ("low", "medium", "high") if len(args.loads) == 3 else tuple(f"{f:g} of the peak" for f in args.loads)
        results.levels = [Level(n, Load(rate=float(f"{peak * f:.3g}")), f) for n, f in zip(names, args.loads)]
        results.levels += [Level(f"c={c}", Load(concurrency=c)) for c in args.concurrency]
        results.levels += [Level(path.name, Load(intervals=path.resolve())) for path in args.intervals]
        measured = results.measured
        if not results.levels:
            return
        for config in measured:  # unmeasured: the first window must not find stubs that idled during the peaks
            self.bench.window(config.model, results.levels[0].load, self.data[config.padded], args.warmup,
                              args.warmup, config.steps)
        for round_ in range(args.rounds):
            for level in results.levels:
                shift = round_ % len(measured)  # each round starts with another configuration
                for config in measured[shift:] + measured[:shift]:
                    m = self.bench.window(config.model, level.load, self.data[config.padded], args.window,
                                          args.warmup, config.steps)
                    results.windows.setdefault((config, level.name), []).append(m)
                    w = m.window
                    self.console.print(f"  round {round_ + 1}, {level.name} ({level.load.label}), {config.label}: "
                                       f"mean {w.mean_ms:.1f} ms, p99 {w.percentile_ms(99):.1f} ms, "
                                       f"{w.throughput:.1f} answers/s"
                                       + (f", {w.delayed_percent:.0f} % sent late" if w.delayed_percent > 10 else ""),
                                       highlight=False)


if __name__ == "__main__":
    sys.exit(main())
