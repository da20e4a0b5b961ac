"""Slice an ONNX model into time-balanced stages and write a Triton model directory for `dvabatch`.

The steps, in order (each can refuse with a ``SliceError``; ``OUT`` changes only at the end,
in one step, ``slicer.swap``):

0. **check** the source (``slicer.source``): a model ONNX Runtime runs, with one output row per
   query, tensor types Triton has, and ``--lengths`` it takes;
1. **optimise** the source graph (ONNX Runtime constant folding and fusions), then cut that graph;
2. **probe** it for legal cuts (``slicer.graph``);
3. **profile** every node at batch sizes 1, 2, 4 .. max and each padded length (the target's
   profiler), and find each node's preferred batch size (operator diversity);
4. **cut** where the slowest stage is fastest, moving the fewest bytes among near-optimal cuts
   (``slicer.cuts``), optionally at the operator-diversity changes;
5. **build** one file per stage for the target's engine and **verify** the chained stages
   against the unsliced source at several batch sizes and lengths;
6. **measure** each stage as a whole (mean and p99 per batch size and length) into the latency
   tables the policies read (config.pbtxt gets ``policy: auto``, which acts on them).

Layout written::

    DIR/config.pbtxt            backend: "dvabatch", the source model's interface, policy: auto
    DIR/1/manifest.json         stages, tensors, latency tables, the source file and its sha256
    DIR/1/stage_<i>.onnx|.plan  one engine file per stage
"""

from __future__ import annotations

import hashlib
import itertools
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from backend.device import CpuDevice, Device
from backend.engines import Buckets, OnnxRuntimeEngine, load_engines, run_stages
from backend.host import cpus, machine
from backend.errors import TargetError
from backend.manifest import MANIFEST_FILE, Manifest, SlicingReport, StageSpec, TensorSpec
from backend.sample import DEFAULT_DIM_SIZE, batch_sizes_up_to, sample_inputs, sizes_at
from slicer import triton_config
from slicer.calibration import Span, calibrated_costs
from slicer.cuts import CutPlan, balanced_cuts
from slicer.errors import SliceError, plural
from slicer.graph import GraphAnalysis, analyse, input_specs, stage_model
from slicer.profile import (
    DiversityChange,
    NodeProfile,
    Progress,
    diversity_changes,
    measure_stages,
    node_preferences,
    preferred_batch_size,
    wall_timer,
)
from slicer.source import cannot_run, check_source, read_source, runtime_refused
from slicer.swap import scratch_for, swap_in
from slicer.targets import Target, make_target, optimize, profile

VERSION = "1"
AUTO = "auto"


@dataclass(frozen=True)
class SliceOptions:
    """Everything ``python -m slicer`` can be told; docs/slicer.md's option table explains each."""

    stages: int | str | None = None  # None: one more than the diversity cuts (with cut_at_diversity); AUTO
    max_batch_size: int = 8
    target: str = "onnxruntime"
    optimize: str | None = None  # None: the target's default level
    dim_sizes: Mapping[str, int] = field(default_factory=dict)
    length_axis: str | None = AUTO  # AUTO: the inputs' only named dynamic axis; None: no length axis
    lengths: tuple[int, ...] = (16, 32, 64)
    balance_batch_size: int | None = None  # None: the maximum batch size
    balance_slack: float = 0.05
    cut_at_diversity: bool = False
    improvement: float = 0.10  # per-query time must drop by this much to prefer a larger batch
    min_share: float = 0.01  # nodes below this share of the time get no preferred batch size
    min_run_share: float = 0.05  # diversity runs below this share of the time are noise
    warmup: int = 3
    node_repeats: int = 10
    stage_repeats: int = 30
    tolerance: float = 1e-4  # largest absolute difference from the source (FP32 stages)
    min_cosine: float = 0.999  # least cosine similarity to the source (TF32 and FP16 stages)
    precision: str = "fp32"  # fp32, tf32 or fp16 (torch, tensorrt)
    device: str = "auto"  # torch target: cuda, cpu, or auto (a GPU where torch sees one)
    policy_defaults: bool = True  # write policy parameters chosen from the profile into config.pbtxt
    calibration_rounds: int = 3  # re-cut from served stage times at most this often (0: cut from the profile)


