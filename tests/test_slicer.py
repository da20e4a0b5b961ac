"""The slicer: legal cuts, stages equal to the unsliced model, time-balanced cuts, latency tables."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backend.host import Machine, machine
from backend.manifest import LatencyTable, Manifest, StageSpec, TensorSpec
from slicer.__main__ import main as slicer_main
from slicer.calibration import Span, calibrated_costs
from slicer.cuts import balanced_cuts
from slicer.errors import SliceError
from slicer.swap import PREFIX
from slicer.graph import analyse
from slicer.profile import diversity_changes, preferred_batch_size
from slicer.retime import retime
from slicer.slicing import (
    VERSION,
    auto_stages,
    length_axis,
    sha256,
    slice_model,
    verify,
    write_stages,
)
from backend.engines.onnxruntime import OnnxRuntimeTarget
from backend.engines.tensorrt import attribute_layer_times, feed_shapes, profile_shapes, tensorrt_missing
from slicer.targets import optimize

from tools.lib import synthetic

from .conftest import FAST, MAX_BATCH, ROOT


def sliced(src, out, stages, **options):
    return slice_model(src, out, replace(FAST, stages=stages, **options))


@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("name", ["resnet_like", "unet_like", "bert_like"])
def test_chained_stages_equal_unsliced_model(sources, tmp_path, name, stages):
    out = tmp_path / name
    result = sliced(sources[name], out, stages)
    assert len(result.manifest.stages) == stages
    assert result.max_abs_error <= 1e-5
    for sequence in (5, 17):  # the BERT-like model has a dynamic sequence axis
        agreement = verify(sources[name], out / VERSION, result.manifest, [1, 3, MAX_BATCH], {"sequence": sequence},
                           seed=sequence)
        assert agreement.max_abs_error <= 1e-5 and agreement.cosine > 1 - 1e-9


@pytest.mark.parametrize("name", ["resnet_like", "unet_like", "bert_like"])
def test_every_legal_cut_gives_stages_equal_to_the_source(sources, tmp_path, name):
    """Four slicings per model together cut at every legal point of the optimised graph; some cuts
    carry several tensors (U-Net skips, BERT's hidden states and mask) or pass a tensor through."""
    optimized = tmp_path / "optimized.onnx"
    analysis = analyse(optimize(sources[name], optimized, "extended"))
    legal = analysis.legal_cuts()
    assert len(legal) >= 4
    several = carried = False
    for group in range(4):
        graphs, version_dir = tmp_path / f"graphs{group}", tmp_path / f"cuts{group}"
        graphs.mkdir()
        version_dir.mkdir()
        specs = write_stages(analysis, legal[group::4], OnnxRuntimeTarget(), graphs, version_dir)
        manifest = Manifest(source_file="", source_sha256="", max_batch_size=MAX_BATCH, inputs=analysis.inputs,
                            outputs=analysis.outputs, stages=tuple(specs))
        for sequence in (3, 11):
            assert verify(sources[name], version_dir, manifest, [1, 4], {"sequence": sequence}).max_abs_error <= 1e-5
        several |= any(len(s.outputs) + len(s.carry) > 1 for s in specs[:-1])
        carried |= any(s.carry for s in specs)
    if name != "resnet_like":
        assert several, "a cut should carry several tensors"
    if name == "unet_like":
        assert carried, "a long skip should be carried through a stage that does not read it"


def test_only_batched_tensors_cross_cuts(sources):
    """The BERT-like model's shape and position tensors are recomputed in every stage that needs
    them (from the ids they are the shape of), so every cut is legal and only batched tensors
    cross."""
    analysis = analyse(onnx.load(str(sources["bert_like"])))
    assert analysis.shapes, "Shape/Range values are shape subgraphs"
    assert analysis.legal_cuts() == list(range(1, len(analysis.nodes))) and not analysis.blocking()
    for cut in analysis.legal_cuts():
        for name in analysis.crossing(cut):
            assert analysis.facts[name].batched


def shared_shape_model(path, layers: int = 4, blocker: bool = False):
    """As torch.export writes BERT: one shape vector from Shape(x), reused by a Reshape in every
    layer. With ``blocker``, a sum over the batch axis (not batched, not a shape) is added at the
    end, so every cut after it is blocked."""
    hidden = 8
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("hw", TensorProto.INT64, [1], [hidden])]
    nodes = [helper.make_node("Shape", ["x"], ["shape_x"], name="shape"),
             helper.make_node("Gather", ["shape_x", "zero"], ["b"], name="batch", axis=0),
             helper.make_node("Concat", ["b", "hw"], ["target"], name="target", axis=0)]
    inits.append(helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    h = "x"
    if blocker:
        nodes.append(helper.make_node("ReduceSum", ["x", "axes0"], ["total"], name="total", keepdims=1))
        inits.append(helper.make_tensor("axes0", TensorProto.INT64, [1], [0]))
    for i in range(layers):
        weight = rng.standard_normal((hidden, hidden)).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [hidden, hidden], weight.flatten()))
        nodes += [helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Reshape", [f"m{i}", "target"], [f"r{i}"], name=f"reshape{i}"),
                  helper.make_node("Tanh", [f"r{i}"], [f"h{i}"], name=f"tanh{i}")]
        h = f"h{i}"
    if blocker:
        nodes.append(helper.make_node("Add", [h, "total"], ["y"], name="add_total"))
    else:
        nodes.append(helper.make_node("Identity", [h], ["y"], name="out"))
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_shape_vectors_shared_by_every_layer_do_not_block_cuts(tmp_path):
    """The shape vector is recomputed in each stage from x, which the stages carry: every cut is
    legal, 4 stages come out, and the chained stages equal the source."""
    src = shared_shape_model(tmp_path / "shared.onnx")
    analysis = analyse(onnx.load(str(src)))
    assert set(analysis.shapes) == {"shape_x", "b", "target"} and analysis.roots["target"] == {"x"}
    assert analysis.legal_cuts() == list(range(1, len(analysis.nodes)))
    result = sliced(src, tmp_path / "out", 4, optimize="none")
    assert len(result.manifest.stages) == 4 and result.max_abs_error <= 1e-5
    assert result.max_abs_error <= 1e-5
    assert all("x" in s.carry or "x" in [t.name for t in s.inputs] for s in result.manifest.stages[:-1])


