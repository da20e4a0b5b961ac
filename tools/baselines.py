"""Triton-batcher baselines beside a sliced model: ``<name>_zero`` and ``<name>_delay``.

    python -m tools.baselines MODEL_DIR [--source SRC.onnx] [--delay-us N] [--allow-spinning]
                              [--repository DIR]

Both serve the *unsliced* source model single-entry single-exit: Triton's dynamic batcher forms
each batch (``max_queue_delay_microseconds`` 0 for the paper's ZeroBatch, ``--delay-us`` for
DelayBatch) and the batch runs to completion (``batching: triton``). The source is cut into one
stage by the slicer, so the baselines run the same engine, graph optimisation and verification as
our stages, with every core for their one stage. Inputs along the model's length axis are
ragged: requests of different lengths share a batch and are padded to its longest query (the
paper's baseline for input diversity). A client that pads every query to one fixed length gets
the other common deployment from the same two models.

The source is found by the sha256 the sliced model's manifest records: ``--source``, else the
path it was sliced from, else the example cache. Its one-stage slice is kept in the cache
(``$DVABATCH_CACHE/whole``) and reused. A simulated model (timed stages, ``tools.simulate``) needs
no source: its baselines are one timed stage taking the whole model's time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from backend.manifest import Manifest
from slicer import triton_config
from slicer.errors import SliceError
from slicer.slicing import VERSION, SliceOptions, sha256, slice_model
from tools.build_examples import SOURCES
from tools.simulate import timed_whole, whole_path


def find_source(manifest: Manifest, given: Path | None) -> Path:
    """The unsliced source of ``manifest``, checked by its sha256."""
    candidates = [given] if given else [Path(manifest.source_file), SOURCES / Path(manifest.source_file).name]
    for path in candidates:
        if path is not None and path.is_file() and sha256(path) == manifest.source_sha256:
            return path
    if given:
        raise SliceError(f"{given} is not the model this one was sliced from (sha256 differs, or it is missing)")
    raise SliceError(f"the source model {manifest.source_file!r} was not found; pass it with --source")


def whole_model(model_dir: Path, source: Path | None = None) -> Path:
    """The source of the sliced ``model_dir`` as one stage, sliced as it was (batch sizes,
    lengths, target); kept in the cache and reused for the same source and options. A model of
    timed stages (``tools.simulate``) gets one timed stage with the whole model's table."""
    manifest = Manifest.load(model_dir / VERSION)
    if all(s.engine == "timed" for s in manifest.stages):
        return timed_whole(manifest)
    report, table = manifest.slicing, manifest.stages[0].latency
    options = SliceOptions(
        stages=1, max_batch_size=manifest.max_batch_size, policy_defaults=False,
        target=report.target if report else "onnxruntime", length_axis=report.length_axis if report else None,
        lengths=tuple(table.lengths) if table and table.lengths else SliceOptions.lengths)
    out = whole_path(manifest, options.target, options.lengths)
    try:
        version = out / VERSION
        if all((version / s.file).is_file() for s in Manifest.load(version).stages):
            return out
    except (FileNotFoundError, ValueError, KeyError):
        pass
    slice_model(find_source(manifest, source), out, options)
    return out


def link_version(model_dir: Path, out: Path) -> None:
    """``out`` afresh with the version folder of ``model_dir``: its files hard-linked where the
    file system allows (stage files can be large), copied where not."""
    shutil.rmtree(out, ignore_errors=True)
    (out / VERSION).mkdir(parents=True)
    for item in (model_dir / VERSION).iterdir():
        try:
            os.link(item, out / VERSION / item.name)
        except OSError:
            shutil.copy2(item, out / VERSION / item.name)


def write_baseline(whole: Path, repository: Path, name: str, delay_us: int, spinning: bool = False,
                   ragged: bool = True) -> Path:
    """A model ``name`` in ``repository`` serving the one-stage ``whole`` behind Triton's dynamic
    batcher with ``delay_us``; with ``ragged`` (and a length axis) requests of different lengths
    share batches, padded to the longest, else only requests of equal shapes do (Triton's
    default). Stage files are hard-linked where the file system allows."""
    manifest = Manifest.load(whole / VERSION)
    out = repository / name
    link_version(whole, out)
    axis = manifest.length_axis if ragged else None
    comment = (f"# Baseline: the unsliced model, single-entry single-exit behind Triton's dynamic batcher "
               f"(delay {delay_us} us)" + (f"; requests of different '{axis}' padded to the longest" if axis else "")
               + ".\n")
    parameters = {"batching": "triton", "allow_spinning": str(spinning).lower()}
    (out / "config.pbtxt").write_text(triton_config.render(name, manifest, parameters, queue_delay_us=delay_us,
                                                           ragged_axis=axis, comment=comment))
    return out


def default_delay_us(whole: Path) -> int:
    """A query's own time on the whole model (batch size 1, longest length): a common delay."""
    table = Manifest.load(whole / VERSION).stages[0].latency
    return max(1, round(table.row(table.lengths[-1] if table.lengths else None)[0] * 1000))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.baselines", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a model directory written by python -m slicer")
    parser.add_argument("--source", type=Path, help="the unsliced ONNX model (default: found by its sha256)")
    parser.add_argument("--delay-us", type=int, help="DelayBatch's max_queue_delay_microseconds "
                                                     "(default: one query's time on the whole model)")
    parser.add_argument("--allow-spinning", action="store_true", help="let ONNX Runtime's idle threads spin")
    parser.add_argument("--exact-shapes", action="store_true",
                        help="batch only requests of equal shapes (Triton's default), never pad them")
    parser.add_argument("--repository", type=Path, help="where to write them (default: beside MODEL_DIR)")
    args = parser.parse_args(argv)
    repository = args.repository or args.model_dir.parent
    try:
        whole = whole_model(args.model_dir, args.source)
    except (SliceError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    delay = args.delay_us if args.delay_us is not None else default_delay_us(whole)
    name = args.model_dir.name
    for suffix, delay_us in (("_zero", 0), ("_delay", delay)):
        out = write_baseline(whole, repository, name + suffix, delay_us, args.allow_spinning, not args.exact_shapes)
        print(f"wrote {out} (max_queue_delay_microseconds {delay_us})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
