"""Timed models: a model's interface and stages with each stage ``"engine": "timed"`` (it computes
nothing and takes its latency table's time), from a sliced model or a profile of another
machine (``python -m tools.simulate``), and the whole-model baseline kept in the cache."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from itertools import combinations
from dataclasses import replace
from pathlib import Path

from backend.manifest import LatencyTable, Manifest, StageSpec, TensorSpec
from slicer import triton_config
from slicer.slicing import VERSION
from tools.lib.paths import CACHE


def whole_path(manifest: Manifest, target: str, lengths: Sequence[int]) -> Path:
    """Where the one-stage (whole model) slicing of ``manifest``'s source lives in the cache."""
    key = "-".join(map(str, (manifest.source_sha256[:16], target, manifest.max_batch_size, *lengths)))
    return CACHE / "whole" / f"{Path(manifest.source_file).stem}-{key}"


def timed(inputs: Sequence[TensorSpec], tables: Sequence[LatencyTable]) -> tuple[StageSpec, ...]:
    """Timed stages passing ``inputs`` through: stage i reads ``X`` (``X_out`` after the first)
    and writes ``X_out``, so that the model's outputs are its inputs under other names."""
    outputs = tuple(replace(spec, name=f"{spec.name}_out") for spec in inputs)
    return tuple(StageSpec(index=i, file="", engine="timed", inputs=inputs if i == 0 else outputs, outputs=outputs,
                           latency=table) for i, table in enumerate(tables))


def summed(tables: Sequence[LatencyTable]) -> LatencyTable:
    """The whole model's table as the sum of its stages' (same batch sizes and lengths)."""
    first = tables[0]
    if any((t.batch_sizes, t.lengths, t.axis) != (first.batch_sizes, first.lengths, first.axis) for t in tables):
        raise ValueError("stage latency tables differ in batch sizes or lengths; give the profile a 'whole' table")

    def add(rows):
        return tuple(add(r) for r in zip(*rows)) if isinstance(rows[0][0], tuple) else \
            tuple(round(sum(v), 4) for v in zip(*rows))
    p99 = add([t.p99 for t in tables]) if all(t.p99 for t in tables) else None
    return replace(first, mean=add([t.mean for t in tables]), p99=p99)


def write_timed(name: str, inputs: Sequence[TensorSpec], tables: Sequence[LatencyTable], max_batch_size: int,
                source_file: str, source_sha256: str, out: Path, parameters: dict[str, str],
                whole: LatencyTable | None = None) -> Manifest:
    """A timed model of ``tables``; ``whole``, the unsliced model's table, is what its stages
    take fused (as the peers' one-stage model takes it: ``timed_whole``)."""
    stages = timed(inputs, tables)
    manifest = Manifest(source_file=source_file, source_sha256=source_sha256, max_batch_size=max_batch_size,
                        inputs=tuple(inputs), outputs=stages[-1].outputs, stages=stages, whole=whole)
    (out / VERSION).mkdir(parents=True, exist_ok=True)
    manifest.save(out / VERSION)
    (out / "config.pbtxt").write_text(triton_config.render(name, manifest, parameters, comment=(
        "# Simulated: every stage is timed (it keeps its stream busy for its table's time, as a GPU's\n"
        "# work, and passes its inputs through).\n")))
    return manifest


def whole_table(manifest: Manifest) -> LatencyTable:
    """What a timed ``manifest`` takes as one stage: its ``whole`` table, else its stages' sum."""
    return manifest.whole or summed([s.latency for s in manifest.stages])


def timed_whole(manifest: Manifest) -> Path:
    """The one-stage timed model of a timed ``manifest`` (``whole_table``), cached."""
    out = whole_path(manifest, "timed", manifest.stages[0].latency.lengths or ())
    if not (out / VERSION / "manifest.json").is_file():
        write_timed(out.name, manifest.inputs, [whole_table(manifest)], manifest.max_batch_size,
                    manifest.source_file, manifest.source_sha256, out, {})
    return out


def from_profile(path: Path) -> tuple[str, Manifest, dict[str, str]]:
    """(name, stages and whole table as a manifest-to-be, parameters) of a JSON profile."""
    data = json.loads(path.read_text())
    try:
        inputs = tuple(TensorSpec.from_json(t) for t in data["inputs"])
        tables = [LatencyTable.from_json(s["latency"]) for s in data["stages"]]
        whole = LatencyTable.from_json(data["whole"]["latency"]) if data.get("whole") else None
        name, max_bs = data.get("name", path.stem), int(data["max_batch_size"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a profile ({exc!r} missing or malformed); see python -m tools.simulate -h") \
            from None
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = Manifest(path.name, digest, max_bs, inputs, inputs, timed(inputs, tables), whole=whole)
    parameters = {**triton_config.policy_parameters(), **data.get("parameters", {})}
    return name, manifest, {k: str(v) for k, v in parameters.items()}


def groups(costs: list[float], stages: int) -> list[tuple[int, int]]:
    """Contiguous (start, end) groups of parts whose slowest sum is smallest."""
    best = None
    for cuts in combinations(range(1, len(costs)), stages - 1):
        bounds = [0, *cuts, len(costs)]
        slowest = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        if best is None or slowest < best[0]:
            best = (slowest, list(zip(bounds, bounds[1:])))
    return best[1]


def engine_ms_per_query(batches: dict[tuple[int, int], float], tables: Sequence[LatencyTable], length: int) -> float:
    """The engines' busy milliseconds per query (the energy proxy of eq. 14) of the batches a
    window ran, (stage, rows) -> runs, each taking its stage table's time."""
    busy = sum(runs * tables[stage].predict(rows, length) for (stage, rows), runs in batches.items())
    queries = sum(runs * rows for (stage, rows), runs in batches.items() if stage == 0)
    return busy / queries if queries else math.nan
