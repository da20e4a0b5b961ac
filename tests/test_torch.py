"""The torch engine on the CPU: its ONNX interpreter against ONNX Runtime, operator by operator
and on whole models, a model sliced for it, and its refusals. The CUDA path is in test_cuda.py."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from backend.device import CpuDevice
from backend.engine import OnnxRuntimeEngine, TorchEngine, load_engines, run_stages
from backend.manifest import Manifest
from backend.config import RuntimeConfig, make_policy
from backend.serving import decide
from slicer.graph import input_specs
from slicer.sample import sample_inputs
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
    auto = RuntimeConfig(policy=make_policy("auto", {}))
    assert decide(manifest, auto, cores=2, device=CpuDevice()) == decide(as_ort, auto, cores=2, device=CpuDevice())


def test_nodes_are_timed_one_by_one(sources, tmp_path):
    from backend.onnx_torch import TorchGraph, node_timer

    named = optimize(sources["resnet_like"], tmp_path / "named.onnx", "none")  # the slicer names every node
    graph = TorchGraph(named)
    times: dict[str, float] = {}
    timer = node_timer(graph.device, lambda node, ms: times.__setitem__(node, times.get(node, 0.0) + ms))
    graph.run(sample_inputs(input_specs(named), 2, {}, seed=0), timer=timer)
    timer.flush()
    assert set(times) == {n.name for n in named.graph.node}
    assert all(ms >= 0 for ms in times.values()) and sum(times.values()) > 0
