"""The slicer's stages, chained on ONNX Runtime, equal the unsliced model."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from backend.manifest import Manifest
from slicer.__main__ import main as slicer_main
from slicer.graph import SliceError, analyse, choose_even_cuts
from slicer.slicing import VERSION, sha256, slice_model, verify

MAX_BATCH = 8


@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("name", ["resnet_like", "unet_like", "bert_like"])
def test_chained_stages_equal_unsliced_model(sources, tmp_path, name, stages):
    out = tmp_path / name
    result = slice_model(sources[name], out, stages, MAX_BATCH)
    assert len(result.manifest.stages) == stages
    for sequence in (5, 17):  # the BERT-like model has a dynamic sequence axis
        error = verify(sources[name], out / VERSION, result.manifest, [1, 3, MAX_BATCH], {"sequence": sequence},
                       seed=sequence)
        assert error <= 1e-5


def test_cuts_carry_several_tensors_and_skips(sources, tmp_path):
    """U-Net: the long skip crosses a stage it is not used in; BERT: the mask crosses every cut."""
    unet = slice_model(sources["unet_like"], tmp_path / "unet", 3, MAX_BATCH).manifest
    assert any(len(s.outputs) + len(s.carry) > 1 for s in unet.stages[:-1])
    assert any(s.carry for s in unet.stages), "a long skip should be carried through a middle stage"
    bert = slice_model(sources["bert_like"], tmp_path / "bert", 4, MAX_BATCH).manifest
    for stage in bert.stages[1:]:
        names = {t.name for t in stage.inputs}
        assert len(names) >= 2, f"stage {stage.index} should receive hidden states and the mask"


def test_only_batched_tensors_cross_cuts(sources):
    """Shape and position tensors of the BERT-like model never cross a cut."""
    analysis = analyse(onnx.load(str(sources["bert_like"])))
    legal = analysis.legal_cuts()
    assert legal, "the encoder must have legal cuts"
    illegal = [k for k in range(1, len(analysis.nodes)) if k not in legal]
    assert illegal, "cuts between Shape/Range and their users must be illegal"
    for cut in illegal:
        assert any(not analysis.facts[t].batched for t in analysis.crossing(cut))
    for cut in legal:
        for name in analysis.crossing(cut):
            assert analysis.facts[name].batched


def test_model_directory_layout(sources, tmp_path):
    out = tmp_path / "my_model"
    result = slice_model(sources["bert_like"], out, 3, max_batch_size=4)
    config = (out / "config.pbtxt").read_text()
    assert 'name: "my_model"' in config and 'backend: "dvabatch"' in config
    assert "max_batch_size: 4" in config and "dynamic_batching" in config
    assert '{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }' in config
    assert '{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 32 ] }' in config
    manifest = Manifest.load(out / VERSION)
    assert manifest == result.manifest
    assert manifest.source_file == "bert_like.onnx" and manifest.source_sha256 == sha256(sources["bert_like"])
    assert [s.file for s in manifest.stages] == [f"stage_{i}.onnx" for i in range(3)]
    assert manifest.inputs[0].dims == ("sequence",)
    for previous, stage in zip(manifest.stages, manifest.stages[1:]):
        handed_over = {t.name for t in previous.outputs} | set(previous.carry)
        assert {t.name for t in stage.inputs} | set(stage.carry) <= handed_over


def test_cli_writes_model_and_reports(sources, tmp_path, capsys):
    assert slicer_main([str(sources["resnet_like"]), "--stages", "2", "--out", str(tmp_path / "r")]) == 0
    assert "max abs error" in capsys.readouterr().out
    assert (tmp_path / "r" / VERSION / "stage_1.onnx").is_file()


def test_rejects_fixed_batch_axis(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    src = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    with pytest.raises(SliceError, match="no dynamic batch axis"):
        slice_model(src, tmp_path / "out", 1)


def test_rejects_more_stages_than_legal_cuts(sources, tmp_path):
    with pytest.raises(SliceError, match="stages"):
        slice_model(sources["resnet_like"], tmp_path / "r", 500)


def test_even_cuts_pick_nearest_legal_positions():
    assert choose_even_cuts(list(range(1, 12)), 12, 3) == [4, 8]
    assert choose_even_cuts([1, 2, 9, 10], 12, 3) == [2, 9]
    assert choose_even_cuts([5, 6], 12, 3) == [5, 6]
    assert choose_even_cuts([], 12, 1) == []
    with pytest.raises(SliceError):
        choose_even_cuts([5], 12, 3)


def test_refused_slice_leaves_existing_model_untouched(sources, tmp_path):
    out = tmp_path / "r"
    slice_model(sources["resnet_like"], out, 2, MAX_BATCH)
    before = {p.name: p.read_bytes() for p in (out / VERSION).iterdir()}
    with pytest.raises(SliceError, match="not written"):
        slice_model(sources["resnet_like"], out, 3, MAX_BATCH, tolerance=-1.0)
    assert {p.name: p.read_bytes() for p in (out / VERSION).iterdir()} == before
    assert {p.name for p in out.iterdir()} == {"config.pbtxt", VERSION}  # no scratch folder left