@dataclass(frozen=True)
class SliceResult:
    model_dir: Path
    manifest: Manifest
    max_abs_error: float  # chained stages against the source model on random inputs
    cosine: float  # their least cosine similarity to the source model's outputs
    node_profile: NodeProfile
    plan: CutPlan  # predicted stage times from the node profile
    changes: tuple[tuple[str, DiversityChange], ...]  # (first node's name, change) of operator diversity
    diversity_cuts: tuple[int, ...]  # a legal cut for each change (forced with cut_at_diversity)
    policy: dict[str, str]  # config.pbtxt parameters chosen from the profile (empty without policy_defaults)
    seconds: dict[str, float]  # wall time per step


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def length_axis(inputs: Sequence[TensorSpec], wanted: str | None) -> str | None:
    """The input axis whose padded length is profiled (input diversity), if any."""
    named = sorted({d for spec in inputs for d in spec.dims if isinstance(d, str)})
    if wanted is None:
        return None
    if wanted != AUTO:
        if wanted not in named:
            raise SliceError(f"--length-axis {wanted!r} is not a named axis of the inputs {named or '(none)'}")
        return wanted
    if len(named) > 1:
        raise SliceError(f"the inputs have several named axes {named}; choose one with --length-axis NAME (a "
                         "sequence whose padding the model masks) or --length-axis none (an image's height and "
                         "width: queries then batch with queries of their own sizes only)")
    return named[0] if named else None


def write_stages(analysis: GraphAnalysis, cuts: Sequence[int], target: Target, onnx_dir: Path,
                 version_dir: Path) -> list[StageSpec]:
    """Build each stage's ONNX graph and the file its engine loads."""
    node_count = len(analysis.nodes)
    bounds = [0, *cuts, node_count]
    specs = []
    previous = [s.name for s in analysis.inputs]
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        body = analysis.nodes[start:end]
        boundary = analysis.crossing(end) if end < node_count else [s.name for s in analysis.outputs]
        produced = {o for node in body for o in node.output}
        reads = analysis.reads(body)
        inputs = [analysis.spec(t) for t in previous if t in reads]
        outputs = [analysis.spec(t) for t in boundary if t in produced]
        carry = tuple(t for t in boundary if t not in produced)
        missing = reads - produced - set(previous)
        missing |= set(carry) - set(previous)
        if missing:
            raise SliceError(f"stage {index} needs {sorted(missing)} that no earlier stage passes on")
        graph_file = onnx_dir / f"stage_{index}.onnx"
        onnx.save(stage_model(analysis, start, end, inputs, outputs, f"stage_{index}"), str(graph_file))
        file = f"stage_{index}{target.suffix}"
        target.build_stage(graph_file, inputs, version_dir / file, analysis.shapes_at)
        specs.append(StageSpec(index=index, file=file, engine=target.engine, inputs=tuple(inputs),
                               outputs=tuple(outputs), carry=carry, nodes=len(body),
                               node_range=(body[0].name, body[-1].name)))
        previous = boundary
    return specs


@dataclass(frozen=True)
class Agreement:
    """How close the chained stages came to the source model: the largest absolute difference
    and the least cosine similarity of an output (flattened, per batch), over every check."""

    max_abs_error: float = 0.0
    cosine: float = 1.0

    def worst(self, other: Agreement) -> Agreement:
        return Agreement(max(self.max_abs_error, other.max_abs_error), min(self.cosine, other.cosine))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays, flattened (1.0 where both are zero)."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms else float(np.array_equal(a, b))


