"""python -m tools.bench_cost: what serving costs, per request, where it is paid (not a test).

    python -m tools.bench_cost [PROFILE.json | MODEL_DIR ...] [--concurrency 1,32] [--seconds 4] [--rounds 3]
                               [--length 64] [--parameter KEY=VALUE ...] [--peers-no-spinning]
                               [--models plain,auto,...]
                               [--source SRC.onnx ...] [--out docs/results/RUN]

For each timed profile (default: ``docs/profiles/zero_2stages.json``, near-zero compute, and
``bert_base_trt_a100_2stages.json``, TensorRT speed; ``tools.simulate``: timed stages that
take their table's time, ours on a stream the host goes on beside, the peers asleep) or sliced
model directory (``python -m slicer``: real engines, on the device it was sliced for; its
unsliced source must be where the slicer found it), one tritonserver serves four models of the
same engine:

- ``plain``: the whole model as a plain Python model behind Triton's dynamic batcher (delay 0);
- ``ensemble``: its stages as an ensemble, each step its own plain model and batcher;
- ``pipeline``: our runtime with the ``pass`` policy, which never steps aside;
- ``auto``: what the slicer writes (``policy: auto``), which pipelines or serves as a plain model.

Each takes perf_analyzer's closed loop at every ``--concurrency`` in ``--rounds`` interleaved
rounds. Per model and concurrency it prints answers/s and mean latency (with 95 % intervals of
the ratio to ``plain``), Triton's batch size (requests per ``execute``; per step for the
ensemble), the CPU time per answered request of tritonserver and of the model's Python stubs
(from /proc, over the window and its warm-up; tritonserver's includes its idle threads, which
weigh at low rates) and, of the stubs', their main threads' (``execute`` and the stub's messages
to Triton; the rest is the threads a model starts, such as our executors, and the stub's
helpers), the stubs' thread switches per answered request (each hand-off between two threads
is one each way, which CPU time alone does not show apart), and per stage (ensemble step; the
plain model's one run) the rows per batch, the share of the time it was busy and how long a
request waited before it (Triton's queue, and our entry's before stage 0), so every change to
the serving path shows its effect and where the time goes. ``--out`` keeps the table
(summary.md), the numbers (cost.csv) and tritonserver's log of each profile. A model whose load or window fails is left
out, said in the table and the log, and the others measured (exit status 1); the plain model's
failure ends the run.
"""

from __future__ import annotations

import argparse
import csv
import math
import shutil
import tempfile
from dataclasses import dataclass, replace
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from tritonclient.utils import InferenceServerException

from backend.calibrate import process_cpu_s
from backend.manifest import Manifest
from slicer.errors import SliceError
from slicer.slicing import VERSION
from tools.lib import prometheus as prom
from tools.lib.cli import add_parameter_argument, names, numbers, served, table_console
from tools.lib.harness import Bench
from tools.lib.intervals import pooled, ratio
from tools.lib.paths import ROOT
from tools.lib.peers import Peer, write_ways
from tools.lib.perf_analyzer import Load, PerfAnalyzerError, Window
from tools.lib.processes import thread_switches
from tools.lib.triton import stubs_of
from tools.lib.workload import interface_of, synthetic, write_input_data

PROFILES = ROOT / "docs" / "profiles"
DEFAULT_PROFILES = (PROFILES / "zero_2stages.json", PROFILES / "bert_base_trt_a100_2stages.json")
MODELS = ("plain", "ensemble", "pipeline", "auto")
PEERS = ("plain", "ensemble")  # the baselines (``tools.lib.peers``); the others run our backend


def cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds of a process (or of its thread) so far (0 once it is gone)."""
    return process_cpu_s(pid, thread) or 0.0


@dataclass(frozen=True)
class Snapshot:
    server_s: float
    stubs_s: float
    stub_main_s: float  # the stubs' main threads: ``execute`` and the stub's messages to Triton
    stub_switches: int  # times the stubs' threads were switched out (``processes.thread_switches``)
    stats: dict[str, dict[str, float]]  # Triton's statistics per model: answered, inferences, executions, ns
    busy_us: dict[int, float]  # our runtime: stage -> wall time busy (dvabatch_stage_busy_us_total)
    entry_wait_us: float

    @classmethod
    def take(cls, bench: Bench, models: list[str], ours: str | None) -> Snapshot:
        pid = bench.server.process.pid
        stats = {}
        with bench.client() as client:
            for model in models:
                s = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
                infer = s["inference_stats"]
                stats[model] = {"answered": float(infer["success"].get("count", 0)),
                                "inferences": float(s.get("inference_count", 0)),
                                "executions": float(s.get("execution_count", 0)),
                                "queue_ns": float(infer["queue"].get("ns", 0)),
                                # per execution (inference_stats count every request of a batch)
                                "compute_ns": sum(float(b["compute_infer"].get("ns", 0))
                                                  for b in s.get("batch_stats", []))}
        busy, wait = {}, 0.0
        if ours is not None:
            values = prom.scrape(bench.metrics_url)
            busy = {int(dict(k)["stage"]): v
                    for k, v in prom.select(values, "dvabatch_stage_busy_us_total", model=ours).items()}
            wait = sum(prom.select(values, "dvabatch_entry_wait_us_total", model=ours).values())
        stubs = [stub for stub, model in stubs_of(pid).items() if model in models]
        return cls(cpu_s(pid), sum(map(cpu_s, stubs)), sum(cpu_s(stub, stub) for stub in stubs),
                   sum(map(thread_switches, stubs)), stats, busy, wait)


@dataclass(frozen=True)
class StageLoad:
    """One stage (an ensemble step; the plain model's one run) over a window."""

    rows: float  # rows per batch
    busy_us: float  # wall time busy per answered request
    queue_us: float  # time a request waited before it, per request (nan where not measured)


@dataclass(frozen=True)
class Cost:
    """One window of one model, with what it cost."""

    window: Window
    server_us: float  # tritonserver CPU per answered request
    stubs_us: float  # CPU of the model's Python stubs (an ensemble's steps') per answered request
    stub_main_us: float  # of it, their main threads' (the rest: the threads a model starts, the stub's helpers)
    stub_switches: float  # the stubs' thread switches per answered request (hand-offs between threads)
    triton_batch: tuple[float, ...]  # requests per execute (per step for an ensemble)
    stages: tuple[StageLoad, ...]


@dataclass(frozen=True)
class Plan:
    """What to measure of each profile, and how."""

    concurrencies: tuple[int, ...]
    seconds: float
    rounds: int
    length: int  # tokens per query, where the model takes text
    parameters: dict[str, str]  # config.pbtxt parameters of our two models
    models: tuple[str, ...] = MODELS
    sources: tuple[Path, ...] = ()  # unsliced sources of sliced model directories, found by sha256
    peer: Peer = Peer()  # how the plain model and the ensemble's steps are served


def build(profile: Path, folder: Path, plan: Plan) -> dict[str, list[str]]:
    """The models of ``profile`` in ``folder`` (``write_ways``): model -> the Triton models whose
    batches count."""
    return write_ways(profile, folder, plan.parameters, plan.sources, plan.peer)


def measure(bench: Bench, model: str, counted: list[str], load: Load, data: Path, seconds: float,
            staged: int = 0) -> Cost:
    """One window of ``model``; ``staged``: ours' stage count, each reported whether it ran or
    not (``auto`` serving plain from loading on runs its later stages never)."""
    peer = model in PEERS
    ours = None if peer else model
    before = Snapshot.take(bench, [model, *counted], ours)
    measured = bench.window(model, load, data, seconds, 1.0, counted if peer else ())
    after = Snapshot.take(bench, [model, *counted], ours)
    grown = {m: {k: after.stats[m][k] - before.stats[m][k] for k in after.stats[m]} for m in after.stats}
    per = 1 / max(grown[model]["answered"], 1)
    batch = tuple(grown[m]["inferences"] / max(grown[m]["executions"], 1) for m in counted)
    stages = []
    for stage in range(len(counted) if peer else max(len(after.busy_us), staged)):
        formed = {rows: n for (s, rows), n in measured.batches.items() if s == stage}
        rows = sum(r * n for r, n in formed.items()) / sum(formed.values()) if formed else math.nan
        if peer:
            step = grown[counted[stage]]
            busy, queue = step["compute_ns"] / 1e3 * per, step["queue_ns"] / 1e3 / max(step["inferences"], 1)
        else:  # Triton's queue, then the entry's, before stage 0; later stages' queues are not counted
            busy = (after.busy_us.get(stage, 0.0) - before.busy_us.get(stage, 0.0)) * per
            queue = (grown[model]["queue_ns"] / 1e3 + after.entry_wait_us - before.entry_wait_us) * per \
                if stage == 0 else math.nan
        stages.append(StageLoad(rows, busy, queue))
    return Cost(measured.window, (after.server_s - before.server_s) * 1e6 * per,
                (after.stubs_s - before.stubs_s) * 1e6 * per, (after.stub_main_s - before.stub_main_s) * 1e6 * per,
                (after.stub_switches - before.stub_switches) * per, batch, tuple(stages))


def run_profile(profile: Path, plan: Plan, console: Console, failed: dict[str, str],
                log: Path | None = None) -> list[dict]:
    """Measure ``plan.models`` of ``profile``; tritonserver's log goes to ``log`` (else it goes
    with the scratch folder). A model that failed is left out, and said in ``failed``
    ("profile model" -> why)."""
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-cost-"))
    try:
        counted = build(profile, folder, plan)
        staged = {m: len(Manifest.load(folder / m / VERSION).stages) for m in plan.models if m not in PEERS}
        data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(plan.length,)),
                                folder / "data.json")
        costs: dict[tuple[str, int], list[Cost]] = {(m, c): [] for m in plan.models for c in plan.concurrencies}
        left_out: dict[str, str] = {}
        with Bench(folder, log=log or folder / "triton.log") as bench:
            def attempt(model: str, step) -> None:
                """A peer or ours that fails (its load or a window) is reported and left out; the
                others go on. The plain model is every ratio's base: its failure ends the run."""
                if model in left_out:
                    return
                try:
                    step()
                except (PerfAnalyzerError, InferenceServerException) as exc:
                    if model == "plain":
                        raise
                    left_out[model] = str(exc).strip().splitlines()[0][:300]
                    failed[f"{profile.stem} {model}"] = left_out[model]
                    console.print(f"[red]{profile.stem}: {model} failed, left out:[/red] {left_out[model]}")

            for model in plan.models:
                def load(model: str = model) -> None:
                    for step in counted[model] if model == "ensemble" else ():
                        bench.load(step)
                    bench.load(model)
                    bench.capacity(model, data, max(plan.concurrencies), 1.0)  # warm up
                attempt(model, load)
            for _ in range(plan.rounds):
                for concurrency in plan.concurrencies:
                    for model in plan.models:
                        attempt(model, lambda model=model, c=concurrency: costs[model, c].append(
                            measure(bench, model, counted[model], Load(concurrency=c), data, plan.seconds,
                                    staged.get(model, 0))))
        measured = replace(plan, models=tuple(m for m in plan.models if m not in left_out))
        return report(profile.stem, costs, measured, console)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stage_text(stages: Sequence[StageLoad], answers_per_s: float) -> str:
    """Per stage: rows per batch, the share of the time it was busy, the wait before it ("not
    run" where it ran no batch: a later stage of ``auto`` while it served the stages fused)."""
    def text(s: StageLoad) -> str:
        if math.isnan(s.rows):
            return "not run"
        queued = "" if math.isnan(s.queue_us) else f", queued {s.queue_us / 1000:.2f} ms"
        return f"{s.rows:.1f} rows, {s.busy_us * answers_per_s / 1e6:.0%} busy{queued}"
    return " · ".join(map(text, stages))