def test_tensors_that_still_block_cuts_are_named(tmp_path):
    src = shared_shape_model(tmp_path / "blocked.onnx", blocker=True)
    analysis = analyse(onnx.load(str(src)))
    assert list(analysis.blocking()) == ["total"]
    assert analysis.legal_cuts() == []


def brute_force(costs, legal, stages, cut_bytes=None, slack=0.0, forced=()):
    """(best slowest stage, fewest bytes among cut sets within the slack) over every cut set."""
    cut_bytes = cut_bytes or {}
    sets = [c for c in itertools.combinations(sorted(legal), stages - 1) if set(forced) <= set(c)]

    def slowest(cuts):
        bounds = [0, *cuts, len(costs)]
        return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))

    best = min(slowest(c) for c in sets)
    fewest = min(sum(cut_bytes.get(k, 0) for k in c) for c in sets if slowest(c) <= best * (1 + slack) + 1e-12)
    return best, fewest


def test_balanced_cuts_equal_brute_force():
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(2, 11)
        costs = [rng.choice([0.1, 1.0, 2.0, 5.0, rng.random() * 10]) for _ in range(n)]
        legal = sorted(rng.sample(range(1, n), rng.randint(0, n - 1)))
        stages = rng.randint(1, len(legal) + 1)
        forced = rng.sample(legal, rng.randint(0, min(len(legal), stages - 1))) if legal else []
        cut_bytes = {k: rng.randint(1, 100) for k in legal}
        slack = rng.choice([0.0, 0.05, 0.3])
        plan = balanced_cuts(costs, legal, stages, cut_bytes, slack, forced)
        best, fewest = brute_force(costs, legal, stages, cut_bytes, slack, forced)
        assert plan.optimum == pytest.approx(best)
        assert plan.bytes == fewest
        assert max(plan.stage_costs) <= best * (1 + slack) + 1e-9
        assert set(forced) <= set(plan.cuts) and len(plan.cuts) == stages - 1


def test_balanced_cuts_refuse_impossible_requests():
    with pytest.raises(SliceError, match="only 1 legal cut point in 12 nodes"):
        balanced_cuts([1.0] * 12, [5], 3)
    with pytest.raises(SliceError, match="need at least 3 stages"):
        balanced_cuts([1.0] * 12, [2, 5, 8], 2, forced=[2, 8])
    assert balanced_cuts([1.0] * 12, [], 1).cuts == ()
    plan = balanced_cuts([1, 1, 1, 1, 1, 1], [1, 2, 3, 4, 5], 2, {3: 100, 2: 1, 4: 1}, slack=0.5)
    assert plan.cuts in ((2,), (4,)) and plan.optimum == 3  # a cheaper boundary within the slack wins


