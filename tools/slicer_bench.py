"""python -m tools.slicer_bench: which models the slicer can cut, and how evenly (not a test).

    python -m tools.slicer_bench [--models bert,gpt2,cnn,unet,minilm,resnet50,vgg16] [--stages 2,4,6]
                                 [--out results/slicer_bench.json]

Exports each model family with both of torch's ONNX exporters (``torch.export``, torch 2.13's
default, and the legacy TorchScript one), or takes the ONNX file a package ships, then reports
per source: its nodes, the legal cuts the slicer had before shape subgraphs were recomputed in
each stage and the legal cuts it has now, the tensors still blocking cuts; and per stage count:
the balance (slowest stage over the mean stage) of the profile's cut and of the calibrated cut,
both timed as served the same way (the calibration's rounds), how much faster the calibrated
slowest stage is, the slicing time and the largest difference from the source.
``bert``, ``gpt2``, ``cnn`` and ``unet`` are small models with random weights (BERT and GPT-2
from transformers' configs); ``minilm``, ``resnet50`` and ``vgg16`` are the real ones of
``tools.models``. Needs the ``models`` extra (torch 2.13.0 CPU, transformers).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from slicer.errors import SliceError
from slicer.graph import tensor_uses, analyse
from slicer.slicing import SliceOptions, slice_model
from slicer.targets import optimize
from tools.lib.cli import names, numbers, table_console
from tools.lib.paths import CACHE
from tools.lib.real_models import BY_NAME, export_minilm, unpacked

EXPORTS = CACHE / "exports"
FAMILIES = ("bert", "gpt2", "cnn", "unet", "minilm", "resnet50", "vgg16")
TEXT = ("bert", "gpt2", "minilm")


def _torch_models() -> dict[str, tuple[Callable, tuple, list[str]]]:
    """family -> (module factory, example inputs, input names)."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            config = BertConfig(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512,
                                vocab_size=1000)
            config._attn_implementation = "eager"
            self.bert = BertModel(config, add_pooling_layer=False)

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            config = GPT2Config(n_embd=128, n_layer=4, n_head=2, vocab_size=1000)
            config._attn_implementation = "eager"
            self.gpt2 = GPT2Model(config)

        def forward(self, input_ids, attention_mask):
            return self.gpt2(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    def block(channels: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(),
                             nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels))

    class Cnn(nn.Module):  # residual blocks, as in a ResNet
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 32, 3, padding=1)
            self.blocks = nn.ModuleList(block(32) for _ in range(6))
            self.head = nn.Linear(32, 10)

        def forward(self, image):
            x = self.stem(image)
            for b in self.blocks:
                x = torch.relu(x + b(x))
            return self.head(x.mean(dim=(2, 3)))

    class Unet(nn.Module):  # an encoder, a decoder and the skips between them
        def __init__(self):
            super().__init__()
            self.down = nn.ModuleList(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1) for c in (8, 16, 32))
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.up = nn.ModuleList(nn.ConvTranspose2d(2 * c, c, 2, stride=2) for c in (32, 16, 8))
            self.out = nn.Conv2d(8, 2, 1)

        def forward(self, image):
            x, skips = torch.relu(self.stem(image)), []
            for down in self.down:
                skips.append(x)
                x = torch.relu(down(x))
            for up, skip in zip(self.up, reversed(skips)):
                x = torch.relu(up(x) + skip)
            return self.out(x)

    ids = torch.randint(0, 1000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    image = torch.rand(2, 3, 64, 64)
    return {"bert": (Bert, (ids, mask), ["input_ids", "attention_mask"]),
            "gpt2": (Gpt2, (ids, mask), ["input_ids", "attention_mask"]),
            "cnn": (Cnn, (image,), ["image"]), "unet": (Unet, (image,), ["image"])}


def export(family: str, dynamo: bool) -> Path:
    """The family's source ONNX file for one exporter (cached)."""
    import torch

    out = EXPORTS / f"{family}-{'torch.export' if dynamo else 'legacy'}.onnx"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if family == "minilm":
        export_minilm(unpacked(BY_NAME["minilm"].package), out, dynamo)
        return out
    factory, example, names = _torch_models()[family]
    axes = {0: "batch", 1: "sequence"} if family in TEXT else {0: "batch"}
    with torch.no_grad():
        if dynamo:
            dims = {i: torch.export.Dim(name, min=2 if i else 1, max=512) for i, name in axes.items()}
            torch.onnx.export(factory().eval(), example, str(out), input_names=names, output_names=["y"],
                              dynamic_shapes=tuple(dims for _ in names), dynamo=True)
        else:
            torch.onnx.export(factory().eval(), example, str(out), input_names=names, output_names=["y"],
                              dynamic_axes={**{n: axes for n in names}, "y": {0: "batch"}}, opset_version=17,
                              dynamo=False)
    return out


def sources(families: list[str]) -> list[tuple[str, str, Path | str]]:
    """(family, exporter, source file or why there is none)."""
    found = []
    for family in families:
        if family in ("resnet50", "vgg16"):
            model = BY_NAME[family]
            if not model.source.is_file():
                model.source.parent.mkdir(parents=True, exist_ok=True)
                model.build(unpacked(model.package), model.source)
            found.append((family, "as shipped", model.source))
            continue
        for dynamo in (True, False):
            exporter = "torch.export" if dynamo else "legacy"
            try:
                found.append((family, exporter, export(family, dynamo)))
            except Exception as exc:  # noqa: BLE001 - an exporter that cannot export is a result too
                found.append((family, exporter, f"export failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"))
    return found


def legal_cuts(source: Path, scratch: Path) -> tuple[int, int, int, list[str]]:
    """(nodes, legal cuts when shape values had to cross cuts, legal cuts now, blocking tensors)."""
    analysis = analyse(optimize(source, scratch, "extended"))
    every = sorted([*analysis.nodes, *{id(n): n for n in analysis.shapes.values()}.values()],
                   key=lambda node: analysis.rank[id(node)])
    skip = set(analysis.constants) | set(analysis.initializers)
    produced_at, last_use = tensor_uses(every, analysis.inputs, [o.name for o in analysis.outputs], skip, {})
    before = sum(all(analysis.facts[t].batched for t, p in produced_at.items() if p < k <= last_use.get(t, -1))
                 for k in range(1, len(every)))
    return len(every), before, len(analysis.legal_cuts()), list(analysis.blocking())[:3]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.slicer_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=names(FAMILIES), default=",".join(FAMILIES))
    parser.add_argument("--stages", type=numbers(int), default="2,4,6")
    parser.add_argument("--out", type=Path, default=Path("results/slicer_bench.json"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    console = table_console()
    rows: list[dict] = []
    work = CACHE / "slicer-bench"
    work.mkdir(parents=True, exist_ok=True)
    for family, exporter, source in sources(args.models):
        row = {"model": family, "exporter": exporter}
        rows.append(row)
        if isinstance(source, str):
            row["error"] = source
            console.print(f"{family} ({exporter}): {source}")
            continue
        row["nodes"], row["legal_before"], row["legal_after"], row["blocking"] = legal_cuts(
            source, work / "optimized.onnx")
        row["runs"] = []
        for stages in args.stages:
            options = SliceOptions(stages=stages, max_batch_size=8, lengths=(16, 64) if family in TEXT else (16,),
                                   warmup=2, node_repeats=5, stage_repeats=10, policy_defaults=False)
            began = time.perf_counter()
            try:
                result = slice_model(source, work / f"{family}-{exporter}-{stages}", options)
            except SliceError as exc:
                row["runs"].append({"stages": stages, "error": str(exc)})
                continue
            report = result.manifest.slicing
            rounds = report.calibration  # the profile's cut first, each timed as served the same way
            chosen = min(rounds, key=lambda r: r["measured_ms"]) if rounds else None
            row["runs"].append({
                "stages": stages, "seconds": round(time.perf_counter() - began, 1),
                "profile_cut_served": rounds[0]["measured_balance"] if rounds else None,
                "calibrated_served": chosen["measured_balance"] if chosen else None,
                "speedup": round(rounds[0]["measured_ms"] / chosen["measured_ms"], 3) if chosen else None,
                "tables": report.balance, "max_abs_error": result.max_abs_error, "warning": report.warning})
        console.print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    table = Table(title="What the slicer can cut (balance: slowest stage / mean stage, at batch 8)")
    for column in ("model", "exporter", "nodes", "legal cuts before -> now", "still blocking", "stages",
                   "profile's cut, served", "calibrated cut, served", "slowest stage gain", "slicing s", "max error"):
        table.add_column(column)
    for row in rows:
        if "error" in row:
            table.add_row(row["model"], row["exporter"], "-", row["error"][:60], "", "", "", "", "", "", "")
            continue
        for run in row["runs"]:
            first = run is row["runs"][0]
            table.add_row(row["model"] if first else "", row["exporter"] if first else "",
                          str(row["nodes"]) if first else "",
                          f"{row['legal_before']} -> {row['legal_after']}" if first else "",
                          ", ".join(row["blocking"]) if first else "", str(run["stages"]),
                          *((run["error"][:60], "", "", "", "") if "error" in run else
                            (f"{run['profile_cut_served'] or '-'}", f"{run['calibrated_served'] or '-'}",
                             f"{run['speedup'] or '-'}x", f"{run['seconds']:.0f}", f"{run['max_abs_error']:.1g}")))
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
