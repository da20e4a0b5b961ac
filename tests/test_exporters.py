"""Models as today's exporters write them slice for the torch engine: a BERT and a GPT-2 exported
with torch.export (``torch.onnx.export(..., dynamo=True)``, torch's default exporter), whose graphs
hold operators the TorchScript exporter never wrote (GatherND, Gelu at opset 20, ...). Small random
configurations: what matters is the operators, and that the stages equal the source."""

from __future__ import annotations

from dataclasses import replace

import onnx
import pytest

from slicer.slicing import slice_model

from .conftest import FAST

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxscript")  # torch.export's ONNX exporter writes through it

OPTIONS = replace(FAST, stages=2, target="torch", device="cpu", lengths=(8, 32), calibration_rounds=0)


def export_gpt2(out) -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    config._attn_implementation = "eager"
    gpt = transformers.GPT2Model(config).eval()

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = gpt

        def forward(self, input_ids, attention_mask):
            return self.gpt(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    example = torch.randint(0, 1000, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    dims = {0: torch.export.Dim("batch", min=1, max=1024), 1: torch.export.Dim("sequence", min=2, max=128)}
    with torch.no_grad():
        torch.onnx.export(Decoder(), example, str(out), input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamic_shapes=(dims, dims), dynamo=True)


def export_bert(out) -> None:
    from tools.lib.real_models import export_bert

    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
    export_bert(config, None, out, dynamo=True)


@pytest.mark.parametrize("export", [export_bert, export_gpt2], ids=["bert", "gpt2"])
def test_a_model_exported_with_torch_export_slices_for_the_torch_engine(export, tmp_path):
    torch.manual_seed(0)
    source = tmp_path / "model.onnx"
    export(source)
    kinds = {node.op_type for node in onnx.load(str(source), load_external_data=False).graph.node}
    assert "GatherND" in kinds, "what the TorchScript exporter never wrote (update the docstring if it changed)"
    result = slice_model(source, tmp_path / "sliced", OPTIONS)
    assert len(result.manifest.stages) == 2 and result.max_abs_error <= OPTIONS.tolerance