def uneven_chain(path, widths):
    """x[batch, 64] through blocks MatMul(64 -> w) Relu MatMul(w -> 64) Relu: block costs grow with w."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for b, width in enumerate(widths):
        for part, shape in (("up", (64, width)), ("down", (width, 64))):
            w = f"w_{part}_{b}"
            inits.append(helper.make_tensor(w, TensorProto.FLOAT, shape,
                                            (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
                                            .flatten().tolist()))
            nodes.append(helper.make_node("MatMul", [x, w], [f"{part}_{b}"], name=f"heavy_{part}_{b}"))
            nodes.append(helper.make_node("Relu", [f"{part}_{b}"], [f"relu_{part}_{b}"], name=f"relu_{part}_{b}"))
            x = f"relu_{part}_{b}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 64])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_cuts_are_optimal_on_known_uneven_costs(tmp_path):
    """Blocks costing about 4, 2, 2, 4 units in 3 stages: every cut set near the best keeps the
    big blocks apart; and the cuts are the brute-force optimum for the measured node times. (With
    4, 1, 1, 4 half of a big block, its two MatMuls of about 2 units each, could go with the small
    ones at no cost to the bottleneck, [up 0], [down 0, 1, 2], [3], and a noisy host measured it
    so; at 2 units a small block that ties no more: any cut inside a big block costs 6.)"""
    src = uneven_chain(tmp_path / "chain.onnx", [2048, 1024, 1024, 2048])
    result = sliced(src, tmp_path / "chain", 3, balance_slack=0.0, node_repeats=5, calibration_rounds=0)
    costs = list(result.node_profile.at(MAX_BATCH, None))
    best, _ = brute_force(costs, range(1, len(costs)), 3)
    assert result.plan.optimum == pytest.approx(best)
    assert max(result.plan.stage_costs) == pytest.approx(best)
    names = result.node_profile.nodes
    bounds = [0, *result.plan.cuts, len(names)]
    blocks = [{int(n.rsplit("_", 1)[1]) for n in names[a:b] if n.startswith("heavy")}
              for a, b in zip(bounds, bounds[1:])]
    # Small nodes may go either side of a big block when the other big block is the bottleneck
    # (the minimax ties), but the big blocks never share a stage or straddle a cut.
    assert {0} <= blocks[0] <= {0, 1}
    assert blocks[1] and blocks[1] <= {1, 2}
    assert {3} <= blocks[2] <= {2, 3}


def test_preferred_batch_size_and_diversity_changes():
    sizes = (1, 2, 4, 8)
    assert preferred_batch_size(sizes, [1.0, 1.0, 1.0, 1.0], 0.1) == 8  # fixed cost: bigger is always better
    assert preferred_batch_size(sizes, [1.0, 2.0, 4.0, 8.0], 0.1) == 1  # linear: batching buys nothing
    assert preferred_batch_size(sizes, [1.0, 1.0, 2.0, 4.0], 0.1) == 2  # the paper's GEMM-B shape
    assert preferred_batch_size(sizes, [1.0, 2.1, 1.9, 8.0], 0.1) == 4  # a noisy dip is not the end
    # Runs of 8, 8, (None), 1, 1 with a tiny 4 in between that is noise.
    preferences = [8, 8, None, 4, 1, 1, 1]
    costs = [3.0, 3.0, 0.1, 0.1, 2.0, 2.0, 2.0]
    changes = diversity_changes(preferences, costs, min_run_share=0.05)
    assert [(c.after_node, c.before, c.after) for c in changes] == [(4, 8, 1)]
    assert diversity_changes([2, 2, 2], [1.0, 1.0, 1.0], 0.05) == []


def test_cut_at_diversity_places_cuts_at_the_changes(sources, tmp_path):
    result = sliced(sources["unet_like"], tmp_path / "u", None, cut_at_diversity=True)
    assert len(result.diversity_cuts) == len(result.changes)
    assert set(result.diversity_cuts) <= set(result.plan.cuts)
    assert len(result.manifest.stages) == len(result.diversity_cuts) + 1
    for name, change in result.changes:
        assert name in result.node_profile.nodes and change.before != change.after


def test_latency_tables_are_monotone_and_stored_with_units(sources, tmp_path):
    result = sliced(sources["bert_like"], tmp_path / "b", 3, stage_repeats=15)
    manifest = Manifest.load(tmp_path / "b" / VERSION)
    assert manifest == result.manifest
    report = manifest.slicing
    assert report.length_axis == "sequence" and report.balance_length == 64
    at = [s.latency.lookup(report.balance_batch_size, 64) for s in manifest.stages]
    assert report.balance == round(max(at) / (sum(at) / len(at)), 4)
    assert report.target == "onnxruntime" and report.optimization == "extended"
    assert Machine.from_json(report.machine) == machine()  # what the tables hold for
    for stage in manifest.stages:
        table = stage.latency
        assert table.unit == "ms" and table.batch_sizes == (1, 2, 4, 8)
        assert table.axis == "sequence" and table.lengths == (8, 64)
        assert stage.preferred_batch_size in table.batch_sizes and stage.buffer_bytes > 0
        for means, p99s in zip(table.mean, table.p99):
            assert all(p >= m * 0.999 for m, p in zip(means, p99s))
            # Monotone within noise: a larger batch may come out faster only by less than the
            # smaller batch's own spread (its p99 over its mean), or 0.05 ms.
            noise = [max(0.05, p - m) for m, p in zip(means, p99s)]
            for i in range(len(means) - 1):
                assert means[i + 1] >= means[i] - noise[i], f"stage {stage.index}: {means} (p99 {p99s})"
            assert means[-1] > means[0] - noise[0], f"stage {stage.index}: 8 rows faster than 1: {means}"


def test_buffer_bytes_are_the_stage_outputs_at_the_max_batch(sources, tmp_path):
    manifest = sliced(sources["resnet_like"], tmp_path / "r", 2).manifest
    assert manifest.stages[-1].buffer_bytes == MAX_BATCH * 10 * 4  # logits: 10 float32 per row
    first = manifest.stages[0]
    per_row = sum(4 * int(np.prod(t.dims)) for t in first.outputs)
    per_row += sum(4 * int(np.prod(t.dims)) for t in manifest.stages[1].inputs if t.name in first.carry)
    assert first.buffer_bytes == MAX_BATCH * per_row


def test_graph_is_optimised_before_cutting(sources, tmp_path):
    plain = optimize(sources["bert_like"], tmp_path / "none.onnx", "none")
    fused = optimize(sources["bert_like"], tmp_path / "extended.onnx", "extended")
    assert len(fused.graph.node) < len(plain.graph.node)
    assert any(n.domain == "com.microsoft" for n in fused.graph.node)
    assert len({n.name for n in fused.graph.node}) == len(fused.graph.node)
    result = sliced(sources["bert_like"], tmp_path / "b", 3, optimize="none")
    assert result.manifest.slicing.optimization == "none" and result.max_abs_error <= 1e-5


def test_model_directory_layout_and_policy_defaults(sources, tmp_path):
    out = tmp_path / "my_model"
    result = slice_model(sources["bert_like"], out, replace(FAST, stages=3, max_batch_size=4))
    config = (out / "config.pbtxt").read_text()
    assert 'name: "my_model"' in config and 'backend: "dvabatch"' in config
    assert "max_batch_size: 4" in config and "dynamic_batching" in config and "KIND_CPU" in config
    assert '{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] allow_ragged_batch: true }' in config
    assert '{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 32 ] }' in config
    assert "input diversity (axis 'sequence')" in config
    assert result.policy == {"policy": "auto"}
    for key, value in result.policy.items():
        assert f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}' in config
    manifest = Manifest.load(out / VERSION)
    assert manifest == result.manifest and manifest.max_batch_size == 4
    assert manifest.source_file == "bert_like.onnx" and manifest.source_sha256 == sha256(sources["bert_like"])
    assert [s.file for s in manifest.stages] == [f"stage_{i}.onnx" for i in range(3)]
    assert manifest.inputs[0].dims == ("sequence",)
    for previous, stage in zip(manifest.stages, manifest.stages[1:]):
        handed_over = {t.name for t in previous.outputs} | set(previous.carry)
        assert {t.name for t in stage.inputs} | set(stage.carry) <= handed_over
    bare = slice_model(sources["resnet_like"], tmp_path / "bare", replace(FAST, stages=2, policy_defaults=False))
    assert bare.policy == {} and "parameters" not in (tmp_path / "bare" / "config.pbtxt").read_text()


def test_cli_reports_the_summary(sources, tmp_path, capsys):
    out = tmp_path / "r"
    assert slicer_main([str(sources["resnet_like"]), "--stages", "2", "--out", str(out), "--node-repeats", "2",
                        "--stage-repeats", "3", "--warmup", "1"]) == 0
    text = capsys.readouterr().out
    for expected in ("first … last node", "ms @1", "ms @8", "preferred bs", "buffer @8",
                     "balance (slowest / mean stage)", "max abs error", "node profile", "how auto serves it",
                     f"stage tables measured on {machine().describe()}"):
        assert expected in text
    assert (out / VERSION / "stage_1.onnx").is_file()
    assert slicer_main([str(sources["resnet_like"]), "--out", str(out)]) == 2
    assert "--stages is needed" in capsys.readouterr().out


@pytest.mark.skipif(tensorrt_missing() is None, reason="this machine can build TensorRT engines")
def test_tensorrt_target_stops_at_once_without_gpu(sources, tmp_path, capsys):
    with pytest.raises(SliceError, match="--target tensorrt cannot run here: "):
        sliced(sources["unet_like"], tmp_path / "t", 2, target="tensorrt")
    assert not (tmp_path / "t").exists()
    assert slicer_main([str(sources["unet_like"]), "--stages", "2", "--out", str(tmp_path / "t"),
                        "--target", "tensorrt"]) == 2
    assert "tensorrt" in capsys.readouterr().out


def test_tensorrt_layer_names_map_to_nodes_and_profiles_cover_the_range():
    nodes = ["/a/Conv", "/a/Relu", "/b/MatMul", "/b/Add", "/c/Softmax", "/d/MatMul"]
    times = attribute_layer_times({
        "/a/Conv + /a/Relu": 2.0,
        "PWN(/b/MatMul, /b/Add)": 1.0,
        "{ForeignNode[/b/Add.../d/MatMul]}": 3.0,
        "Reformatting CopyNode for Input Tensor 0 to /c/Softmax": 0.5,
        "unnamed shuffle": 9.0,
    }, nodes)
    assert times.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.5 + 1.0, 1.0 + 0.5, 1.0])
    spec = TensorSpec("input_ids", "int64", ("sequence", 3, "width"))
    shapes = profile_shapes(["input_ids"], feed_shapes([spec]), 8, "sequence", 64, {"width": 5})
    assert shapes == {"input_ids": ((1, 1, 3, 5), (8, 64, 3, 5), (8, 64, 3, 5))}


def test_tensorrt_profiles_of_every_possible_stage_cover_every_length(sources, tmp_path):
    """Every tensor that can cross a cut of bert_like (as TensorRT's target optimises it), the
    ones whose axes follow the length (stored as -1: [-1, 32], [4, -1, -1]) included: its
    profile range holds the shapes it takes at every batch size and length served."""
    analysis = analyse(optimize(sources["bert_like"], tmp_path / "basic.onnx", "basic"))
    names = sorted({t for k in analysis.legal_cuts() for t in analysis.crossing(k)})
    assert any(-1 in analysis.facts[t].dims for t in names)
    ranges = profile_shapes(names, analysis.shapes_at, MAX_BATCH, "sequence", 64, {})
    for batch, length in ((1, 1), (3, 17), (MAX_BATCH, 64)):
        for name, shape in analysis.shapes_at(names, batch, {"sequence": length}).items():
            low, _, high = ranges[name]
            assert all(lo <= d <= hi for lo, d, hi in zip(low, shape, high)), (name, shape, ranges[name])
    assert any(ranges[t][0][1:] != ranges[t][2][1:] for t in names if -1 in analysis.facts[t].dims)


def test_served_sizes_stop_where_tensorrt_engines_were_built(tmp_path):
    """``max_size.<axis>`` may not raise a TensorRT model's length beyond its engines' profile."""
    from backend.config import RuntimeConfig
    from backend.errors import ConfigError

    spec = TensorSpec("ids", "int64", ("sequence",))
    table = LatencyTable(batch_sizes=(1, 2), mean=((1.0, 2.0), (2.0, 3.0)), p99=((1.0, 2.0), (2.0, 3.0)),
                         axis="sequence", lengths=(8, 64))
    stage = StageSpec(index=0, file="stage_0.plan", engine="tensorrt", inputs=(spec,), outputs=(spec,), latency=table)
    manifest = Manifest(source_file="", source_sha256="", max_batch_size=2, inputs=(spec,), outputs=(spec,),
                        stages=(stage,))
    RuntimeConfig.from_parameters({"max_size.sequence": "32"}).bind(manifest)
    for size in ("128", "0"):
        with pytest.raises(ConfigError, match="TensorRT engines were built for sizes up to 64"):
            RuntimeConfig.from_parameters({"max_size.sequence": size}).bind(manifest)
    as_ort = replace(manifest, stages=(replace(stage, engine="onnxruntime"),))
    RuntimeConfig.from_parameters({"max_size.sequence": "128"}).bind(as_ort)


def test_length_axis_is_the_inputs_named_axis():
    ids = TensorSpec("ids", "int64", ("sequence",))
    image = TensorSpec("image", "float32", ("height", "width"))
    assert length_axis([ids], "auto") == "sequence"
    assert length_axis([ids], None) is None
    assert length_axis([TensorSpec("x", "float32", (3,))], "auto") is None
    with pytest.raises(SliceError, match="several named axes"):
        length_axis([image], "auto")
    assert length_axis([image], "height") == "height"
    with pytest.raises(SliceError, match="not a named axis"):
        length_axis([ids], "time")


def test_rejects_fixed_batch_axis(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    src = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    with pytest.raises(SliceError, match="fixed.onnx: input 'x' has no dynamic batch axis"):
        sliced(src, tmp_path / "out", 1)


def test_rejects_more_stages_than_legal_cuts(sources, tmp_path):
    with pytest.raises(SliceError, match="legal cut points"):
        sliced(sources["resnet_like"], tmp_path / "r", 500)


def test_refused_slice_leaves_existing_model_untouched(sources, tmp_path):
    out = tmp_path / "r"
    sliced(sources["resnet_like"], out, 2)
    before = {p.name: p.read_bytes() for p in (out / VERSION).iterdir()}
    with pytest.raises(SliceError, match="not written"):
        sliced(sources["resnet_like"], out, 3, tolerance=-1.0)
    assert {p.name: p.read_bytes() for p in (out / VERSION).iterdir()} == before
    assert {p.name for p in out.iterdir()} == {"config.pbtxt", VERSION}  # no scratch folder left


def test_an_input_read_only_by_a_late_stage_is_carried(tmp_path):
    """``bias`` is first read by the last node: earlier stages carry it, and every step (verify,
    tables) feeds it from the model's inputs."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Relu", ["b"], ["c"]), helper.make_node("Add", ["c", "bias"], ["y"])]
    graph = helper.make_graph(nodes, "late", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
                                              helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    src = tmp_path / "late.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    manifest = sliced(src, tmp_path / "late", 3, optimize="none").manifest
    assert manifest.stages[0].carry == ("bias",) and manifest.stages[0].inputs[0].name == "x"
    assert all(s.latency is not None for s in manifest.stages)


def test_an_axis_that_padding_changes_the_answers_on_is_no_length_axis(sources, tmp_path):
    """The backend pads the shorter queries of a batch along the length axis: right where the model
    masks the padding (BERT), wrong where it reads it (a mean over the sequence). Such an axis is
    no length axis (queries then batch with their own length only), or, asked for by name, refused."""
    src = synthetic.save(synthetic.unmasked_mean(), tmp_path / "unmasked.onnx")
    result = sliced(src, tmp_path / "unmasked", 2, optimize="none")
    report = result.manifest.slicing
    assert result.manifest.length_axis is None and report.length_axis is None
    assert "changes its output 'pooled'" in report.unpadded and "own sequence only" in report.unpadded
    config = (tmp_path / "unmasked" / "config.pbtxt").read_text()
    assert "allow_ragged_batch" not in config and "# No length axis: padding one query" in config
    assert Manifest.load(tmp_path / "unmasked" / VERSION).slicing.unpadded == report.unpadded
    with pytest.raises(SliceError, match="--length-axis sequence: padding one query .* output 'pooled'.* "
                                         "give --length-axis none"):
        sliced(src, tmp_path / "named", 2, optimize="none", length_axis="sequence")
    masked = sliced(sources["bert_like"], tmp_path / "bert_like", 2).manifest
    assert masked.length_axis == "sequence" and masked.slicing.unpadded == ""


def test_a_model_whose_rows_share_a_computation_is_sliced_and_says_batching_changes_its_answers(sources, tmp_path,
                                                                                                    capsys):
    """ONNX Runtime's dynamic quantization scales each MatMul's input by the largest value of the
    whole batch, so a query's answers depend on the others in its batch, under any batching,
    Triton's too. The slicer still slices it (its stages verify against the source batch for
    batch) and says so: in the manifest, config.pbtxt and its summary. Unquantized, bert_like's
    rows are independent and nothing is said."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src = tmp_path / "bert_q.onnx"
    quantize_dynamic(str(sources["bert_like"]), str(src), weight_type=QuantType.QInt8)
    out = tmp_path / "bert_q"
    assert slicer_main([str(src), "--stages", "2", "--out", str(out), "--node-repeats", "2", "--stage-repeats", "3",
                        "--warmup", "1", "--calibration-rounds", "0"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    coupled = Manifest.load(out / VERSION).slicing.coupled
    assert coupled.startswith("one query batched with another is answered otherwise than alone (output ")
    assert f"batching changes answers: {coupled}" in said and "max_batch_size 1" in coupled
    assert f"# Batching changes answers: {coupled}." in (out / "config.pbtxt").read_text()
    assert sliced(sources["bert_like"], tmp_path / "bert_like", 2).manifest.slicing.coupled == ""


def test_never_replaces_the_source_or_a_foreign_folder(sources, tmp_path):
    """The usual Triton layout, the source in OUT/1: refused, and the source is still there; a
    folder holding other files is refused naming them; a model the slicer wrote is replaced."""
    triton_layout = tmp_path / "resnet" / VERSION
    triton_layout.mkdir(parents=True)
    source = triton_layout / "model.onnx"
    source.write_bytes(sources["resnet_like"].read_bytes())
    with pytest.raises(SliceError, match="holds the source .*resnet_sliced"):
        sliced(source, tmp_path / "resnet", 2)
    assert source.read_bytes() == sources["resnet_like"].read_bytes()
    assert [p.name for p in (tmp_path / "resnet").iterdir()] == [VERSION]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "weights.bin").write_bytes(b"keep me")
    with pytest.raises(SliceError, match=r"files the slicer did not write \(weights.bin\)"):
        sliced(sources["resnet_like"], foreign, 2)
    assert (foreign / "weights.bin").read_bytes() == b"keep me"
    ours = tmp_path / "ours"
    sliced(sources["resnet_like"], ours, 2)
    assert len(sliced(sources["resnet_like"], ours, 3).manifest.stages) == 3


def test_too_many_stages_is_refused_before_profiling(sources, tmp_path):
    steps = []
    with pytest.raises(SliceError, match=r"resnet_like.onnx has \d+ legal cut points in \d+ nodes: at most"):
        slice_model(sources["resnet_like"], tmp_path / "r", replace(FAST, stages=500),
                    lambda what, done, total: steps.append(what))
    assert steps == [] and not (tmp_path / "r").exists()


def test_sigterm_leaves_no_folder(sources, tmp_path):
    """SIGTERM in the middle of the profile: exit 130, and neither OUT nor its scratch is left."""
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "slicer", str(sources["unet_like"]), "--stages", "2",
                                "--out", str(out), "--node-repeats", "500"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    scratches = lambda: [*tmp_path.parent.glob(f"{PREFIX}out-*"), *tmp_path.glob(f"{PREFIX}out-*")]  # noqa: E731
    deadline = time.monotonic() + 60
    while not (scratches() and any(scratches()[0].iterdir())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scratches(), "the slicer never started writing"
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 130, process.stdout.read().decode()
    assert not out.exists() and not scratches()


def matmuls_then_tiny_nodes(path, tiny: int = 300, width: int = 1024):
    """Four MatMuls, then a long tail of tiny element-wise nodes: the node profile misjudges the
    tail (its per-node costs are not what a served session spends on it)."""
    rng = np.random.default_rng(0)
    inits, nodes, h = [], [], "x"
    for i in range(4):
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [width, width],
                                        (rng.standard_normal(width * width) * 0.03).astype(np.float32)))
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"], name=f"matmul{i}"))
        h = f"m{i}"
    inits.append(helper.make_tensor("eps", TensorProto.FLOAT, [1], [1e-3]))
    for i in range(tiny):
        nodes.append(helper.make_node("Add" if i % 2 else "Sub", [h, "eps"], [f"t{i}"], name=f"tiny{i}"))
        h = f"t{i}"
    graph = helper.make_graph(nodes, "tail", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
                              [helper.make_tensor_value_info(h, TensorProto.FLOAT, ["batch", width])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_calibration_rounds_are_reported_and_the_fastest_is_kept(tmp_path):
    """Each round is a cut set timed as served; the one kept is the round whose slowest stage
    measured fastest, and no rounds means the profile's cut. (Whether the rounds find the served
    optimum is timing, hence a benchmark: ``tools.slicer_bench``; the fit is tested below.)"""
    src = matmuls_then_tiny_nodes(tmp_path / "tail.onnx")
    result = slice_model(src, tmp_path / "tail", replace(FAST, stages=2, calibration_rounds=3))
    rounds = result.manifest.slicing.calibration
    assert 1 <= len(rounds) <= 3 and all({"cuts", "predicted_ms", "measured_ms"} <= set(r) for r in rounds)
    assert len({tuple(r["cuts"]) for r in rounds}) == len(rounds)  # it stops when a cut set comes back
    assert list(result.plan.cuts) == min(rounds, key=lambda r: r["measured_ms"])["cuts"]
    plain = slice_model(src, tmp_path / "plain", replace(FAST, stages=2, calibration_rounds=0))
    assert plain.manifest.slicing.calibration == ()


def test_calibration_fits_op_type_factors_and_a_per_node_cost():
    """Served = 0.5 x profiled for Conv, 1.0 x for MatMul, plus 2 us per node: from the stages of
    three cuts the fitted costs predict every other cut's stages within a few percent, and the
    cut chosen from them is the served optimum."""
    rng = np.random.default_rng(3)
    kinds = ["Conv"] * 6 + ["MatMul"] * 6 + ["Add"] * 60
    profiled = np.concatenate([rng.uniform(0.8, 1.2, 6), rng.uniform(0.4, 0.6, 6), rng.uniform(0.001, 0.002, 60)])
    truth = np.array([{"Conv": 0.5, "MatMul": 1.0, "Add": 1.0}[k] for k in kinds]) * profiled + 0.002

    def served(a, b):
        return float(truth[a:b].sum())

    spans = [Span(a, b, served(a, b)) for cut in (6, 9, 40) for a, b in ((0, cut), (cut, 72))]
    fitted = calibrated_costs(profiled, kinds, spans)
    for k in (3, 8, 10, 12, 30, 60):
        assert fitted[:k].sum() == pytest.approx(served(0, k), rel=0.05)
        assert fitted[k:].sum() == pytest.approx(served(k, 72), rel=0.05)
    legal = list(range(1, 72))
    optimum = min(legal, key=lambda k: max(served(0, k), served(k, 72)))
    assert balanced_cuts(fitted, legal, 2).cuts == (optimum,)
    assert balanced_cuts(profiled, legal, 2).cuts != (optimum,)  # the profile alone cuts elsewhere


def test_auto_stage_count_takes_the_most_even_stages_worth_their_overhead(sources, tmp_path):
    assert auto_stages(np.ones(16), range(1, 16), {}, 0.0)[0] == 8  # 2 ms stages, perfectly even
    assert auto_stages(np.full(16, 0.2), range(1, 16), {}, 0.0)[0] == 3  # 3.2 ms in all: >= 1 ms stages
    count, why = auto_stages(np.array([5.0, 0.1, 0.1, 0.1]), [1, 2, 3], {}, 0.0)
    assert count == 2 and "none has balance" in why  # one node dominates: no count is even
    assert auto_stages(np.ones(4), [], {}, 0.0) == (1, "auto: 1 stage, the model has no legal cut")
    result = sliced(sources["unet_like"], tmp_path / "auto", "auto")
    report = result.manifest.slicing
    assert report.stages_chosen.startswith(f"auto: {len(result.manifest.stages)} stages")


def test_retime_measures_the_tables_again_on_this_machine_and_touches_nothing_else(sources, tmp_path):
    """A model sliced elsewhere (``slicing.machine`` another CPU) gets this machine's tables, each
    stage's preferred batch size and this machine, at the same batch sizes and lengths; its stage
    files and config.pbtxt stay as they were, and it then loads without a warning. A simulated
    model, with nothing to measure, and a folder without a model are refused in one line."""
    out = tmp_path / "bert_like"
    sliced(sources["bert_like"], out, 2)
    version = out / VERSION
    elsewhere = Manifest.load(version)
    elsewhere = replace(elsewhere, slicing=replace(elsewhere.slicing, machine={"cpu": "Intel Xeon", "cpus": 96,
                                                                                 "gpu": ""}))
    elsewhere.save(version)
    files = {p.name: p.read_bytes() for p in [*version.glob("stage_*"), out / "config.pbtxt"]}
    before, after = retime(out, warmup=1, repeats=3)
    assert before == elsewhere and Manifest.load(version) == after
    assert Machine.from_json(after.slicing.machine) == machine() and not machine().moved_from(
        Machine.from_json(after.slicing.machine))
    for was, now in zip(before.stages, after.stages):
        assert (now.latency.batch_sizes, now.latency.lengths) == (was.latency.batch_sizes, was.latency.lengths)
        assert all(v > 0 for row in now.latency.mean for v in row) and now.latency.mean != was.latency.mean
        assert replace(now, latency=was.latency, preferred_batch_size=was.preferred_batch_size) == was
    assert files == {p.name: p.read_bytes() for p in [*version.glob("stage_*"), out / "config.pbtxt"]}
    done = subprocess.run([sys.executable, "-m", "slicer.retime", str(tmp_path / "nothing")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