def verify(src: Path, version_dir: Path, manifest: Manifest, batch_sizes: list[int],
           dim_sizes: Mapping[str, int], seed: int = 0, device: Device | None = None,
           graphs: bool = False, buckets: Buckets | None = None) -> Agreement:
    """How close the chained stages (replaying CUDA graphs of ``buckets`` with ``graphs``) come to
    the source.

    Stages that return other tensors, or other shapes, than the source are an error, not a number.
    """
    device = device or CpuDevice()
    reference = OnnxRuntimeEngine(src, [s.name for s in manifest.outputs])
    engines = load_engines(manifest, version_dir, device, graphs=graphs, buckets=buckets)
    agreement = Agreement()
    for batch in batch_sizes:
        feed = sample_inputs(manifest.inputs, batch, dim_sizes, seed=seed + batch)
        expected = reference.run(feed)
        chained = run_stages(engines, manifest.stages, {k: device.from_host(v) for k, v in feed.items()})
        got = {name: device.to_host(tensor) for name, tensor in chained.items()}
        if set(got) != set(expected):
            raise SliceError(f"stages return {sorted(got)}, the source model {sorted(expected)}")
        for name, want in expected.items():
            if got[name].shape != want.shape:
                raise SliceError(f"stages give {name} shape {got[name].shape}, the source model {want.shape}")
            diff = np.abs(got[name].astype(np.float64) - want.astype(np.float64))
            agreement = agreement.worst(Agreement(float(diff.max()) if diff.size else 0.0, cosine(got[name], want)))
    return agreement


def graph_buckets_of(options: SliceOptions, axis: str | None) -> Buckets:
    """The CUDA graphs' buckets of the stages being sliced: the batch sizes and lengths they are
    profiled at, which their latency tables will hold (``engines.graph_buckets`` once they do)."""
    return batch_sizes_up_to(options.max_batch_size), tuple(options.lengths) if axis else ()


def _check_out(src: Path, out: Path) -> None:
    """The slicer replaces ``out/1`` and ``out/config.pbtxt`` wholesale, so ``out`` must be new,
    empty, or a model it wrote before; never a folder holding the source or anyone else's files."""
    source, target = src.resolve(), out.resolve()
    if target in source.parents:
        raise SliceError(f"--out {out} holds the source {src}, which slicing there would replace; write the "
                         f"model to another folder, for example --out {out.parent / (out.name + '_sliced')}")
    if not out.exists():
        return
    if not out.is_dir():
        raise SliceError(f"--out {out} is a file; give a folder (its name is the model's name)")
    foreign = sorted(entry.name for entry in out.iterdir() if not _written_by_slicer(entry))
    if foreign:
        raise SliceError(f"--out {out} holds files the slicer did not write ({', '.join(foreign[:5])}); "
                         "give a new or empty folder, or a model the slicer wrote before")


def _written_by_slicer(entry: Path) -> bool:
    if entry.name == "config.pbtxt":
        return entry.is_file() and 'backend: "dvabatch"' in entry.read_text(errors="replace")
    if entry.name == VERSION:
        return entry.is_dir() and (not any(entry.iterdir()) or (entry / MANIFEST_FILE).is_file())
    return entry.name.startswith(".slicing-")  # a scratch folder a killed run left


