"""The slicer's misuse table (issue 39): every bad input a user can give exits 2 with one line
that names the input and the fix, for each target the machine runs, and leaves ``--out`` as it
was (new: not created; a model the slicer wrote before: byte for byte the same)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from slicer.__main__ import main as slicer_main
from tools.lib import synthetic

OPSETS = [helper.make_opsetid("", 17)]
FAST = ["--node-repeats", "2", "--warmup", "0", "--stage-repeats", "2", "--calibration-rounds", "0",
        "--max-batch-size", "2"]
TARGETS = [["--target", "onnxruntime"], ["--target", "torch", "--device", "cpu"]]


def _save(path: Path, nodes, inputs, outputs, initializers=(), opsets=OPSETS) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), str(path))
    return path


def _x(name: str = "x", dtype=TensorProto.FLOAT, shape=("batch", 4)):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def mlp(path: Path, extra_nodes=(), extra_outputs=(), initializers=()) -> Path:
    """x [batch, 4] -> Relu -> Neg -> Relu -> y: three legal cuts, and room for an odd output."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu1"), helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("Relu", ["b"], ["y"], name="relu2"), *extra_nodes]
    return _save(path, nodes, [_x()], [_x("y"), *extra_outputs], initializers)


def positions(path: Path, table: int = 64) -> Path:
    """ids [batch, sequence] int64 -> a position table of ``table`` rows added by position (BERT's
    learned positions): any length past ``table`` fails inside the graph."""
    rng = np.random.default_rng(0)
    words = helper.make_tensor("words", TensorProto.FLOAT, [100, 8], rng.standard_normal(800).astype(np.float32))
    places = helper.make_tensor("places", TensorProto.FLOAT, [table, 8],
                                rng.standard_normal(table * 8).astype(np.float32))
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    step = helper.make_tensor("step", TensorProto.INT64, [], [1])
    nodes = [helper.make_node("Shape", ["ids"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "one"], ["length"], name="length", axis=0),
             helper.make_node("Squeeze", ["length"], ["n"], name="n"),
             helper.make_node("Range", ["zero", "n", "step"], ["at"], name="range"),
             helper.make_node("Gather", ["places", "at"], ["p"], name="position_lookup", axis=0),
             helper.make_node("Gather", ["words", "ids"], ["w"], name="word_lookup", axis=0),
             helper.make_node("Add", ["w", "p"], ["h"], name="add"),
             helper.make_node("Relu", ["h"], ["y"], name="relu")]
    return _save(path, nodes, [_x("ids", TensorProto.INT64, ("batch", "sequence"))],
                 [_x("y", TensorProto.FLOAT, ("batch", "sequence", 8))], [words, places, one, zero, step])


