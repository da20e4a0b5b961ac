"""python -m tools.load: load a Triton model the way perf_analyzer does, plus what DVABatch needs.

    python -m tools.load -m MODEL [-u URL] [-i grpc|http] [-b ROWS]
        [--concurrency-range START:END:STEP | --request-rate-range START:END:STEP [--stepping]]
        [--request-distribution constant|poisson] [--request-intervals FILE]
        [--input-data random|zero|FILE] [--shape NAME:D1,D2] [--dataset glue:TASK[:SPLIT] --tokenizer FILE]
        [-p MS] [--percentile P] [--latency-threshold MS] [-f OUT.csv] [--requests-csv FILE]

Flags mean what they mean to perf_analyzer (which ships only in NVIDIA's SDK container). Each
level runs in windows of ``-p`` ms until three agree within ``--stability-percentage`` (or
``--max-trials``); ``--stepping`` instead runs the rates back to back, one window each, as the
paper's stepping load, and stops after the first step past ``--latency-threshold``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from rich.console import Console

from tools.load.report import Level, server_times, table, write_perf_analyzer_csv, write_requests_csv
from tools.load.runner import DISTRIBUTIONS, LoadGenerator, Phase, PhaseRun, Run, stepping, sweep
from tools.load.transport import make_transport
from tools.load.workload import ModelInterface, WorkloadError, add_workload_arguments, from_arguments


def _range(kind: type):
    def parse(text: str) -> tuple:
        parts = text.split(":")
        try:
            values = [kind(p) for p in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected START[:END[:STEP]], got {text!r}") from None
        if len(values) > 3 or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive START[:END[:STEP]], got {text!r}")
        start = values[0]
        end = values[1] if len(values) > 1 else start
        step = values[2] if len(values) > 2 else kind(1)
        levels, value = [], start
        while value <= end + 1e-9:
            levels.append(value)
            value += step
        return tuple(levels)
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.load", description=__doc__.split("\n\n")[0])
    p.add_argument("-m", dest="model", required=True, help="model name")
    p.add_argument("-x", dest="version", default="", help="model version (default: the server's choice)")
    p.add_argument("-u", dest="url", help="server address (default localhost:8001 for gRPC, :8000 for HTTP)")
    p.add_argument("-i", dest="protocol", choices=("grpc", "http"), default="grpc")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", type=_range(int), help="closed loop: START:END:STEP concurrencies")
    load.add_argument("--request-rate-range", type=_range(float), help="open loop: START:END:STEP requests/s")
    load.add_argument("--request-intervals", type=Path, help="open loop: a file of intervals in microseconds, "
                                                             "one per line, cycled")
    p.add_argument("--request-distribution", choices=DISTRIBUTIONS, default="constant",
                   help="arrivals of the open loop (default constant, as perf_analyzer)")
    p.add_argument("--stepping", action="store_true",
                   help="run the request rates back to back as one stepping load, one window each")
    add_workload_arguments(p)
    p.add_argument("--pad-to", type=int, help="--dataset: the client pads every query to this many tokens")
    p.add_argument("-p", "--measurement-interval", type=float, default=5000, help="window in ms (default 5000)")
    p.add_argument("--stability-percentage", type=float, default=10)
    p.add_argument("--max-trials", type=int, default=10, help="windows per level at most (default 10)")
    p.add_argument("--percentile", type=int, help="judge stability and the threshold on this percentile, not the mean")
    p.add_argument("--latency-threshold", type=float, help="ms; stop once a level's latency passes it")
    p.add_argument("-f", dest="csv", type=Path, help="write perf_analyzer's CSV here")
    p.add_argument("--requests-csv", type=Path, help="write every request (times, status, rows, length) here")
    p.add_argument("--max-requests", type=int, help="stop sending after this many requests")
    p.add_argument("--max-outstanding", type=int, default=1024, help="open loop: requests in flight at most")
    p.add_argument("--client-timeout", type=float, default=60, help="seconds a request may take (default 60)")
    return p


def _interface(protocol: str, url: str, model: str, version: str) -> ModelInterface:
    if protocol == "grpc":
        import tritonclient.grpc as client

        with client.InferenceServerClient(url) as c:
            return ModelInterface.from_config(c.get_model_config(model, version, as_json=True)["config"])
    import tritonclient.http as client

    with client.InferenceServerClient(url) as c:
        return ModelInterface.from_config(c.get_model_config(model, version))


def _statistics(protocol: str, url: str, model: str, version: str) -> dict:
    """Triton's cumulative ``inference_stats`` of the model (empty if the server says nothing)."""
    try:
        if protocol == "grpc":
            import tritonclient.grpc as client

            with client.InferenceServerClient(url) as c:
                stats = c.get_inference_statistics(model, version, as_json=True)
        else:
            import tritonclient.http as client

            with client.InferenceServerClient(url) as c:
                stats = c.get_inference_statistics(model, version)
        return stats["model_stats"][0]["inference_stats"]
    except Exception:  # noqa: BLE001 - the statistics are extra columns, never a reason to fail
        return {}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 140)
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    try:
        model = _interface(args.protocol, url, args.model, args.version)
        requests = from_arguments(args, model, args.pad_to)
        intervals = [float(line) for line in args.request_intervals.read_text().split()] \
            if args.request_intervals else None
    except WorkloadError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except Exception as exc:  # noqa: BLE001 - tritonclient raises its own exception kinds
        console.print(f"[red]error:[/red] cannot reach model '{args.model}' at {url}: {exc}")
        return 2
    window = args.measurement_interval / 1000
    if intervals:
        kind, levels = "Request Rate", [Phase(window, rate=1e6 / (sum(intervals) / len(intervals)), label="intervals")]
    elif args.request_rate_range:
        kind, levels = "Request Rate", [Phase(window, rate=r, label=f"{r:g}") for r in args.request_rate_range]
    else:
        kind, levels = "Concurrency", [Phase(window, concurrency=c, label=str(c))
                                       for c in args.concurrency_range or (1,)]
    if args.stepping and kind != "Request Rate":
        console.print("[red]error:[/red] --stepping needs --request-rate-range")
        return 2
    plan = (stepping([lv.rate for lv in levels], window, args.latency_threshold, args.percentile) if args.stepping
            else sweep(levels, window, args.stability_percentage, args.max_trials, args.percentile,
                       args.latency_threshold))
    transport = make_transport(args.protocol, url, args.model, args.version, requests, model.outputs)
    generator = LoadGenerator(transport, requests, args.request_distribution, intervals, args.client_timeout,
                              args.max_outstanding, args.max_requests, args.seed)
    snapshots: dict[int, dict] = {}

    def on_phase(index: int, phase: Phase) -> None:
        what = f"concurrency {phase.concurrency}" if phase.concurrency else f"{phase.rate:g} requests/s"
        console.print(f"window {index + 1}: {what} for {phase.seconds:g} s", highlight=False)
        threading.Thread(target=lambda: snapshots.setdefault(
            index, _statistics(args.protocol, url, args.model, args.version)), daemon=True).start()

    console.print(f"{args.model} at {url} ({args.protocol}): {len(requests)} distinct requests, "
                  f"{'stepping load' if args.stepping else kind.lower()} levels "
                  + ", ".join(lv.label for lv in levels), highlight=False)
    run = generator.run(plan, on_phase, [args.percentile] if args.percentile else ())
    snapshots[len(run.phases)] = _statistics(args.protocol, url, args.model, args.version)
    results = _levels(run, args.stepping, snapshots, args.percentile)
    percentiles = [args.percentile] if args.percentile else []
    console.print(table(f"{args.model}: {'stepping load' if args.stepping else kind.lower()}", kind, results,
                        percentiles))
    if args.csv:
        write_perf_analyzer_csv(args.csv, kind, results, percentiles)
    if args.requests_csv:
        write_requests_csv(args.requests_csv, run.records, [p.phase.label for p in run.phases])
    failed = sum(sum(level.summary.failures.values()) for level in results)
    if failed:
        console.print(f"[yellow]{failed} requests failed[/yellow] (by status in the table; every request "
                      "is in --requests-csv)")
    return 1 if failed else 0


def _levels(run: Run, each_window: bool, snapshots: dict[int, dict], percentile: int | None) -> list[Level]:
    """One result per level: every window of a stepping load; otherwise the last (up to three,
    the stable) windows of each level, as perf_analyzer reports."""
    groups: list[list[int]] = []
    for index, phase in enumerate(run.phases):
        if each_window or not groups or run.phases[groups[-1][-1]].phase.label != phase.phase.label:
            groups.append([index])
        else:
            groups[-1].append(index)
    results = []
    for group in groups:
        used = group[-3:]
        phases: list[PhaseRun] = [run.phases[i] for i in used]
        first = phases[0].phase
        value = first.concurrency if first.concurrency is not None else first.rate
        summary = run.summary(phases, [percentile] if percentile else ())
        results.append(Level(value, summary, server_times(snapshots.get(used[0], {}),
                                                          snapshots.get(used[-1] + 1, {}))))
    return results


if __name__ == "__main__":
    sys.exit(main())
