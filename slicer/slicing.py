"""Slice an ONNX model into stages and write a Triton model directory served by `dvabatch`.

Layout written::

    DIR/config.pbtxt            backend: "dvabatch", the source model's interface
    DIR/1/manifest.json         stages, their tensors, the source file and its sha256
    DIR/1/stage_<i>.onnx        one ONNX model per stage
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from backend.engine import OnnxRuntimeEngine, load_engine, run_stages
from backend.manifest import Manifest, StageSpec
from slicer import triton_config
from slicer.graph import SliceError, analyse, choose_even_cuts, node_inputs, stage_model
from slicer.sample import sample_inputs

VERSION = "1"


@dataclass(frozen=True)
class SliceResult:
    model_dir: Path
    manifest: Manifest
    max_abs_error: float  # chained stages against the source model on random inputs


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(src: Path, version_dir: Path, stages: int, max_batch_size: int,
                   dim_sizes: Mapping[str, int]) -> Manifest:
    """Cut the source model and write the stage files into ``version_dir``."""
    model = onnx.load(str(src))
    analysis = analyse(model, dim_sizes)
    node_count = len(analysis.nodes)
    if not 1 <= stages <= max(node_count, 1):
        raise SliceError(f"--stages must be between 1 and the {node_count} nodes of the model")
    cuts = choose_even_cuts(analysis.legal_cuts(), node_count, stages)
    bounds = [0, *cuts, node_count]
    specs = []
    previous = [s.name for s in analysis.inputs]
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        body = analysis.nodes[start:end]
        boundary = analysis.crossing(end) if end < node_count else [s.name for s in analysis.outputs]
        produced = {o for node in body for o in node.output}
        reads = {n for node in body for n in node_inputs(node)}
        inputs = [analysis.spec(t) for t in previous if t in reads]
        outputs = [analysis.spec(t) for t in boundary if t in produced]
        carry = tuple(t for t in boundary if t not in produced)
        missing = (reads - produced - set(previous) - set(analysis.initializers) - set(analysis.constants))
        missing |= set(carry) - set(previous)
        if missing:
            raise SliceError(f"stage {index} needs {sorted(missing)} that no earlier stage passes on")
        file = f"stage_{index}.onnx"
        onnx.save(stage_model(analysis, start, end, inputs, outputs, f"stage_{index}"), str(version_dir / file))
        specs.append(StageSpec(index=index, file=file, engine="onnxruntime", inputs=tuple(inputs),
                               outputs=tuple(outputs), carry=carry, nodes=len(body)))
        previous = boundary
    return Manifest(
        source_file=src.name, source_sha256=sha256(src), max_batch_size=max_batch_size,
        inputs=analysis.inputs, outputs=analysis.outputs, stages=tuple(specs),
    )


def verify(src: Path, version_dir: Path, manifest: Manifest, batch_sizes: list[int],
           dim_sizes: Mapping[str, int], seed: int = 0) -> float:
    """Largest absolute difference between the chained stages and the source model.

    Stages that return other tensors, or other shapes, than the source are an error, not a number.
    """
    reference = OnnxRuntimeEngine(src, [s.name for s in manifest.outputs])
    engines = [load_engine(stage, version_dir) for stage in manifest.stages]
    worst = 0.0
    for batch in batch_sizes:
        feed = sample_inputs(manifest.inputs, batch, dim_sizes, seed=seed + batch)
        expected = reference.run(feed)
        got = run_stages(engines, manifest.stages, feed)
        if set(got) != set(expected):
            raise SliceError(f"stages return {sorted(got)}, the source model {sorted(expected)}")
        for name, want in expected.items():
            if got[name].shape != want.shape:
                raise SliceError(f"stages give {name} shape {got[name].shape}, the source model {want.shape}")
            diff = np.abs(got[name].astype(np.float64) - want.astype(np.float64))
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


def slice_model(src: Path, out: Path, stages: int, max_batch_size: int = 8,
                dim_sizes: Mapping[str, int] | None = None, tolerance: float = 1e-4) -> SliceResult:
    """Slice ``src`` into ``stages`` stages and write the model directory ``out``.

    The chained stages are checked against the source model at batch sizes 1, 2 and
    ``max_batch_size``; a model whose stages disagree by more than ``tolerance`` is not written.
    """
    src, out = Path(src), Path(out)
    if max_batch_size < 1:
        raise SliceError("--max-batch-size must be at least 1")
    dim_sizes = dict(dim_sizes or {})
    out.mkdir(parents=True, exist_ok=True)
    # Build and verify beside the model, then swap the version folder in: a failed slice leaves
    # an existing model directory as it was.
    with tempfile.TemporaryDirectory(dir=out, prefix=".slicing-") as scratch:
        staged = Path(scratch) / VERSION
        staged.mkdir()
        manifest = build_manifest(src, staged, stages, max_batch_size, dim_sizes)
        batch_sizes = sorted({1, min(2, max_batch_size), max_batch_size})
        error = verify(src, staged, manifest, batch_sizes, dim_sizes)
        if not error <= tolerance:
            raise SliceError(f"stages differ from the source model by {error:.3g} (> {tolerance:g}); not written")
        manifest.save(staged)
        shutil.rmtree(out / VERSION, ignore_errors=True)
        staged.rename(out / VERSION)
    (out / "config.pbtxt").write_text(triton_config.render(out.name, manifest))
    return SliceResult(model_dir=out, manifest=manifest, max_abs_error=error)