def _mean_seen(values: Sequence[float]) -> float:
    """The mean of the values measured (nan where none was)."""
    seen = [v for v in values if not math.isnan(v)]
    return float(np.mean(seen)) if seen else math.nan


def summarise(name: str, model: str, concurrency: int, found: list[Cost], base: list[Window]) -> dict:
    windows = [c.window for c in found]
    answers = pooled(windows, "throughput")
    stages = tuple(StageLoad(*(_mean_seen([getattr(c.stages[i], f) for c in found])
                               for f in ("rows", "busy_us", "queue_us"))) for i in range(len(found[0].stages)))
    return {"profile": name, "model": model, "concurrency": concurrency, "answers_per_s": answers,
            "mean_ms": pooled(windows, "mean"), "throughput_vs_plain": ratio(windows, base, "throughput"),
            "mean_vs_plain": ratio(windows, base, "mean"),
            "triton_batch": " / ".join(f"{np.mean([c.triton_batch[i] for c in found]):.1f}"
                                       for i in range(len(found[0].triton_batch))),
            "server_us": float(np.mean([c.server_us for c in found])),
            "stubs_us": float(np.mean([c.stubs_us for c in found])),
            "stub_main_us": float(np.mean([c.stub_main_us for c in found])),
            "stub_switches": float(np.mean([c.stub_switches for c in found])), "stages": stage_text(stages, answers)}