def _check(options: SliceOptions) -> None:
    if options.max_batch_size < 1:
        raise SliceError("--max-batch-size must be at least 1")
    if options.stages is None and not options.cut_at_diversity:
        raise SliceError("--stages is needed unless --cut-at-diversity chooses the stage count")
    if isinstance(options.stages, str) and options.stages != AUTO:
        raise SliceError(f"--stages must be a number or {AUTO!r}, not {options.stages!r}")
    if isinstance(options.stages, int) and options.stages < 1:
        raise SliceError("--stages must be at least 1")
    if options.calibration_rounds < 0:
        raise SliceError("--calibration-rounds must be at least 0")
    lengths = list(options.lengths)
    if not lengths or lengths[0] < 1 or lengths != sorted(set(lengths)):
        raise SliceError(f"--lengths must be increasing positive sizes, got {list(options.lengths)}")
    if options.node_repeats < 1 or options.stage_repeats < 1 or options.warmup < 0:
        raise SliceError("--repeats must be at least 1 and --warmup at least 0")
    batch_sizes = batch_sizes_up_to(options.max_batch_size)
    if options.balance_batch_size is not None and options.balance_batch_size not in batch_sizes:
        raise SliceError(f"--balance-batch-size must be one of the profiled batch sizes {list(batch_sizes)}")


@dataclass(frozen=True)
class _Plan:
    """What profiling and cutting decided, before anything is built."""

    analysis: GraphAnalysis
    node_profile: NodeProfile
    cuts: CutPlan
    changes: list[DiversityChange]
    diversity_cuts: list[int]
    row_bytes: dict[str, int]
    optimization: str
    costs: np.ndarray  # per node at the balance batch size and length (ms, as profiled)
    legal: list[int]
    cut_bytes: dict[int, int]
    forced: tuple[int, ...]
    stages_chosen: str = ""


def _plan(src: Path, optimized: Path, target: Target, axis: str | None, lengths: tuple[int | None, ...],
          options: SliceOptions, progress: Progress | None) -> _Plan:
    """Optimise, probe and profile the source, then choose the cuts."""
    level = options.optimize or target.optimizations[0]
    analysis = analyse(optimize(src, optimized, level), options.dim_sizes)
    legal = analysis.legal_cuts()
    if isinstance(options.stages, int) and options.stages > len(legal) + 1:  # known before the long profile
        raise SliceError(f"{src.name} has {plural(len(legal), 'legal cut point')} in {len(analysis.nodes)} nodes: "
                         f"at most {len(legal) + 1} stages, not {options.stages}")
    max_bs = options.max_batch_size
    node_profile = profile(target, optimized, [n.name for n in analysis.nodes], analysis.inputs,
                           batch_sizes_up_to(max_bs), lengths, axis, options.dim_sizes, options.warmup,
                           options.node_repeats, cpus().threads, progress)
    costs = node_profile.at(options.balance_batch_size or max_bs, lengths[-1])
    row_bytes = analysis.row_bytes(sizes_at(options.dim_sizes, axis, lengths[-1]))
    cut_bytes = {k: analysis.cut_bytes(row_bytes, k) * max_bs for k in legal}
    changes, diversity_cuts = _operator_diversity(node_profile, lengths[-1], costs, legal, cut_bytes, options)
    forced = tuple(diversity_cuts) if options.cut_at_diversity else ()
    chosen = ""
    if options.stages == AUTO:
        stages, chosen = auto_stages(costs, legal, cut_bytes, options.balance_slack, forced)
    else:
        stages = options.stages or len(diversity_cuts) + 1
    if options.cut_at_diversity and stages < len(diversity_cuts) + 1:
        raise SliceError(f"--cut-at-diversity found {len(diversity_cuts)} places where the preferred batch size "
                         f"changes; that needs at least {len(diversity_cuts) + 1} stages, not {stages}")
    cuts = balanced_cuts(costs, legal, stages, cut_bytes, options.balance_slack, forced)
    return _Plan(analysis, node_profile, cuts, changes, diversity_cuts, row_bytes, level, costs, legal, cut_bytes,
                 forced, chosen)


AUTO_MAX_STAGES = 8  # the paper tries 1 to 8
AUTO_BALANCE = 1.25  # a stage count whose slowest stage is this much above the mean wastes the rest
AUTO_MIN_STAGE_MS = 1.0  # shorter stages: the per-stage overhead (a hand-over, ~0.1-0.3 ms) eats the gain


