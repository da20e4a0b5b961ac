"""python -m tools.send_cost: what answering through response senders costs on this host (not a test).

    python -m tools.send_cost [--concurrency 1,16,64] [--seconds 3] [--rounds 2] [--length 64]
                              [--out docs/results/RUN]

A pipeline answers each query when it leaves the last stage, after the ``execute`` that handed it
over has returned (multi-exit): on stock Triton that is a ``send()`` through the request's
response sender, where a plain model returns every response of a batch in the one message
``execute`` sends back anyway. This measures the difference alone, with no engine and no
dvabatch code: one tritonserver serves three identity Python models
(``tools/lib/send_cost_model.py``) that differ only in how they answer: ``return`` (the list),
``send`` (a sender, inside ``execute``) and ``exit`` (a sender, from another thread after
``execute`` returned, as ``backend/exit.py`` answers). Closed loops (perf_analyzer) at each
``--concurrency``, ``--rounds`` interleaved rounds of two int64 inputs of ``--length``. Per
model and concurrency: answers/s, Triton's batch (requests per ``execute``), and the CPU per
answered request of the model's stub and of tritonserver, each with its ratio to ``return``.
What ``exit`` pays beyond ``return`` is a floor under what any multi-exit pipeline pays per
query on this host, whatever its own Python costs (``decide.ModeSwitch`` reads tritonserver's
CPU while serving for this reason).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from backend.calibrate import process_cpu_s
from tools.lib.cli import numbers, table_console
from tools.lib.harness import Bench
from tools.lib.perf_analyzer import Load
from tools.lib.triton import stubs_of

MODEL = Path(__file__).parent / "lib" / "send_cost_model.py"
WAYS = ("return", "send", "exit")
CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 64
input [ {{ name: "in0" data_type: TYPE_INT64 dims: [ {length} ] }},
         {{ name: "in1" data_type: TYPE_INT64 dims: [ {length} ] }} ]
output [ {{ name: "out0" data_type: TYPE_INT64 dims: [ {length} ] }},
          {{ name: "out1" data_type: TYPE_INT64 dims: [ {length} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters: {{ key: "answer" value: {{ string_value: "{name}" }} }}
"""


@dataclass(frozen=True)
class Cell:
    way: str
    concurrency: int
    answers_s: float
    batch: float  # requests per execute
    stub_us: float  # the model's stub CPU per answered request
    server_us: float  # tritonserver's CPU per answered request


def write_repository(folder: Path, length: int) -> tuple[Path, Path]:
    """The three models and perf_analyzer's input data."""
    repository = folder / "repository"
    for way in WAYS:
        (repository / way / "1").mkdir(parents=True)
        shutil.copy(MODEL, repository / way / "1" / "model.py")
        (repository / way / "config.pbtxt").write_text(CONFIG.format(name=way, length=length))
    data = folder / "data.json"
    row = {"in0": {"content": list(range(length)), "shape": [length]},
           "in1": {"content": [1] * length, "shape": [length]}}
    data.write_text(json.dumps({"data": [row]}))
    return repository, data


def _counts(bench: Bench, way: str) -> tuple[float, float]:
    """Requests answered and ``execute`` calls so far."""
    with bench.client() as client:
        stats = client.get_inference_statistics(way, as_json=True)["model_stats"][0]
    return float(stats["inference_stats"]["success"].get("count", 0)), float(stats.get("execution_count", 0))


def measure(bench: Bench, way: str, concurrency: int, data: Path, seconds: float) -> Cell:
    server = bench.server.process.pid
    stub = next(pid for pid, model in stubs_of(server).items() if model == way)

    def cpu() -> tuple[float, float]:
        return process_cpu_s(stub) or 0.0, process_cpu_s(server) or 0.0
    (stub0, server0), (answered0, runs0) = cpu(), _counts(bench, way)
    window = bench.window(way, Load(concurrency=concurrency), data, seconds, 1.0, [way]).window
    (stub1, server1), (answered1, runs1) = cpu(), _counts(bench, way)
    answered = max(answered1 - answered0, 1.0)
    return Cell(way, concurrency, window.throughput, answered / max(runs1 - runs0, 1.0),
                (stub1 - stub0) * 1e6 / answered, (server1 - server0) * 1e6 / answered)


def summarize(cells: list[Cell]) -> list[dict]:
    """Per way and concurrency, the median over the rounds, with ratios to ``return``."""
    rows = []
    for concurrency in sorted({c.concurrency for c in cells}):
        medians = {}
        for way in WAYS:
            mine = [c for c in cells if c.way == way and c.concurrency == concurrency]
            if mine:
                medians[way] = {k: statistics.median(getattr(c, k) for c in mine)
                                for k in ("answers_s", "batch", "stub_us", "server_us")}
        base = medians.get("return")
        for way, m in medians.items():
            rows.append({"way": way, "concurrency": concurrency, **{k: round(v, 1) for k, v in m.items()},
                         **({f"{k}_vs_return": round(m[k] / base[k], 2) for k in ("answers_s", "stub_us", "server_us")}
                            if base else {})})
    return rows


def show(rows: list[dict], rounds: int) -> Table:
    table = Table(title=f"answering from execute's list, or through response senders (median of {rounds} rounds)")
    for column in ("way", "in flight", "answers/s", "vs return", "Triton batch", "stub µs/req", "vs return",
                   "server µs/req", "vs return"):
        table.add_column(column, justify="left" if column == "way" else "right")
    for r in rows:
        table.add_row(r["way"], str(r["concurrency"]), f"{r['answers_s']:.0f}",
                      f"{r.get('answers_s_vs_return', 1):.2f}x",
                      f"{r['batch']:.1f}", f"{r['stub_us']:.0f}", f"{r.get('stub_us_vs_return', 1):.2f}x",
                      f"{r['server_us']:.0f}", f"{r.get('server_us_vs_return', 1):.2f}x")
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.send_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=numbers(int), default=(1, 16, 64))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="each input's elements per request")
    parser.add_argument("--out", type=Path, help="keep summary.md and send_cost.csv here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dvabatch-send-") as scratch:
        repository, data = write_repository(Path(scratch), args.length)
        log = args.out / "tritonserver.log" if args.out else None
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
        cells = []
        with Bench(repository, log) as bench:
            for way in WAYS:
                bench.load(way)
            for _ in range(args.rounds):
                for concurrency in args.concurrency:
                    cells += [measure(bench, way, concurrency, data, args.seconds) for way in WAYS]
    rows = summarize(cells)
    table = show(rows, args.rounds)
    table_console().print(table)
    if args.out:
        with open(args.out / "send_cost.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(Cell.__dataclass_fields__))
            writer.writeheader()
            writer.writerows(c.__dict__ for c in cells)
        with open(args.out / "summary.md", "w") as f:
            Console(file=f, width=200).print(table)
        print(f"wrote {args.out / 'summary.md'} and {args.out / 'send_cost.csv'}")


if __name__ == "__main__":
    main()
