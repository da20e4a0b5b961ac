"""The torch engine on the CPU: its ONNX interpreter against ONNX Runtime, operator by operator
and on whole models, a model sliced for it, and its refusals. The CUDA path is in test_cuda.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import NamedTuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend.device import CpuDevice
from backend.engines import OnnxRuntimeEngine, TorchEngine, load_engines, on_host_cores, run_stages
from backend.host import Machine, machine
from backend.manifest import Manifest
from backend.decide import choose
from slicer.errors import SliceError
from slicer.graph import input_specs
from backend.sample import sample_inputs
from slicer.slicing import VERSION, slice_model
from slicer.targets import optimize

from .conftest import FAST

torch = pytest.importorskip("torch")

TOLERANCE = 1e-4  # FP32, TF32 off: what the slicer verifies sliced stages to


def model(op: str, inputs: list[np.ndarray], attrs: dict | None = None, constants: dict | None = None,
          outputs: int = 1, opset: int = 17) -> onnx.ModelProto:
    """One ``op`` node reading graph inputs x0, x1 .. and ``constants`` (initializers, by name)."""
    names = [f"x{i}" for i in range(len(inputs))]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in zip(names, inputs)]
    inits = [numpy_helper.from_array(value, name) for name, value in (constants or {}).items()]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names + list(constants or {}), outs, **(attrs or {}))
    graph = helper.make_graph([node], op, ins, [onnx.ValueInfoProto(name=o) for o in outs], inits)
    # IR 8 (opsets up to 17): the default of a newer onnx can be past what an older ONNX Runtime reads.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


class Case(NamedTuple):
    op: str
    inputs: list[np.ndarray]
    attrs: dict
    constants: dict
    outputs: int = 1
    opset: int = 17


def i64(*values) -> np.ndarray:
    return np.array(values, np.int64)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
M = RNG.standard_normal((2, 5, 6)).astype(np.float32)
CASES = {
    "Slice, negative step and axes": ("Slice", [M], {}, {"s": i64(-1, 1), "e": i64(-100, 5), "a": i64(2, 1),
                                                          "t": i64(-2, 2)}),
    "Gather, negative indices": ("Gather", [M], {"axis": 1}, {"i": i64([-1, 0], [2, -2])}),
    "Reshape, zero keeps a dim": ("Reshape", [M], {}, {"s": i64(0, -1)}),
    "Unsqueeze": ("Unsqueeze", [M], {}, {"a": i64(-1, 0)}),
    "Squeeze": ("Squeeze", [M[:, :1]], {}, {"a": i64(1)}),
    "Flatten at the rank": ("Flatten", [M], {"axis": 3}, {}),
    "Split into equal parts": ("Split", [M], {"axis": 2, "num_outputs": 3}, {}, 3, 18),
    "Split by sizes": ("Split", [M], {"axis": 1}, {"s": i64(2, 3)}, 2),
    "Pad, reflect": ("Pad", [X], {"mode": "reflect"}, {"p": i64(0, 0, 1, 2, 0, 0, 2, 1)}),
    "Resize, nearest x2": ("Resize", [X], {"mode": "nearest"}, {"r": np.zeros(0, np.float32),
                                                                 "s": np.array([1, 1, 2, 2], np.float32)}),
    "Resize, linear half_pixel": ("Resize", [X], {"mode": "linear"}, {"r": np.zeros(0, np.float32),
                                                                      "s": np.array([1, 1, 2, 2], np.float32)}),
    "Conv, uneven pads and groups": ("Conv", [X], {"pads": [0, 1, 1, 2], "group": 3, "strides": [2, 1]},
                                     {"w": RNG.standard_normal((6, 1, 3, 3)).astype(np.float32)}),
    "MaxPool, ceil mode": ("MaxPool", [X], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, {}),
    "AveragePool, pads": ("AveragePool", [X], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, {}),
    "Softmax, opset 11": ("Softmax", [M], {"axis": 1}, {}, 1, 11),
    "Gemm, transposed": ("Gemm", [M[0]], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
                         {"b": RNG.standard_normal((3, 5)).astype(np.float32),
                          "c": RNG.standard_normal((3,)).astype(np.float32)}),
    "ReduceMean, axes attribute": ("ReduceMean", [M], {"axes": [1], "keepdims": 0}, {}),
    "ReduceSum, axes input": ("ReduceSum", [M], {"keepdims": 1}, {"a": i64(-1)}),
    "Expand": ("Expand", [M[:, :1]], {}, {"s": i64(3, 2, 5, 1)}),
    "Range": ("Range", [], {}, {"a": np.array(2, np.int64), "b": np.array(11, np.int64), "c": np.array(3, np.int64)}),
    "ConstantOfShape": ("ConstantOfShape", [], {"value": numpy_helper.from_array(np.array([7], np.int64))},
                        {"s": i64(2, 3)}),
    "Where": ("Where", [M > 0, M], {}, {"y": np.zeros((6,), np.float32)}),
    "Clip, bounds as inputs": ("Clip", [M], {}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}),
    "Tile": ("Tile", [M], {}, {"r": i64(1, 2, 1)}),
    "BatchNormalization": ("BatchNormalization", [X], {"epsilon": 1e-3}, {
        "g": RNG.random(3).astype(np.float32), "b": RNG.random(3).astype(np.float32),
        "m": RNG.random(3).astype(np.float32), "v": RNG.random(3).astype(np.float32) + 0.5}),
    "LayerNormalization": ("LayerNormalization", [M], {"epsilon": 1e-5},
                           {"g": RNG.random(6).astype(np.float32), "b": RNG.random(6).astype(np.float32)}),
    "Einsum": ("Einsum", [M, M], {"equation": "bij,bkj->bik"}, {}),
    "Div on integers truncates": ("Div", [i64(7, -7, 9)], {}, {"d": i64(2, 2, -4)}),
    "Cast to bool": ("Cast", [M], {"to": TensorProto.BOOL}, {}),
    "GatherElements, negative indices": ("GatherElements", [M], {"axis": 2},
                                         {"i": np.array([[[0, -1]] * 5, [[5, 2]] * 5], np.int64)}),
    "GatherND": ("GatherND", [M], {}, {"i": i64([[0, 4], [1, -1]])}),
    "GatherND, batch dims": ("GatherND", [M], {"batch_dims": 1}, {"i": i64([[2, 5], [0, 0]], [[4, -1], [1, 2]])}),
    "IsNaN": ("IsNaN", [np.array([1.0, np.nan, -np.inf], np.float32)], {}, {}),
    "IsInf, positive only": ("IsInf", [np.array([1.0, np.inf, -np.inf], np.float32)], {"detect_negative": 0}, {}),
    "Trilu, lower with k": ("Trilu", [M], {"upper": 0}, {"k": np.array(1, np.int64)}),
    "CumSum, exclusive and reverse": ("CumSum", [M], {"exclusive": 1, "reverse": 1}, {"a": np.array(2, np.int64)}),
    "Mod on integers": ("Mod", [i64(7, -7, 9)], {}, {"d": i64(3, 3, -4)}),
    "Sign": ("Sign", [M], {}, {}),
}


@pytest.mark.parametrize("case", CASES)
def test_each_operator_matches_onnx_runtime(case):
    op, inputs, attrs, constants, outputs, opset = Case(*CASES[case])
    graph = model(op, inputs, attrs, constants, outputs, opset)
    names = [o.name for o in graph.graph.output]
    feed = {f"x{i}": a for i, a in enumerate(inputs)}
    want = OnnxRuntimeEngine(graph.SerializeToString(), names).run(feed)
    got = TorchEngine(graph.SerializeToString(), names, CpuDevice()).run(feed)
    for name in names:
        assert got[name].shape == want[name].shape, name
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("level", ["none", "basic"])
def test_whole_models_match_onnx_runtime(sources, tmp_path, level):
    """Every example model, optimised as the torch target cuts it, at two batch sizes and lengths."""
    for name, src in sources.items():
        path = tmp_path / f"{name}-{level}.onnx"
        graph = optimize(src, path, level)
        specs = input_specs(graph)
        outputs = [o.name for o in graph.graph.output]
        for batch, length in ((1, 5), (8, 40)):
            feed = sample_inputs(specs, batch, {"sequence": length}, seed=batch)
            want = OnnxRuntimeEngine(path, outputs).run(feed)
            got = TorchEngine(path, outputs, CpuDevice()).run(feed)
            for out in outputs:
                np.testing.assert_allclose(got[out], want[out], atol=TOLERANCE, rtol=0, err_msg=f"{name} {out}")


def test_unknown_and_contrib_operators_are_refused_by_name(sources, tmp_path):
    extended = optimize(sources["bert_like"], tmp_path / "extended.onnx", "extended")
    with pytest.raises(NotImplementedError, match="com.microsoft:FusedMatMul.*--optimize basic"):
        TorchEngine(extended.SerializeToString(), [], CpuDevice())
    graph = model("Det", [np.eye(3, dtype=np.float32)])
    with pytest.raises(NotImplementedError, match="operator.*Det"):
        TorchEngine(graph.SerializeToString(), ["y0"], CpuDevice())


def test_a_model_sliced_for_torch_serves_as_the_source(sources, tmp_path):
    """--target torch --device cpu: standard ONNX stages (basic optimisation), engine torch, a CPU
    instance; the chained stages, the stages fused back into one graph and the pipeline's choice
    all work from that manifest."""
    out = tmp_path / "bert_torch"
    result = slice_model(sources["bert_like"], out, replace(FAST, stages=3, target="torch", device="cpu"))
    manifest = Manifest.load(out / VERSION)
    assert {s.engine for s in manifest.stages} == {"torch"}
    assert manifest.slicing.optimization == "basic" and manifest.slicing.device == "cpu"
    assert result.max_abs_error <= TOLERANCE
    assert "kind: KIND_CPU" in (out / "config.pbtxt").read_text()
    for path in (out / VERSION).glob("*.onnx"):
        assert {n.domain for n in onnx.load(str(path)).graph.node} <= {""}
    feed = sample_inputs(manifest.inputs, 3, {"sequence": 17}, seed=4)
    want = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs]).run(feed)
    chained = run_stages(load_engines(manifest, out / VERSION), manifest.stages, feed)
    [fused] = load_engines(manifest, out / VERSION, fused=True)
    for got in (chained, fused.run(feed)):
        for name, expected in want.items():
            np.testing.assert_allclose(got[name], expected, atol=TOLERANCE, rtol=0)
    # On a CPU instance torch stages share the cores: auto decides as for ONNX Runtime stages.
    as_ort = replace(manifest, stages=tuple(replace(s, engine="onnxruntime") for s in manifest.stages))
    assert on_host_cores(manifest, CpuDevice()) and choose(manifest, True, True) == choose(as_ort, True, True)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU"))])
def test_torch_stages_sliced_on_another_machine_are_retimed_here(sources, tmp_path, device):
    """``slicer.retime`` on torch stages (on a GPU, replayed as CUDA graphs, as they serve): the
    tables at the same batch sizes and lengths, measured on this machine, which the manifest
    then names, and the stages as they were."""
    from slicer.retime import retime

    out = tmp_path / "bert_torch"
    slice_model(sources["bert_like"], out, replace(FAST, stages=2, target="torch", device=device))
    manifest = Manifest.load(out / VERSION)
    elsewhere = {"cpu": "another CPU", "cpus": 96, "gpu": "another GPU" if device == "cuda" else ""}
    replace(manifest, slicing=replace(manifest.slicing, machine=elsewhere)).save(out / VERSION)
    _, after = retime(out, warmup=1, repeats=3)
    here = machine(torch.cuda.get_device_name(0) if device == "cuda" else "")
    assert Machine(**after.slicing.machine) == here and not here.moved_from(Machine(**after.slicing.machine))
    for was, now in zip(manifest.stages, after.stages):
        assert (now.latency.batch_sizes, now.latency.lengths) == (was.latency.batch_sizes, was.latency.lengths)
        assert replace(now, latency=was.latency, preferred_batch_size=was.preferred_batch_size) == was


def test_nodes_are_timed_one_by_one(sources, tmp_path):
    from backend.engines.onnx_torch import TorchGraph, node_timer

    named = optimize(sources["resnet_like"], tmp_path / "named.onnx", "none")  # the slicer names every node
    graph = TorchGraph(named)
    times: dict[str, float] = {}
    timer = node_timer(graph.device, lambda node, ms: times.__setitem__(node, times.get(node, 0.0) + ms))
    graph.run(sample_inputs(input_specs(named), 2, {}, seed=0), timer=timer)
    timer.flush()
    assert set(times) == {n.name for n in named.graph.node}
    assert all(ms > 0 for ms in times.values())  # every node was timed


# CUDA graphs per shape bucket (backend/engines/torch_graphs.py): on the CPU the same buckets, padding and
# cutting run on static buffers; the capture itself is tested on a GPU (test_cuda.py).


def test_shape_graphs_pad_rows_to_a_bucket_and_answer_as_the_interpreter(sources, tmp_path, caplog):
    from backend.engines.onnx_torch import TorchGraph
    from backend.engines.torch_graphs import ShapeGraphs

    path = tmp_path / "bert.onnx"
    specs = input_specs(optimize(sources["bert_like"], path, "basic"))
    graph = TorchGraph(path)
    graphs = ShapeGraphs(graph, (1, 2, 4, 8), "bert")
    for rows in (3, 1, 8, 5):
        for length in (8, 16):
            feed = sample_inputs(specs, rows, {"sequence": length}, seed=rows + length)
            got, want = graphs.run(feed), graph.run(feed)
            for name, value in want.items():
                assert got[name].shape == value.shape
                np.testing.assert_allclose(got[name].numpy(), value.numpy(), atol=1e-5, rtol=0)
    assert graphs.graphs == 6 and graphs.bucket(3) == 4 and graphs.bucket(9) is None  # rows 4, 1, 8 x 2 lengths
    graphs.capturing = False
    with caplog.at_level("WARNING"):
        for _ in range(2):
            graphs.run(sample_inputs(specs, 2, {"sequence": 12}, seed=0))  # a shape no bucket holds
    assert graphs.graphs == 6 and sum("runs eagerly" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_run_repeated_on_its_shapes_copies_nothing_to_the_device_and_reads_nothing_back(sources, tmp_path,
                                                                                         precision):
    """What a CUDA graph's capture needs, checked without a GPU: on torch's meta device (shapes
    only: reading a value on the host fails there), the first run copies the host values its
    device nodes need once, and a second run on the same shapes copies nothing."""
    from backend.engines.onnx_torch import TorchGraph

    for name, src in sources.items():
        path = tmp_path / f"{name}.onnx"
        specs = input_specs(optimize(src, path, "basic"))
        graph = TorchGraph(path, "meta", precision)
        copies: list[tuple] = []
        copy = graph._copy
        graph._copy = lambda value, non_blocking=False: copies.append(tuple(value.shape)) or copy(value, non_blocking)
        feed = {k: torch.from_numpy(v).to("meta") for k, v in sample_inputs(specs, 3, {"sequence": 16}).items()}
        first = graph.run(feed)
        before = len(copies)
        second = graph.run(feed)
        assert len(copies) == before, f"{name}: the second run copied {copies[before:]}"
        assert {k: (v.shape, v.dtype) for k, v in first.items()} == {k: (v.shape, v.dtype) for k, v in second.items()}
        assert all(v.dtype == torch.float32 for v in second.values()), "outputs in the graph's declared type"


def test_fp16_stages_agree_with_the_fp32_source_and_a_stricter_cosine_refuses(sources, tmp_path):
    for name in ("bert_like", "resnet_like"):
        result = slice_model(sources[name], tmp_path / name, replace(FAST, stages=2, target="torch", device="cpu",
                                                                    precision="fp16"))
        assert result.cosine >= 0.9999 and result.max_abs_error > 1e-6, (name, result.cosine)
        assert {s.precision for s in Manifest.load(tmp_path / name / VERSION).stages} == {"fp16"}
    with pytest.raises(SliceError, match="fp16 stages agree .* cosine similarity of 0.99.*--min-cosine 1"):
        slice_model(sources["bert_like"], tmp_path / "strict", replace(FAST, stages=2, target="torch", device="cpu",
                                                                      precision="fp16", min_cosine=1.0))
    assert not (tmp_path / "strict").exists()
    with pytest.raises(SliceError, match="onnxruntime target runs FP32 only"):
        slice_model(sources["bert_like"], tmp_path / "ort", replace(FAST, stages=2, precision="fp16"))


@pytest.mark.parametrize("mode", ["pipeline", "fused"])
def test_a_model_served_with_shape_graphs_answers_every_length_as_the_source(sources, tmp_path, mode):
    """cuda_graphs true on a CPU instance: the pipeline (policy pass) and the fused model run each
    batch at a bucket of rows and of length (the profiled ones, 8 and 64), padded there and cut
    back to each query's own length."""
    from backend.config import RuntimeConfig
    from backend.engines import graph_buckets
    from backend.metrics import Metrics
    from backend.padding import Buckets
    from backend.query import Query
    from backend.serving import Mode, serve
    from backend.whole import WholeBatch

    out = tmp_path / "bert_torch"
    slice_model(sources["bert_like"], out, replace(FAST, stages=2, target="torch", device="cpu"))
    manifest = Manifest.load(out / VERSION)
    feeds = [sample_inputs(manifest.inputs, 1 + i % 3, {"sequence": 5 + 7 * i}, seed=i) for i in range(9)]
    for feed in feeds:  # as in real text: a row whose every token is masked changes with its padding
        feed["attention_mask"][:, 0] = 1
    replies: dict[int, tuple] = {}
    if mode == "pipeline":
        config = RuntimeConfig.from_parameters({"cuda_graphs": "true", "policy": "pass"})
        decision, server = serve(manifest, out / VERSION, config, CpuDevice(), Metrics())
        assert decision.mode is Mode.PIPELINE
        assert decision.graphs.count("8 graphs") == 2  # rows 1, 2, 4, 8 x lengths 8, 64, each stage
        done = threading.Condition()

        def query(i: int) -> Query:
            def respond(outputs, failure):
                with done:
                    replies[i] = outputs, failure
                    done.notify_all()
            return Query(feeds[i], respond)
        server.submit([query(i) for i in range(len(feeds))])
        with done:
            assert done.wait_for(lambda: len(replies) == len(feeds), timeout=60)
        server.close()
    else:
        engines = load_engines(manifest, out / VERSION, fused=True, graphs=True)
        assert engines[0].graphs.graphs == 8 and not engines[0].graphs.capturing
        whole = WholeBatch(manifest.fused(), engines, CpuDevice(), Metrics(),
                           buckets=Buckets({"sequence": graph_buckets(manifest)[1]}))
        queries = [Query(feed, None) for feed in feeds]
        whole.run(queries)
        replies = {i: q.reply for i, q in enumerate(queries)}
        assert engines[0].graphs.graphs == 8, "every batch ran in a captured bucket"
    reference = OnnxRuntimeEngine(sources["bert_like"], [o.name for o in manifest.outputs])
    for i, (outputs, failure) in replies.items():
        assert failure is None, failure
        for name, expected in reference.run(feeds[i]).items():
            assert outputs[name].shape == expected.shape
            np.testing.assert_allclose(outputs[name], expected, atol=TOLERANCE, rtol=0)