def auto_stages(costs: np.ndarray, legal: Sequence[int], cut_bytes: dict[int, int], slack: float,
                forced: Sequence[int] = ()) -> tuple[int, str]:
    """``--stages auto``: the most stages (2 to 8) whose predicted balance is within
    ``AUTO_BALANCE`` and whose slowest stage still takes ``AUTO_MIN_STAGE_MS`` at the balance
    batch size: more stages give the scheduler more places to stretch and split, until the
    cuts cannot keep them even or the hand-overs cost as much as a stage. Two when none
    qualifies (one when the model has no legal cut). Returns the count and why."""
    if not legal:
        return 1, "auto: 1 stage, the model has no legal cut"
    tried, best = [], None
    for count in range(max(2, len(set(forced)) + 1), min(AUTO_MAX_STAGES, len(legal) + 1) + 1):
        plan = balanced_cuts(costs, legal, count, cut_bytes, slack, forced)
        ok = plan.balance <= AUTO_BALANCE and max(plan.stage_costs) >= AUTO_MIN_STAGE_MS
        tried.append(f"{count}: balance {plan.balance:.2f}, slowest {max(plan.stage_costs):.2f} ms")
        if ok:
            best = count
    count = best or max(2, len(set(forced)) + 1)
    rule = f"balance <= {AUTO_BALANCE} and slowest stage >= {AUTO_MIN_STAGE_MS} ms"
    why = "the most with " + rule if best else f"none has {rule}"
    return count, f"auto: {count} stages, {why} (predicted {'; '.join(tried)})"


WARN_BALANCE = 1.2  # a slowest stage this much above the mean deserves a word


def _balance_warning(plan: _Plan) -> str:
    """Why the stages cannot be even, when they cannot: the tensors that block other cuts, or
    nodes too large to split between stages."""
    if plan.cuts.balance <= WARN_BALANCE:
        return ""
    blocking = plan.analysis.blocking()
    cause = ("tensors blocking other cuts (not batched): " + ", ".join(
        f"{name} ({plural(n, 'cut')})" for name, n in itertools.islice(blocking.items(), 3)) if blocking
             else "no tensor blocks a cut: single nodes are too large for this many stages; try fewer")
    return f"the legal cuts allow a balance of {plan.cuts.balance:.2f} at best; {cause}"


def _operator_diversity(node_profile: NodeProfile, length: int | None, costs: np.ndarray, legal: Sequence[int],
                        cut_bytes: Mapping[int, int], options: SliceOptions
                        ) -> tuple[list[DiversityChange], list[int]]:
    """Where the nodes' preferred batch size changes, and a legal cut for each change: between the
    last judged node before the change and its first node, the one moving fewest bytes (the
    nearest legal cut when there is none in between)."""
    preferences = node_preferences(node_profile, length, options.improvement, options.min_share)
    changes = diversity_changes(preferences, costs, options.min_run_share)
    judged = [i for i, p in enumerate(preferences) if p is not None]
    cuts: set[int] = set()
    for change in changes if legal else ():
        low = max((i for i in judged if i < change.after_node), default=0)
        between = [k for k in legal if low < k <= change.after_node]
        cuts.add(min(between, key=lambda k: (cut_bytes[k], -k)) if between
                 else min(legal, key=lambda k: abs(k - change.after_node)))
    return changes, sorted(cuts)


def _build(analysis: GraphAnalysis, cuts: Sequence[int], target: Target, folder: Path, max_bs: int,
           src: Path | None = None, precision: str = "fp32") -> Manifest:
    """The stages of ``cuts`` written to ``folder/1`` (their ONNX graphs to ``folder/graphs``)."""
    staged, graphs = folder / VERSION, folder / "graphs"
    staged.mkdir(parents=True)
    graphs.mkdir()
    specs = [replace(spec, precision=precision) for spec in write_stages(analysis, cuts, target, graphs, staged)]
    return Manifest(source_file=src.name if src else "", source_sha256=sha256(src) if src else "",
                    max_batch_size=max_bs, inputs=analysis.inputs, outputs=analysis.outputs, stages=tuple(specs))


