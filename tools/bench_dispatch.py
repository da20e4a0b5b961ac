"""python -m tools.bench_dispatch: SMDP dispatch (``policy: smdp``) as its paper measures it, and live.

    python -m tools.bench_dispatch [PROFILE.json ...] [--loads 0.1,0.5,0.9] [--power-weight 0]
                                   [--policies input,operator,load] [--static 8,16,32,64]
                                   [--seconds 5] [--warmup 3] [--rounds 2] [--length 64]
                                   [--out docs/results/RUN]

For each timed profile (default: the slower engine and TensorRT-speed BERT-base of
``docs/profiles``), two comparisons:

1. **The paper's** (its Fig. 5): the average cost per second of eq. 14 (mean response time plus
   ``power weight`` x mean power; energy: the engines' busy seconds) of the solved policy, the
   work-conserving one and static batch sizes, on the pipeline's tables as ``policy: smdp``
   reads them (at ``--length``), at each ``--loads`` fraction of the tables' capacity, for power
   weights 0 and 1. Exact (the embedded chain's stationary distribution), no server.
2. **Live**, through one tritonserver and perf_analyzer's Poisson loads at each fraction of the
   peak (the better of the two below at 64 in flight): mean latency of ``smdp`` (ours, ``policy:
   smdp`` with ``--power-weight``), ``smdp auto`` (the same with ``policy.auto: true``: served as a
   plain model where the pipeline cannot pay, where with a power weight it holds the requests
   for the SMDP solved for the instance: ``backend/hold.py``), ``pass`` (ours,
   the work-conserving pipeline), ``auto`` (ours, the paper's policies as the slicer writes
   them), each of ``--policies`` (ours, the paper's Policies one by one) and the plain model
   behind Triton's dynamic batcher at delay 0 and at each delay worth trying
   (``peers.delay_candidates``): its best tuned delay is the lowest mean of those at each load;
   and the SMDP paper's static batch sizes (``--static``: ours, ``policy: smdp`` with
   ``policy.static``, each batch exactly that size; Triton's batcher has none: with a preferred
   size and a long delay it still grows a batch that waits for the instance). Each
   load's windows run the models in turn, ``--rounds`` times. With a ``--power-weight``, eq. 14
   instead of the mean alone, as the policy weighs it: the mean latency plus the weight times
   the mean power, the engines' busy seconds per second (every batch the window ran, from the
   backend's counters or Triton's statistics, at its table's time, per query, times the
   arrival rate), in ms, for every model alike.

``--out`` keeps the tables (summary.md, live.csv, paper.csv) and tritonserver's log.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from tritonclient.utils import InferenceServerException

from backend import smdp
from backend.config import POLICIES, make_policy
from tools.lib.cli import names, numbers, table_console
from tools.lib.harness import Bench
from tools.lib.paths import ROOT
from tools.lib.peers import Peer, delay_candidates, write_plain
from tools.lib.perf_analyzer import Load, PerfAnalyzerError
from tools.lib.timed import engine_ms_per_query, from_profile, timed_whole, whole_table, write_timed
from tools.lib.workload import interface_of, synthetic, write_input_data

PROFILES = ROOT / "docs" / "profiles"
DEFAULT_PROFILES = (PROFILES / "slow_2stages.json", PROFILES / "bert_base_trt_a100_2stages.json")
PEAK_CONCURRENCY = 64
SMDP_WAYS = ("smdp", "smdp auto")  # policy smdp pipelined, and with policy.auto (plain where the pipeline cannot pay)


def static_sizes(max_batch: int) -> list[int]:
    """The static batch sizes compared (the paper's benchmarks): 8, 16, 32 and the largest."""
    return sorted({b for b in (8, 16, 32) if b < max_batch} | {max_batch})


def paper_rows(profile: Path, loads: tuple[float, ...], length: int) -> tuple[list[list[str]], list[str]]:
    """Eq. 14's average cost per second of each policy at each load and power weight."""
    _, manifest, _ = from_profile(profile)
    policy = make_policy("smdp", {})
    policy.bind(manifest)
    base = policy.problem(policy.tabulated_length(length), 1.0)
    top = base.max_batch
    statics = static_sizes(top)
    rows = []
    for weight in (0.0, 1.0):
        for load in loads:
            problem = replace(base, arrivals_per_s=load * base.capacity, power_weight=weight)
            solution = smdp.solve(problem)
            others = {"work-conserving": smdp.evaluate(problem, smdp.work_conserving(top)),
                      **{f"static {b}": smdp.evaluate(problem, smdp.static(b)) for b in statics}}
            best_other = min(others.values())
            rows.append([profile.stem, f"{weight:g}", f"{load:g}", str(solution.control_limit),
                         f"{solution.average_cost:.4g}", *(f"{v:.4g}" for v in others.values()),
                         f"{solution.average_cost / best_other:.3f}",
                         f"s_max {solution.s_max}, {solution.seconds * 1000:.0f} ms"])
    return rows, ["profile", "power weight", "load", "control limit", "smdp", "work-conserving",
                  *(f"static {b}" for b in statics), "smdp / best other", "solver"]


def live_rows(profile: Path, args: argparse.Namespace, console: Console) -> tuple[list[list[str]], list[str]]:
    folder = Path(tempfile.mkdtemp(prefix="dvabatch-dispatch-"))
    try:
        _, manifest, parameters = from_profile(profile)
        tables = [s.latency for s in manifest.stages]
        whole = whole_table(manifest)  # what the plain peers' one timed stage takes
        identity = (manifest.source_file, manifest.source_sha256)
        knobs = {k: v for k, v in parameters.items() if k != "policy" and not k.startswith("policy.")}
        smdp_settings = {**knobs, "policy": "smdp", "policy.power_weight": str(args.power_weight)}
        ours = {"smdp": smdp_settings, "smdp auto": {**smdp_settings, "policy.auto": "true"},
                "pass": {**knobs, "policy": "pass"}, "auto": parameters,
                **{policy: {**knobs, "policy": policy} for policy in args.policies},
                **{f"static {b}": {**knobs, "policy": "smdp", "policy.static": str(b)}
                   for b in (args.static or static_sizes(manifest.max_batch_size))}}
        for label, settings in ours.items():
            written = write_timed(_model(label), manifest.inputs, tables, manifest.max_batch_size, *identity,
                                  folder / _model(label), settings, manifest.whole)
        timed_whole(written)
        triton = {f"triton {d} us": Peer(delay_us=d) for d in [0, *delay_candidates(written)]}
        for label, peer in triton.items():
            write_plain(folder / "auto", folder, _model(label), peer)
        data = write_input_data(synthetic(interface_of(folder / "auto"), 1, {}, lengths=(args.length,)),
                                folder / "data.json")
        log = args.out / f"tritonserver-{profile.stem}.log" if args.out else folder / "triton.log"
        models = {label: _model(label) for label in (*ours, *triton)}
        rows = []
        with Bench(folder, log=log) as bench:
            for model in models.values():
                bench.load(model)
                bench.capacity(model, data, PEAK_CONCURRENCY, 1.0)  # warm up
            peak = max(bench.capacity(models[m], data, PEAK_CONCURRENCY, args.seconds) for m in ("pass", "triton 0 us"))
            for fraction in args.loads:
                load = Load(rate=fraction * peak)
                costs: dict[str, list[float]] = {label: [] for label in models}
                for _ in range(args.rounds):
                    for label, model in models.items():
                        plain = [model] if label in triton else []
                        try:
                            measured = bench.window(model, load, data, args.seconds, args.warmup, plain)
                        except PerfAnalyzerError as exc:
                            console.print(f"[red]{profile.stem} {label} {load.label}: {exc}[/red]")
                            continue
                        # eq. 14's mean power, in busy engine-ms per second: the arrival rate's worth of queries
                        power_ms = load.rate * engine_ms_per_query(measured.batches, [whole] if plain else tables,
                                                                   args.length) if args.power_weight else 0.0
                        costs[label].append(measured.window.mean_ms + args.power_weight * power_ms)
                cost = {label: sum(v) / len(v) if v else math.nan for label, v in costs.items()}
                tuned = min((cost[label] for label in triton), default=math.nan)
                others = min(v for label, v in cost.items() if label not in SMDP_WAYS)
                rows.append([profile.stem, f"{fraction:g} x {peak:.0f}/s",
                             *(f"{cost[label]:.2f}" for label in models), f"{tuned:.2f}",
                             *(f"{cost[label] / tuned:.2f}x" for label in SMDP_WAYS),
                             *(f"{cost[label] / others:.2f}x" for label in SMDP_WAYS)])
        header = ["profile", "Poisson load", *(f"{label} (ms)" for label in models), "Triton tuned (ms)",
                  *(f"{label} / Triton tuned" for label in SMDP_WAYS),
                  *(f"{label} / best other" for label in SMDP_WAYS)]
        return rows, header
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _model(label: str) -> str:
    """A Triton model's name for a column's label ("triton 0 us": triton_0_us, "input+load": input_load)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", label)


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_dispatch", description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", type=Path, nargs="*", default=list(DEFAULT_PROFILES), help="timed profiles (JSON)")
    parser.add_argument("--loads", type=numbers(float), default="0.1,0.5,0.9",
                        help="fractions of capacity (default 0.1,0.5,0.9)")
    parser.add_argument("--power-weight", type=float, default=0.0, help="policy.power_weight of the live smdp model")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per window (default 5)")
    parser.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each window (default 3)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="tokens per query (default 64)")
    parser.add_argument("--policies", type=names(tuple(POLICIES), empty=True), default="input,operator,load",
                        help="the paper's policies served live beside smdp, pass and auto "
                             "(default input,operator,load)")
    parser.add_argument("--static", type=numbers(int, empty=True), default="",
                        help="static batch sizes served live (ours, policy smdp with policy.static; "
                             "default 8,16,32 and the largest)")
    parser.add_argument("--paper-only", action="store_true", help="eq. 14's comparison alone, no server")
    parser.add_argument("--out", type=Path, help="write summary.md, paper.csv and live.csv here")
    args = parser.parse_args(argv)
    console = table_console()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    paper, live, paper_header, live_header = [], [], [], []
    try:
        for profile in args.profiles:
            rows, paper_header = paper_rows(profile, args.loads, args.length)
            paper += rows
            if not args.paper_only:
                rows, live_header = live_rows(profile, args, console)
                live += rows
    except (PerfAnalyzerError, InferenceServerException, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    lines = ["Eq. 14 (the paper's Fig. 5): average cost per second of each policy on the pipeline's tables", "",
             *_markdown(paper_header, paper)]
    if live:
        what = ("mean latency (ms)" if not args.power_weight else
                f"eq. 14 (ms): mean latency + {args.power_weight:g} x mean power (engines' busy ms per second)")
        lines += ["", f"Live: {what} under Poisson loads, power weight {args.power_weight:g}", "",
                  *_markdown(live_header, live)]
    console.print("\n".join(lines))
    if args.out:
        (args.out / "summary.md").write_text("\n".join(lines) + "\n")
        for name, header, rows in (("paper.csv", paper_header, paper), ("live.csv", live_header, live)):
            if rows:
                with (args.out / name).open("w", newline="") as f:
                    csv.writer(f).writerows([header, *rows])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
