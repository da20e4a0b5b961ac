"""python -m tools.gpu_profile: time a BERT-family model's layers on a GPU, for tools.simulate.

    python -m tools.gpu_profile CONFIG.json --out-dir DIR [--stages 1,2,3] [--max-batch-size 64]
        [--lengths 16,32,64,128] [--fp16] [--repeats 20] [--name minilm_h100]

Where no TensorRT is installed to slice and profile the ONNX model for the GPU itself, this
gives the GPU's times another way: the model (a Hugging Face ``BertConfig``; random weights, which
time like trained ones) runs in torch on CUDA, and CUDA events around the embeddings, every
encoder layer and the pooler time each part per batch size and padded length (median of
``--repeats`` runs). For each stage count the layers are grouped into contiguous stages with the
most even times at the largest batch and length, and a profile JSON is written for
``python -m tools.simulate``: the stages' tables (sums of their parts) and the whole model's own
table. Without a GPU it times on the CPU with a wall clock (for trying it out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from backend.sample import batch_sizes_up_to
from tools.lib.cli import numbers
from tools.lib.timed import groups


def profile(config_path: Path, batch_sizes: list[int], lengths: list[int], fp16: bool, repeats: int):
    """(part names, times[length][batch][part] in ms, whole[length][batch] in ms, device name)."""
    import torch
    from transformers import BertConfig, BertModel

    config = BertConfig.from_json_file(str(config_path))
    config._attn_implementation = "eager"
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = BertModel(config, add_pooling_layer=True).eval().to(device)
    if fp16:
        model = model.half()
    parts = [("embeddings", model.embeddings), *((f"layer{i}", layer) for i, layer in enumerate(model.encoder.layer)),
             ("pooler", model.pooler)]

    def clock():
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def elapsed(a, b) -> float:
        return a.elapsed_time(b) if cuda else (b - a) * 1000

    marks: dict[str, list] = {}
    for name, module in parts:
        module.register_forward_pre_hook(lambda m, args, name=name: marks.setdefault(name, []).append(clock()))
        module.register_forward_hook(lambda m, args, out, name=name: marks[name].append(clock()))
    times = np.zeros((len(lengths), len(batch_sizes), len(parts)))
    whole = np.zeros((len(lengths), len(batch_sizes)))
    with torch.inference_mode():
        for li, length in enumerate(lengths):
            for bi, batch in enumerate(batch_sizes):
                ids = torch.randint(0, config.vocab_size, (batch, length), device=device)
                mask = torch.ones_like(ids)
                types = torch.zeros_like(ids)
                samples: dict[str, list[float]] = {name: [] for name, _ in parts}
                totals = []
                for run in range(repeats + 3):
                    marks.clear()
                    start = clock()
                    model(input_ids=ids, attention_mask=mask, token_type_ids=types)
                    end = clock()
                    if cuda:
                        torch.cuda.synchronize()
                    if run >= 3:
                        totals.append(elapsed(start, end))
                        for name, (a, b) in marks.items():
                            samples[name].append(elapsed(a, b))
                times[li, bi] = [statistics.median(samples[name]) for name, _ in parts]
                whole[li, bi] = statistics.median(totals)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    return [n for n, _ in parts], times, whole, name


def table(values: np.ndarray, batch_sizes: list[int], lengths: list[int]) -> dict:
    return {"unit": "ms", "batch_sizes": batch_sizes, "axis": "sequence", "lengths": lengths,
            "mean": [[round(float(v), 4) for v in row] for row in values]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path, help="a Hugging Face BertConfig JSON (config.json)")
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--name", default="bert_gpu")
    p.add_argument("--stages", type=numbers(int), default="1,2,3",
                   help="stage counts to write profiles for (default 1,2,3)")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--lengths", type=numbers(int), default="16,32,64,128")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    batch_sizes = batch_sizes_up_to(args.max_batch_size)
    lengths = list(args.lengths)
    names, times, whole, device = profile(args.config, batch_sizes, lengths, args.fp16, args.repeats)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    inputs = [{"name": n, "dtype": "int64", "dims": ["sequence"]}
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    for count in args.stages:
        spans = groups(list(times[-1, -1]), count)
        profile_json = {
            "name": f"{args.name}_{count}stages", "device": device, "precision": "fp16" if args.fp16 else "fp32",
            "max_batch_size": args.max_batch_size, "inputs": inputs,
            "stages": [{"parts": names[a:b], "latency": table(times[:, :, a:b].sum(axis=2), batch_sizes, lengths)}
                       for a, b in spans],
            "whole": {"latency": table(whole, batch_sizes, lengths)},
        }
        path = args.out_dir / f"{args.name}_{count}stages.json"
        path.write_text(json.dumps(profile_json, indent=1) + "\n")
        print(f"{path}: stages {[names[a:b] for a, b in spans]}; whole model at batch {batch_sizes[-1]}, length "
              f"{lengths[-1]}: {whole[-1, -1]:.3f} ms; at 1 x {lengths[0]}: {whole[0, 0]:.3f} ms on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