COLUMNS = (("model", "model"), ("c", "concurrency"), ("answers/s", "answers_per_s"),
           ("vs plain", "throughput_vs_plain"), ("mean ms", "mean_ms"), ("vs plain", "mean_vs_plain"),
           ("Triton batch", "triton_batch"),
           ("server µs/req", "server_us"), ("stubs µs/req", "stubs_us"), ("of it main thread", "stub_main_us"),
           ("stub switches/req", "stub_switches"), ("per stage", "stages"))


DECIMALS = {"mean_ms": 2, "stub_switches": 1}  # the columns not shown in whole units


def cell(row: dict, key: str) -> str:
    value = row[key]
    if key in ("throughput_vs_plain", "mean_vs_plain"):
        return "" if row["model"] == "plain" else str(value)
    if isinstance(value, float):
        return f"{value:.{DECIMALS.get(key, 0)}f}"
    return str(value)


def report(name: str, costs: dict[tuple[str, int], list[Cost]], plan: Plan, console: Console) -> list[dict]:
    rows = [summarise(name, model, concurrency, costs[model, concurrency],
                      [c.window for c in costs["plain", concurrency]])
            for concurrency in plan.concurrencies for model in plan.models]
    table = Table(title=f"{name}: closed loop (perf_analyzer), {len(next(iter(costs.values())))} rounds")
    for title, _ in COLUMNS:
        table.add_column(title, justify="left" if title == "per stage" else "right")
    for row in rows:
        table.add_row(*(cell(row, key) for _, key in COLUMNS))
    console.print(table)
    return rows


def write(out: Path, rows: list[dict], console: Console, failed: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "cost.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["profile", *(key for _, key in COLUMNS)])
        for row in rows:
            writer.writerow([row["profile"], *(cell(row, key) for _, key in COLUMNS)])
    lines = ["| profile | " + " | ".join(title for title, _ in COLUMNS) + " |",
             "|---|" + "|".join("---" if key in ("model", "stages") else "---:" for _, key in COLUMNS) + "|"]
    lines += ["| " + " | ".join([row["profile"], *(cell(row, key) for _, key in COLUMNS)]) + " |" for row in rows]
    lines += ["", *(f"- {model} failed and was left out: {why}" for model, why in failed.items())] if failed else []
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    console.print(f"wrote {out / 'summary.md'} and {out / 'cost.csv'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", type=served, nargs="*", default=list(DEFAULT_PROFILES),
                        help="timed profiles (JSON) or sliced model directories (default: the near-zero and "
                             "TensorRT-speed profiles)")
    parser.add_argument("--concurrency", type=numbers(int), default="1,32",
                        help="closed-loop concurrencies (default 1,32)")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per window (default 4)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--length", type=int, default=64, help="tokens per query (default 64)")
    add_parameter_argument(parser, "our two models")
    parser.add_argument("--peers-no-spinning", action="store_true",
                        help="the plain model's and the ensemble's ONNX Runtime threads sleep when idle "
                             "(ours: --parameter allow_spinning=false)")
    parser.add_argument("--models", type=names(MODELS), default=",".join(MODELS),
                        help=f"which of {','.join(MODELS)} to measure (default all; plain always, the ratios' base)")
    parser.add_argument("--source", type=Path, action="append", default=[],
                        help="the unsliced ONNX model of a sliced model directory, where the slicer's cache does "
                             "not hold it (found by its sha256); repeatable")
    parser.add_argument("--out", type=Path, help="write summary.md and cost.csv here")
    args = parser.parse_args(argv)
    console = table_console()
    chosen = set(args.models) | {"plain"}
    plan = Plan(args.concurrency, args.seconds, args.rounds, args.length,
                dict(args.parameter), tuple(m for m in MODELS if m in chosen),
                tuple(args.source), Peer(spinning=not args.peers_no_spinning))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    try:
        rows = [row for profile in args.profiles
                for row in run_profile(profile, plan, console, failed,
                                       args.out / f"tritonserver-{profile.stem}.log" if args.out else None)]
    except (SliceError, ValueError, FileNotFoundError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except (PerfAnalyzerError, InferenceServerException) as exc:  # a window or a model load failed
        logs = f" (tritonserver's log: {args.out}/tritonserver-*.log)" if args.out else ""
        console.print(f"[red]error:[/red] {exc}{logs}")
        return 1
    if args.out:
        write(args.out, rows, console, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