def test_buckets_pad_lengths_up_and_padded_tables_predict_the_bucket():
    from backend.manifest import LatencyTable
    from backend.padding import Buckets

    buckets = Buckets({"sequence": (16, 64)})
    assert buckets.pad({"sequence": 5}) == {"sequence": 16} and buckets.pad({"sequence": 64}) == {"sequence": 64}
    assert buckets.pad({"sequence": 70}) == {"sequence": 70}, "past every bucket: as it is"
    sizes = {"sequence": 5}
    assert Buckets().pad(sizes) is sizes
    table = LatencyTable((1, 4), ((1.0, 2.0), (3.0, 6.0)), axis="sequence", lengths=(16, 64))
    assert table.predict(4, 40) == 4.0 and replace(table, padded=True).predict(4, 40) == 6.0
    assert replace(table, padded=True).predict(4, 16) == 2.0


def gelu_graph(with_output: bool) -> onnx.ModelProto:
    """x @ W + b, then the exact GELU spelt out as exporters write it; with ``with_output`` the
    GEMM's product is also an output of the graph (a stage boundary inside the pattern)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(2 ** 0.5, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    steps = [("MatMul", ["x", "W"], "mm"), ("Add", ["b", "mm"], "h"), ("Div", ["h", "sqrt2"], "d"), ("Erf", ["d"], "e"),
             ("Add", ["e", "one"], "a"), ("Mul", ["h", "a"], "m"), ("Mul", ["m", "half"], "y")]
    nodes = [helper.make_node(kind, ins, [out], name=f"{kind}_{out}") for kind, ins, out in steps]
    outputs = [onnx.ValueInfoProto(name="y"), *([onnx.ValueInfoProto(name="mm")] if with_output else [])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("with_output", [False, True])
def test_an_exported_linear_layer_and_gelu_run_as_one_operator_each_unless_a_boundary_cuts_them(with_output):
    from backend.engines.onnx_torch import TorchGraph

    model = gelu_graph(with_output)
    graph = TorchGraph(model)
    kinds = [kind for _, kind, *_ in graph._nodes]
    assert kinds == (["MatMul", "Add", "_Gelu"] if with_output else ["_Linear", "_Gelu"])
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    names = [o.name for o in model.graph.output]
    want = OnnxRuntimeEngine(model.SerializeToString(), names).run({"x": x})
    got = graph.run({"x": x})
    for name in names:
        np.testing.assert_allclose(got[name].numpy(), want[name], atol=1e-5, rtol=0)


def test_a_bert_graph_runs_its_linear_layers_and_attention_fused_and_every_node_is_still_timed(sources, tmp_path):
    """bert_like as the torch target cuts it: every linear layer a GEMM with its bias, every
    attention one fused kernel, the same outputs as ONNX Runtime (whole-model test above); the
    node timer shares a fused operator's time among the nodes it stands for, so the slicer's
    node profile still covers every node."""
    from backend.engines.onnx_torch import TorchGraph, node_timer

    named = optimize(sources["bert_like"], tmp_path / "bert.onnx", "basic")
    graph = TorchGraph(named)
    fused = [kind for _, kind, *_ in graph._nodes if kind.startswith("_")]
    assert fused.count("_Attention") == 2 and fused.count("_Linear") >= 8
    times: dict[str, float] = {}
    timer = node_timer(graph.device, lambda node, ms: times.__setitem__(node, times.get(node, 0.0) + ms))
    feed = sample_inputs(input_specs(named), 2, {"sequence": 8}, seed=0)
    graph.run(feed, timer=timer)
    timer.flush()
    assert set(times) == {n.name for n in named.graph.node}
