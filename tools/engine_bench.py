"""python -m tools.engine_bench: our torch stages on a GPU beside torch's own model (not a test).

    python -m tools.engine_bench MODEL_DIR [--reference bert_base|resnet50|none] [--rows 1,16,64]
                                 [--lengths 64,128] [--repeats 50] [--out DIR]

For a model sliced for torch on the GPU (``python -m slicer SRC --target torch --device cuda``,
any ``--precision``), it loads the stages as the backend serves them (a CUDA graph per shape
bucket, captured at load) and times, at each number of rows and each length (the model's length
axis; none for an image model), every stage alone, the stages one after another (what a batch
costs the pipeline's stages in all), the stages fused into one graph (what ``auto`` serves when it
steps aside) and, for comparison, the eager interpreter's run of the fused graph. Beside them, the
same model as its authors' library runs it, in FP16 and replayed as a CUDA graph: the fastest
plain torch a Triton user would write by hand (``bert_base``: transformers' ``BertModel`` with
its default attention, ``BertConfig()``; ``resnet50``: torchvision's). Every time is the median
wall time of ``--repeats`` calls on one stream, each waited for, inputs already on the GPU.

Prints one table and, with ``--out``, writes engine.md and engine.json there. The target (stages
summed within 1.3x torch's own FP16 graph) is a column. Without a GPU it runs on the CPU, for
trying it out: the stages' buckets on static buffers, torch's model in FP32 and eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from tools.lib.cli import numbers

TARGET = 1.3  # our stages summed, against torch's own FP16 graph of the whole model


def timed(call: Callable[[], object], repeats: int, synchronize: Callable[[], None]) -> float:
    """Median wall milliseconds of ``call``, each waited for, after three untimed calls."""
    for _ in range(3):
        call()
        synchronize()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        synchronize()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def reference(name: str, device):
    """torch's own model ``name`` on ``device`` (FP16 on a GPU) and its inputs at (rows, length)."""
    import torch

    torch.manual_seed(0)
    half = torch.half if device.type == "cuda" else torch.float32
    if name == "bert_base":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig(), add_pooling_layer=True).eval().to(device, half)

        def inputs(rows: int, length: int) -> tuple:
            ids = torch.randint(0, 30000, (rows, length), device=device)
            return ids, torch.ones_like(ids), torch.zeros_like(ids)
        return lambda ids, mask, types: model(input_ids=ids, attention_mask=mask, token_type_ids=types), inputs
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).eval().to(device, half)
        return model, lambda rows, length: (torch.rand(rows, 3, 224, 224, device=device, dtype=half),)
    raise ValueError(f"no reference model {name!r}: bert_base, resnet50 or none")


def graphed(forward: Callable, args: tuple) -> Callable[[], object]:
    """``forward(*args)`` captured as a CUDA graph (after a warm-up on a side stream, as torch's
    documentation does it): a call replays it. On the CPU, the call itself."""
    import torch

    if not torch.cuda.is_available():
        return lambda: forward(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            forward(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        forward(*args)
    return graph.replay


def bench(model_dir: Path, reference_name: str, rows: list[int], lengths: list[int], repeats: int) -> dict:
    import torch

    from backend.device import CpuDevice, CudaDevice
    from backend.engines import TorchEngine, describe_graphs, load_engines
    from backend.manifest import Manifest
    from backend.sample import sample_inputs

    version = model_dir / "1"
    manifest = Manifest.load(version)
    cuda = torch.cuda.is_available()
    device = CudaDevice() if cuda else CpuDevice()
    began = time.perf_counter()
    stages = load_engines(manifest, version, device, graphs=True)
    [fused] = load_engines(manifest, version, device, fused=True, graphs=True)
    loaded_s = time.perf_counter() - began
    [eager] = load_engines(manifest, version, device, fused=True)
    axis = manifest.length_axis
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    ref = reference(reference_name, torch.device("cuda" if cuda else "cpu")) if reference_name != "none" else None
    cells = []
    for length in (lengths if axis else [None]):
        for count in rows:
            if count > manifest.max_batch_size:
                continue
            feed = {k: device.from_host(v) for k, v in
                    sample_inputs(manifest.inputs, count, {axis: length} if axis else {}, seed=count).items()}
            cell = {"rows": count, "length": length, "stages": []}
            current = dict(feed)
            with torch.inference_mode():
                for engine, stage in zip(stages, manifest.stages):
                    inputs = {t.name: current[t.name] for t in stage.inputs}
                    cell["stages"].append(round(timed(lambda e=engine, i=inputs: e.run(i), repeats, sync), 4))
                    computed = engine.run(inputs)
                    current = {**{n: current[n] for n in stage.carry}, **computed}
                cell["fused"] = round(timed(lambda: fused.run(feed), repeats, sync), 4)
                cell["eager"] = round(timed(lambda: eager.run(feed), max(3, repeats // 10), sync), 4)
            cell["summed"] = round(sum(cell["stages"]), 4)
            if ref is not None:
                forward, make = ref
                args = make(count, length or 0)
                cell["torch_eager"] = round(timed(lambda: forward(*args), repeats, sync), 4)
                cell["torch_graph"] = round(timed(graphed(forward, args), repeats, sync), 4)
                cell["ratio"] = round(cell["summed"] / cell["torch_graph"], 3)
            cells.append(cell)
    graphs = [e for e in (*stages, fused) if isinstance(e, TorchEngine)]
    return {"model": model_dir.name, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
            "precision": manifest.stages[0].precision, "stages": len(manifest.stages),
            "nodes": [s.nodes for s in manifest.stages], "reference": reference_name, "repeats": repeats,
            "load_s": round(loaded_s, 1), "graphs": describe_graphs(graphs), "cells": cells}


def markdown(result: dict) -> str:
    with_ref = result["reference"] != "none"
    head = ["rows", "length", *[f"stage {i}" for i in range(result["stages"])], "stages summed", "fused graph",
            "fused, eager interpreter"]
    if with_ref:
        head += ["torch FP16, eager", "torch FP16, CUDA graph", f"summed / torch graph (target <= {TARGET})"]
        if result["device"] == "cpu":
            head[-3:] = ["torch FP32", "torch FP32 (no graphs on a CPU)", "summed / torch"]
    lines = [f"{result['model']} ({result['precision']}, {result['stages']} stages of {result['nodes']} nodes) on "
             f"{result['device']}, torch {result['torch']}: ms per batch, median of {result['repeats']} calls "
             f"(stages loaded and captured in {result['load_s']} s; {result['graphs']})", "",
             "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for cell in result["cells"]:
        row = [cell["rows"], cell["length"] or "-", *cell["stages"], cell["summed"], cell["fused"], cell["eager"]]
        if with_ref:
            ok = "ok" if cell["ratio"] <= TARGET else "MISSED"
            row += [cell["torch_eager"], cell["torch_graph"], f"{cell['ratio']} {ok}"]
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.engine_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--reference", default="none", choices=("bert_base", "resnet50", "none"))
    parser.add_argument("--rows", type=numbers(int), default="1,16,64")
    parser.add_argument("--lengths", type=numbers(int), default="64,128")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = bench(args.model_dir, args.reference, list(args.rows),
                   list(args.lengths), args.repeats)
    text = markdown(result)
    print(text, flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "engine.md").write_text(text)
        (args.out / "engine.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