SERVED_TRIES = 3


def served_times(analysis: GraphAnalysis, cuts: Sequence[int], target: Target, folder: Path, options: SliceOptions,
                 batch: int, length: int | None, axis: str | None) -> list[float]:
    """Time (ms) of each stage of ``cuts`` as the backend serves it, at one batch size and length
    (its files built in ``folder``, removed after): the lowest of ``SERVED_TRIES`` means, since
    what disturbs a timing on a shared machine only ever adds to it."""
    try:
        manifest = _build(analysis, cuts, target, folder, options.max_batch_size, precision=options.precision)
        engines = load_engines(manifest, folder / VERSION, target.device, graphs=target.graphs,
                               buckets=graph_buckets_of(options, axis))
        tries = [measure_stages(engines, manifest.inputs, manifest.stages, [batch], [length], axis,
                                dict(options.dim_sizes), target.device.from_host, wall_timer(target.synchronize),
                                options.warmup, options.stage_repeats) for _ in range(SERVED_TRIES)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return [min(tables[s].lookup(batch, length) for tables in tries) for s in range(len(manifest.stages))]


def _calibrate(plan: _Plan, target: Target, scratch: Path, length: int | None, axis: str | None,
               options: SliceOptions, progress: Progress | None) -> tuple[_Plan, tuple[dict, ...]]:
    """Cut from what is served (``slicer.calibration``): each round builds the stages, times
    them as served at the balance batch size, corrects the node costs by every stage timed so
    far and cuts again; it stops when a cut set comes back or after ``calibration_rounds``, and
    keeps the set whose slowest stage measured fastest. Not for TensorRT (a build per round
    takes minutes)."""
    count = len(plan.cuts.cuts) + 1
    if options.calibration_rounds == 0 or count == 1 or target.engine == "tensorrt":
        return plan, ()
    batch = options.balance_batch_size or options.max_batch_size
    kinds = [node.op_type for node in plan.analysis.nodes]
    cuts, rounds, spans, seen = plan.cuts, [], [], set()
    for index in range(options.calibration_rounds):
        seen.add(cuts.cuts)
        measured = served_times(plan.analysis, cuts.cuts, target, scratch / f"calibrate-{index}", options, batch,
                                length, axis)
        rounds.append((cuts, measured))
        if progress:
            progress("calibrating the cuts", index + 1, options.calibration_rounds)
        bounds = [0, *cuts.cuts, len(kinds)]
        spans += [Span(start, end, ms) for start, end, ms in zip(bounds, bounds[1:], measured)]
        costs = calibrated_costs(plan.costs, kinds, spans)
        cuts = balanced_cuts(costs, plan.legal, count, plan.cut_bytes, options.balance_slack, plan.forced)
        if cuts.cuts in seen:
            break
    best, _ = min(rounds, key=lambda r: max(r[1]))
    report = tuple({"cuts": list(c.cuts), "predicted_ms": round(max(c.stage_costs), 4),
                    "measured_ms": round(max(m), 4), "measured_balance": round(max(m) / (sum(m) / len(m)), 4)}
                   for c, m in rounds)
    return replace(plan, cuts=best), report


def _build_and_verify(src: Path, plan: _Plan, target: Target, scratch: Path, lengths: tuple[int | None, ...],
                      axis: str | None, options: SliceOptions) -> tuple[Manifest, Agreement]:
    """Stage files in ``scratch/1``; refuses stages that differ from the source: FP32 ones by more
    than ``tolerance``, TF32 and FP16 ones (whose error scales with the values) by a cosine
    similarity below ``min_cosine``."""
    manifest = _build(plan.analysis, plan.cuts.cuts, target, scratch, options.max_batch_size, src,
                      options.precision)
    staged, max_bs = scratch / VERSION, options.max_batch_size
    agreement = Agreement()
    for length in dict.fromkeys((lengths[0], lengths[-1])):
        grid = sorted({1, min(3, max_bs), max_bs})
        agreement = agreement.worst(verify(src, staged, manifest, grid, sizes_at(options.dim_sizes, axis, length),
                                           seed=length or 0, device=target.device, graphs=target.graphs,
                                           buckets=graph_buckets_of(options, axis)))
    if options.precision == "fp32" and not agreement.max_abs_error <= options.tolerance:
        raise SliceError(f"stages differ from the source model by {agreement.max_abs_error:.3g} "
                         f"(> --tolerance {options.tolerance:g}); not written")
    if options.precision != "fp32" and not agreement.cosine >= options.min_cosine:
        raise SliceError(f"{options.precision} stages agree with the FP32 source model to a cosine similarity of "
                         f"{agreement.cosine:.7f} (< --min-cosine {options.min_cosine:g}; largest difference "
                         f"{agreement.max_abs_error:.3g}); not written")
    return manifest, agreement


def _measure(manifest: Manifest, plan: _Plan, target: Target, version_dir: Path, lengths: tuple[int | None, ...],
             axis: str | None, options: SliceOptions, progress: Progress | None) -> list[StageSpec]:
    """The stages with their latency tables, preferred batch sizes and buffer bytes."""
    batch_sizes = batch_sizes_up_to(options.max_batch_size)
    engines = load_engines(manifest, version_dir, target.device, graphs=target.graphs,
                           buckets=graph_buckets_of(options, axis))
    tables = measure_stages(engines, manifest.inputs, manifest.stages, batch_sizes, lengths, axis,
                            dict(options.dim_sizes), target.device.from_host, wall_timer(target.synchronize),
                            options.warmup, options.stage_repeats, progress)
    row_bytes = plan.row_bytes
    return [
        replace(spec, latency=table,
                preferred_batch_size=preferred_batch_size(batch_sizes, table.row(lengths[-1]),
                                                          options.improvement),
                buffer_bytes=options.max_batch_size * (sum(row_bytes[t.name] for t in spec.outputs)
                                                       + sum(row_bytes[t] for t in spec.carry)))
        for spec, table in zip(manifest.stages, tables)
    ]


def slice_model(src: Path, out: Path, options: SliceOptions, progress: Progress | None = None) -> SliceResult:
    """Slice ``src`` as ``options`` say and write the model directory ``out`` (see the module
    docstring); a model whose chained stages differ from the source by more than
    ``options.tolerance`` is not written, and an existing one is left as it was."""
    src, out = Path(src), Path(out)
    _check(options)
    model = read_source(src)
    try:
        specs = input_specs(model)
    except SliceError as exc:
        raise SliceError(f"{src}: {exc}") from None
    axis = length_axis(specs, options.length_axis)
    _check_out(src, out)
    lengths: tuple[int | None, ...] = tuple(options.lengths) if axis else (None,)
    findings = check_source(src, model, specs, axis, lengths, options.dim_sizes, options.tolerance)
    unpadded = findings.unpadded
    if unpadded:
        if options.length_axis != AUTO:
            raise SliceError(f"--length-axis {axis}: {unpadded}, so the backend, which pads the shorter queries of "
                             f"a batch along it, would answer them otherwise than the model does; give "
                             f"--length-axis none (queries then batch with queries of their own {axis} only)")
        unpadded = (f"no length axis: {unpadded}; queries batch with queries of their own {axis} only, profiled at "
                    f"{axis}={options.dim_sizes.get(axis, DEFAULT_DIM_SIZE)} (--dim {axis}=N)")
        axis, lengths = None, (None,)
    target = make_target(options.target, device=options.device, max_batch=options.max_batch_size, axis=axis,
                         max_length=lengths[-1], dim_sizes=dict(options.dim_sizes), precision=options.precision)
    if options.optimize and options.optimize not in target.optimizations:
        raise SliceError(f"--optimize {options.optimize} makes graphs {target.name} cannot load; use one of "
                         f"{', '.join(target.optimizations)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = scratch_for(out)
    try:
        # GPU work on a stream of its own, as the executors run it: the legacy default stream
        # would synchronise with every other stream and time what the backend never waits for.
        with target.device.running_on(target.device.stream()):
            return _slice(src, out, scratch, options, axis, lengths, target, progress, unpadded, findings.coupled)
    except Exception as exc:
        if runtime_refused(exc):
            raise cannot_run(src, exc) from exc
        if isinstance(exc, TargetError):  # what a target could not do with this model
            raise SliceError(str(exc)) from None
        raise
    finally:  # whatever stops it (SIGTERM too): OUT is as it was, or wholly the new model
        shutil.rmtree(scratch, ignore_errors=True)


def _slice(src: Path, out: Path, scratch: Path, options: SliceOptions, axis: str | None,
           lengths: tuple[int | None, ...], target: Target, progress: Progress | None, unpadded: str,
           coupled: str) -> SliceResult:
    """Everything is built and verified in ``scratch``; the finished model folder (config.pbtxt
    and the version folder) then replaces ``out`` in one step (``slicer.swap``)."""
    seconds: dict[str, float] = {}
    began = time.perf_counter()
    plan = _plan(src, scratch / "optimized.onnx", target, axis, lengths, options, progress)
    seconds["optimise, probe and cut"] = time.perf_counter() - began - plan.node_profile.seconds
    seconds["node profile"] = plan.node_profile.seconds
    began = time.perf_counter()
    plan, calibration = _calibrate(plan, target, scratch, lengths[-1], axis, options, progress)
    if calibration:
        seconds["calibrate"] = time.perf_counter() - began
    began = time.perf_counter()
    manifest, agreement = _build_and_verify(src, plan, target, scratch, lengths, axis, options)
    seconds["build and verify"] = time.perf_counter() - began
    began = time.perf_counter()
    specs = _measure(manifest, plan, target, scratch / VERSION, lengths, axis, options, progress)
    seconds["stage latency tables"] = time.perf_counter() - began
    balance_bs = options.balance_batch_size or options.max_batch_size
    at_balance = [s.latency.lookup(balance_bs, lengths[-1]) for s in specs]
    report = SlicingReport(
        target=target.name, device="cpu" if isinstance(target.device, CpuDevice) else "cuda",
        optimization=plan.optimization, balance_batch_size=balance_bs,
        balance_length=lengths[-1], balance=round(max(at_balance) / (sum(at_balance) / len(at_balance)), 4),
        length_axis=axis,
        profile_seconds=round(seconds["node profile"] + seconds["stage latency tables"], 2),
        stages_chosen=plan.stages_chosen, calibration=calibration, warning=_balance_warning(plan), unpadded=unpadded,
        coupled=coupled,
        machine=asdict(machine(target.device.gpu)),
    )
    manifest = replace(manifest, stages=tuple(specs), slicing=report)
    policy = triton_config.policy_parameters() if options.policy_defaults else {}
    manifest.save(scratch / VERSION)
    model_dir = scratch / "model"
    model_dir.mkdir()
    (scratch / VERSION).rename(model_dir / VERSION)
    (model_dir / "config.pbtxt").write_text(triton_config.render(out.name, manifest, policy))
    swap_in(model_dir, out)
    named = tuple((plan.analysis.nodes[c.after_node].name, c) for c in plan.changes)
    return SliceResult(model_dir=out, manifest=manifest, max_abs_error=agreement.max_abs_error,
                       cosine=agreement.cosine, node_profile=plan.node_profile,
                       plan=plan.cuts, changes=named, diversity_cuts=tuple(plan.diversity_cuts), policy=policy,
                       seconds=seconds)