def _truncated(tmp: Path) -> Path:
    whole = mlp(tmp / "whole.onnx").read_bytes()
    (tmp / "truncated.onnx").write_bytes(whole[: len(whole) // 2])
    return tmp / "truncated.onnx"


def _text(tmp: Path) -> Path:
    (tmp / "notes.onnx").write_text("this is not a model\n")
    return tmp / "notes.onnx"


def _empty(tmp: Path) -> Path:
    (tmp / "empty.onnx").write_bytes(b"")
    return tmp / "empty.onnx"


def _no_graph(tmp: Path) -> Path:
    onnx.save(helper.make_model(helper.make_graph([], "g", [], []), opset_imports=OPSETS, ir_version=8),
              str(tmp / "nograph.onnx"))
    return tmp / "nograph.onnx"


def _custom_op(tmp: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Frobnicate", ["a"], ["y"], name="frob", domain="com.example")]
    return _save(tmp / "custom.onnx", nodes, [_x()], [_x("y")],
                 opsets=[*OPSETS, helper.make_opsetid("com.example", 1)])


def _unknown_op(tmp: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"), helper.make_node("Blur", ["a"], ["y"], name="blur")]
    return _save(tmp / "unknown.onnx", nodes, [_x()], [_x("y")])


def _unbatched_output(tmp: Path) -> Path:
    """A second output summed over the batch: one value per model call, not per query."""
    total = helper.make_node("ReduceSum", ["y", "axes"], ["total"], name="sum_over_batch", keepdims=0)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    return mlp(tmp / "unbatched.onnx", [total], [_x("total", shape=(4,))], [axes])


def _constant_output(tmp: Path) -> Path:
    """A second output that is a constant of the graph, the same whatever the inputs."""
    const = helper.make_node("Constant", [], ["scale"], name="scale",
                             value=helper.make_tensor("v", TensorProto.FLOAT, [1, 4], [1, 2, 3, 4]))
    return mlp(tmp / "constant.onnx", [const], [_x("scale", shape=(1, 4))])


def _string_output(tmp: Path) -> Path:
    cast = helper.make_node("Cast", ["y"], ["label"], name="to_text", to=TensorProto.STRING)
    return mlp(tmp / "strings.onnx", [cast], [_x("label", TensorProto.STRING)])


def _acos(tmp: Path) -> Path:
    """A standard operator ONNX Runtime runs and the torch engine does not."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"], name="squash"),
             helper.make_node("Acos", ["a"], ["y"], name="acos")]
    return _save(tmp / "acos.onnx", nodes, [_x()], [_x("y")])


def _string_input(tmp: Path) -> Path:
    nodes = [helper.make_node("Cast", ["x"], ["a"], name="parse", to=TensorProto.FLOAT),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return _save(tmp / "text_in.onnx", nodes, [_x("x", TensorProto.STRING)], [_x("y")])


def _mlp(tmp: Path) -> Path:
    return mlp(tmp / "mlp.onnx")


def _positions(tmp: Path) -> Path:
    return positions(tmp / "positions.onnx")


def _unmasked(tmp: Path) -> Path:
    return synthetic.save(synthetic.unmasked_mean(), tmp / "unmasked.onnx")


def _directory(tmp: Path) -> Path:
    (tmp / "folder.onnx").mkdir()
    return tmp / "folder.onnx"


# name: (source, options beyond FAST and the target, what the one line must say)
CASES: dict[str, tuple[Callable[[Path], Path], list[str], list[str]]] = {
    "missing file": (lambda tmp: tmp / "nowhere.onnx", [], ["nowhere.onnx does not exist"]),
    "a folder": (_directory, [], ["folder.onnx is not a file"]),
    "truncated file": (_truncated, [], ["truncated.onnx is not a readable ONNX model"]),
    "text file": (_text, [], ["notes.onnx is not a readable ONNX model"]),
    "empty file": (_empty, [], ["empty.onnx holds no ONNX graph"]),
    "no graph": (_no_graph, [], ["nograph.onnx holds no ONNX graph"]),
    "custom operator": (_custom_op, [], ["custom.onnx", "Frobnicate"]),
    "unknown operator": (_unknown_op, [], ["unknown.onnx", "Blur"]),
    "output without a batch axis": (_unbatched_output, [], ["unbatched.onnx", "'total'", "batch axis"]),
    "constant output": (_constant_output, [], ["constant.onnx", "'scale'"]),
    "string output": (_string_output, [], ["strings.onnx", "'label'", "string"]),
    "string input": (_string_input, [], ["text_in.onnx", "'x'", "string"]),
    "lengths past the model's": (_positions, ["--lengths", "16,64,128"],
                                 ["positions.onnx", "--lengths", "at most 64"]),
    "max batch size 0": (_mlp, ["--max-batch-size", "0"], ["--max-batch-size must be at least 1"]),
    "too many stages": (_mlp, ["--stages", "9"], ["mlp.onnx", "at most 3 stages"]),
    "lengths out of order": (_positions, ["--lengths", "64,16"], ["--lengths must be increasing"]),
    "unknown length axis": (_positions, ["--length-axis", "tokens"], ["--length-axis 'tokens'"]),
    "a length axis that padding changes": (_unmasked, ["--length-axis", "sequence"],
                                           ["--length-axis sequence", "'pooled'", "--length-axis none"]),
    "bad --target": (_mlp, ["--target", "tflite"], ["--target", "tflite", "onnxruntime"]),
    "bad --device": (_mlp, ["--device", "tpu"], ["--device", "tpu", "cpu"]),
    "bad --stages": (_mlp, ["--stages", "two"], ["--stages", "two"]),
}


def _run(tmp_path: Path, capsys, build: Callable[[Path], Path], options: list[str], target: list[str],
         out: Path) -> tuple[str, Path]:
    """The one line the slicer printed (asserted to be one, after exit status 2), and the source."""
    src = build(tmp_path)
    argv = [str(src), "--stages", "2", "--out", str(out), *FAST, *target, *options]
    try:
        code = slicer_main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).strip()
    assert code == 2, f"exit {code}: {printed}"
    assert len(printed.splitlines()) == 1 and printed.startswith("error:"), printed
    return printed, src


@pytest.mark.parametrize("target", TARGETS, ids=["onnxruntime", "torch"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_misuse_is_one_line_exit_2_and_out_is_not_created(tmp_path, capsys, case, target):
    out = tmp_path / "out"
    build, options, expected_texts = CASES[case]
    printed, src = _run(tmp_path, capsys, build, options, target, out)
    for expected in expected_texts:
        assert expected in printed, printed
    assert "/tmp" not in printed.replace(str(src), ""), "a scratch path in the message: " + printed
    assert not out.exists()


# What only one target refuses: (target, source, options, what the one line must say).
ONE_TARGET = {
    "an operator the torch engine lacks": (TARGETS[1], _acos, [], ["--target torch", "Acos", "--target onnxruntime"]),
    "a GPU that is not there": (["--target", "torch", "--device", "cuda"], _mlp, [], ["--device cuda"]),
}


@pytest.mark.parametrize("case", list(ONE_TARGET))
def test_what_one_target_refuses_is_one_line_exit_2(tmp_path, capsys, case):
    target, build, options, expected = ONE_TARGET[case]
    if "cuda" in target:
        torch = pytest.importorskip("torch")
        if torch.cuda.is_available():
            pytest.skip("a GPU is there")
    printed, _ = _run(tmp_path, capsys, build, options, target, tmp_path / "out")
    assert all(text in printed for text in expected), printed
    assert not (tmp_path / "out").exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", ["string output", "lengths past the model's", "custom operator", "max batch size 0"])
def test_a_misuse_leaves_an_existing_model_as_it_was(tmp_path, capsys, case):
    out = tmp_path / "served"
    assert slicer_main([str(mlp(tmp_path / "good.onnx")), "--stages", "2", "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    before = _tree(out)
    build, options, _ = CASES[case]
    _run(tmp_path, capsys, build, options, TARGETS[0], out)
    assert _tree(out) == before
    assert {p.name for p in out.iterdir()} == {"config.pbtxt", "1"}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no scratch left beside it

