"""python -m slicer.retime DIR: measure a sliced model's stage tables again, on this machine.

A model's tables (``manifest.json``) hold for the machine the slicer measured them on
(``slicing.machine``): ``auto`` and the policies read them as the serving machine's times, and a
model served on another CPU, number of cores or GPU logs a warning when it loads. Where the source
model is not at hand to slice again, this measures every stage as the slicer did (the same batch
sizes and lengths, each stage on the real outputs of the stages before it, the engines loaded as
the backend loads them; a named axis other than the length axis at the slicer's default size, as
``--dim`` is not recorded) and rewrites, in place, the tables, each stage's preferred batch size
and the machine. The stages themselves are not touched, and neither is config.pbtxt (``policy:
auto`` reads the tables when the model loads). A TensorRT engine built for another GPU does not
load here: slice the model again there. As for the slicer, the machine should be otherwise idle
(not serving): what else runs on its cores or GPU meanwhile ends up in the tables.

Exit status 0 when rewritten, 2 when DIR cannot be read or its stages cannot run here.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from backend.config import RuntimeConfig
from backend.device import Device, make_device
from backend.engines import graph_buckets, load_engines
from backend.host import Machine, machine
from backend.manifest import MANIFEST_FILE, Manifest
from slicer.errors import SliceError
from slicer.profile import measure_stages, preferred_batch_size, wall_timer
from slicer.slicing import VERSION, SliceOptions

DEFAULTS = SliceOptions()


def retime(model_dir: Path, warmup: int = DEFAULTS.warmup, repeats: int = DEFAULTS.stage_repeats,
           improvement: float = DEFAULTS.improvement) -> tuple[Manifest, Manifest]:
    """Measure ``model_dir``'s stages on this machine and rewrite its manifest; return the
    manifest before and after."""
    version_dir = Path(model_dir) / VERSION
    try:
        before = Manifest.load(version_dir)
    except (OSError, ValueError, KeyError) as exc:
        raise SliceError(f"{model_dir}: no sliced model to retime ({exc})") from None
    report = before.slicing
    tables = [stage.latency for stage in before.stages]
    if report is None or any(table is None for table in tables):
        raise SliceError(f"{model_dir}: not a model the slicer measured (a simulated one has nothing to retime)")
    device, synchronize = _device(report.device)
    graphs = RuntimeConfig().graphs(before, report.device == "cuda")  # as the backend serves them by default
    try:
        engines = load_engines(before, version_dir, device, graphs=graphs, buckets=graph_buckets(before))
    except Exception as exc:  # noqa: BLE001 - a stage that cannot load here (another GPU's TensorRT engine)
        raise SliceError(f"{model_dir}: its stages do not load here ({type(exc).__name__}: {exc}); "
                         "slice the model again on this machine") from None
    batch_sizes, lengths = tables[0].batch_sizes, tables[0].lengths or (None,)
    measured = measure_stages(engines, before.inputs, before.stages, batch_sizes, lengths, tables[0].axis, {},
                              device.from_host, wall_timer(synchronize), warmup, repeats)
    stages = tuple(replace(stage, latency=table,
                           preferred_batch_size=preferred_batch_size(batch_sizes, table.row(lengths[-1]), improvement))
                   for stage, table in zip(before.stages, measured))
    after = replace(before, stages=stages, slicing=replace(report, machine=asdict(machine(device.gpu))))
    written = version_dir / f".{MANIFEST_FILE}.retimed"
    try:
        written.write_text(after.to_json())
        os.replace(written, version_dir / MANIFEST_FILE)  # whole, or not at all
    except OSError as exc:
        written.unlink(missing_ok=True)
        raise SliceError(f"{model_dir}: its manifest cannot be rewritten ({exc})") from None
    return before, after


def _device(kind: str) -> tuple[Device, Callable[[], None]]:
    """Where the stages were profiled (and so serve), and how to wait for its work."""
    if kind != "cuda":
        return make_device("CPU"), lambda: None
    try:
        device = make_device("GPU")
    except RuntimeError as exc:
        raise SliceError(f"the stages were sliced for a GPU: {exc}") from None
    import torch

    return device, torch.cuda.synchronize


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slicer.retime", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a model directory the slicer wrote")
    parser.add_argument("--warmup", type=int, default=DEFAULTS.warmup, help="untimed runs per configuration")
    parser.add_argument("--repeats", type=int, default=DEFAULTS.stage_repeats,
                        help=f"timed runs per stage and configuration (default {DEFAULTS.stage_repeats})")
    args = parser.parse_args(argv)
    try:
        before, after = retime(args.model_dir, args.warmup, args.repeats)
    except SliceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    was = Machine.from_json(before.slicing.machine) if before.slicing.machine else None
    print(f"{args.model_dir}: tables measured on {Machine(**after.slicing.machine).describe()}"
          + (f" (were {was.describe()})" if was else ""))
    rows, length = after.stages[0].latency.batch_sizes[-1], (after.stages[0].latency.lengths or (None,))[-1]
    at = f"{rows} rows" + (f", length {length}" if length else "")
    for old, now in zip(before.stages, after.stages):
        print(f"  stage {now.index}: {old.latency.lookup(rows, length):.3f} -> {now.latency.lookup(rows, length):.3f} "
              f"ms at {at}; preferred batch size {old.preferred_batch_size} -> {now.preferred_batch_size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
