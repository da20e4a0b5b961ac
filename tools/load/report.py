"""What a load run writes: perf_analyzer's CSV, a CSV of every request, and a console table."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from tools.load.stats import PERCENTILES, Record, Summary

SERVER_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")
REQUEST_COLUMNS = ("phase", "label", "index", "item", "scheduled_s", "sent_s", "received_s", "latency_ms", "status",
                   "rows", "length", "error")


@dataclass(frozen=True)
class Level:
    """One measured load level: its value (a concurrency or a rate), the numbers, and Triton's
    own average time per request in each of ``SERVER_PARTS`` (microseconds) while it ran."""

    value: float
    summary: Summary
    server_us: Mapping[str, float]


def server_times(before: Mapping, after: Mapping) -> dict[str, float]:
    """Average microseconds per successful request in each part, from two snapshots of Triton's
    model statistics (``inference_stats`` as JSON)."""
    def part(stats: Mapping, name: str) -> tuple[int, int]:
        entry = stats.get(name, {})
        return int(entry.get("count", 0)), int(entry.get("ns", 0))
    count = part(after, "success")[0] - part(before, "success")[0]
    return {name: (part(after, name)[1] - part(before, name)[1]) / 1000 / count if count else 0.0
            for name in SERVER_PARTS}


def write_perf_analyzer_csv(path: Path, kind: str, levels: Sequence[Level], percentiles: Sequence[int]) -> None:
    """perf_analyzer's ``-f`` file: one row per level sorted by throughput, times in microseconds.
    Client Send and Client Recv are 0: requests are serialized before the run and responses are
    not decoded. Our own columns follow perf_analyzer's."""
    shown = sorted({*PERCENTILES, *percentiles})
    header = [kind, "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
              "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
              *(f"p{p} latency" for p in shown), "Avg latency", "Requests", "Failures", "Late Sends"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for level in sorted(levels, key=lambda lv: lv.summary.throughput):
            s, server = level.summary, level.server_us
            avg_us = _us(s.mean_ms)
            network = max(0, round(avg_us - sum(server.values()))) if avg_us else 0
            writer.writerow([_value(level.value), f"{s.throughput:.1f}", 0, network,
                             *(round(server.get(p, 0)) for p in SERVER_PARTS), 0,
                             *(_us(s.percentiles_ms[p]) for p in shown), avg_us, s.requests,
                             sum(s.failures.values()), s.late_sends])


def write_requests_csv(path: Path, records: Sequence[Record], labels: Sequence[str]) -> None:
    """Every request: when it was due, sent and answered (seconds from the start), its status."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        for index, r in enumerate(records):
            writer.writerow([r.phase, labels[r.phase] if r.phase < len(labels) else "", index, r.item,
                             f"{r.scheduled:.6f}", f"{r.sent:.6f}", f"{r.received:.6f}", f"{r.latency_ms:.3f}",
                             r.status, r.rows, "" if r.length is None else r.length, r.error])


def table(title: str, kind: str, levels: Sequence[Level], percentiles: Sequence[int]) -> Table:
    shown = sorted({*PERCENTILES, *percentiles})
    out = Table(title=title)
    for column in (kind, "requests", "failures", "infer/s", "mean ms", *(f"p{p} ms" for p in shown), "late sends"):
        out.add_column(column, justify="right")
    for level in levels:
        s = level.summary
        failures = ", ".join(f"{n} {status}" for status, n in sorted(s.failures.items())) or "0"
        out.add_row(_value(level.value), str(s.requests), failures, f"{s.throughput:.1f}", _ms(s.mean_ms),
                    *(_ms(s.percentiles_ms[p]) for p in shown), str(s.late_sends))
    return out


def _value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _us(ms: float) -> int:
    return 0 if math.isnan(ms) else round(ms * 1000)


def _ms(ms: float) -> str:
    return "-" if math.isnan(ms) else f"{ms:.2f}"
