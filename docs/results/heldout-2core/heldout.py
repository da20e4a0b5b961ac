"""Held-out models through a real tritonserver: answers against the unsliced source.

    python docs/results/heldout-2core/heldout.py [--work DIR] [--rounds 3] [--policies pass,random,...]
        [--slicer-args "--target torch --device cpu"]

Exports small models no test or example uses (torch 2.13 CPU and onnx.helper; nothing is
downloaded), slices each into 2-3 stages with ``python -m slicer`` (the defaults, so ``policy:
auto``), serves them all in one tritonserver (``tools.lib.triton.Server``) and sends 40-60
concurrent requests per model and round, of 1-4 rows and, where the model has a named axis,
mixed lengths. Prints the largest absolute difference from ONNX Runtime on the source, per
model and round: 0 (or float rounding) where the backend answers as the model does. On this CPU
``auto`` serves each model fused, inside ``execute``; ``--policies`` serves a copy of each under
every policy named too (``<model>-<policy>``; ``input`` policies only where the model kept a
length axis), which runs the multi-entry pipeline: stretches, splits and the buffers between
stages, on tensors no test uses.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import tritonclient.grpc as grpcclient
from onnx import TensorProto as T
from onnx import helper
from torch import nn

from backend.manifest import Manifest
from tools.lib.client import infer
from tools.lib.peers import write_variant
from tools.lib.processes import free_port
from tools.lib.triton import Server

OPSET = [helper.make_opsetid("", 17)]


class Lstm(nn.Module):
    """An LSTM over the time axis, read at its last step: padding the time axis changes it."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.lstm = nn.LSTM(32, 32, num_layers=2, batch_first=True)
        self.post = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, feats):
        return self.post(self.lstm(self.pre(feats))[0][:, -1])


class SeqFirst(nn.Module):
    """Sequence-first intermediates (seq, batch, d), a running sum and a mean over the sequence."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.layers = nn.ModuleList([nn.Linear(32, 32) for _ in range(6)])

    def forward(self, ids):
        x = self.emb(ids).transpose(0, 1)
        for layer in self.layers:
            x = torch.relu(layer(x)) + torch.cumsum(x, 0) * 0.1
        return x.mean(0), x.transpose(0, 1)


class Mixed(nn.Module):
    """int64 and float inputs, two outputs, one of them read again inside."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 24)
        self.a = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(6)])
        self.b = nn.Linear(32, 4)

    def forward(self, ids, dense):
        h = self.a(torch.cat([self.emb(ids).mean(1), dense], dim=1))
        logits = self.b(h)
        return logits, h * logits.softmax(-1).max(-1, keepdim=True).values


class Masked(nn.Module):
    """int32 ids, a bool mask that the pooling honours, a per-row scalar and an FP16 output."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 16)
        self.l1, self.l2, self.l3 = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 1)

    def forward(self, ids, keep):
        x = torch.relu(self.l2(torch.relu(self.l1(self.emb(ids.long())))))
        w = keep.to(x.dtype).unsqueeze(-1)
        pooled = (x * w).sum(1) / w.sum(1).clamp(min=1)
        return self.l3(pooled).squeeze(-1), pooled.half()


class Image(nn.Module):
    """Convolutions on images of any height and width (sliced with --length-axis none)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                               nn.Conv2d(8, 4, 3, padding=1))

    def forward(self, x):
        y = self.c(x)
        return y, y.mean((2, 3))


def export(module: nn.Module, example: tuple, inputs: dict, outputs: dict, path: Path) -> None:
    torch.onnx.export(module.eval(), example, str(path), input_names=list(inputs), output_names=list(outputs),
                      dynamic_axes={**inputs, **outputs}, opset_version=17, dynamo=False)


def graphs(folder: Path) -> None:
    """Three graphs torch does not export: an If reading outer-scope tensors, initializers listed
    as graph inputs (old exporters), an input echoed straight to an output."""
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])
    branch = [helper.make_graph([helper.make_node(op, ["a", "c"], [f"{op}_out"])], op, [],
                                [helper.make_tensor_value_info(f"{op}_out", T.FLOAT, ["batch", 4])])
              for op in ("Add", "Sub")]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Tanh", ["c"], ["d"]),
             helper.make_node("Constant", [], ["flag"], value=helper.make_tensor("f", T.BOOL, [], [True])),
             helper.make_node("If", ["flag"], ["o"], then_branch=branch[0], else_branch=branch[1]),
             helper.make_node("Mul", ["o", "d"], ["y"])]
    y = helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4])
    onnx.save(helper.make_model(helper.make_graph(nodes, "iff", [x], [y]), opset_imports=OPSET, ir_version=8),
              str(folder / "iff.onnx"))
    w = helper.make_tensor("w", T.FLOAT, [4, 4], np.eye(4, dtype=np.float32).flatten().tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("MatMul", ["b", "w"], ["c"]), helper.make_node("Tanh", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "oldinit", [x, helper.make_tensor_value_info("w", T.FLOAT, [4, 4])], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=6),
              str(folder / "oldinit.onnx"))
    nodes = [helper.make_node("Identity", ["x"], ["echo"]), helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"]), helper.make_node("Abs", ["b"], ["y1"]),
             helper.make_node("Exp", ["y1"], ["y2"])]
    outs = [helper.make_tensor_value_info(n, T.FLOAT, ["batch", 4]) for n in ("echo", "y1", "y2")]
    onnx.save(helper.make_model(helper.make_graph(nodes, "echo", [x], outs), opset_imports=OPSET, ir_version=8),
              str(folder / "echo.onnx"))


def build(folder: Path) -> dict[str, list[str]]:
    """Every source written into ``folder``; by name, the slicer's options beyond the defaults."""
    torch.manual_seed(0)
    b, s = {0: "batch"}, {0: "batch", 1: "sequence"}
    export(Lstm(), (torch.randn(2, 10, 16),), {"feats": {0: "batch", 1: "time"}}, {"out": b}, folder / "lstm.onnx")
    export(SeqFirst(), (torch.randint(0, 100, (2, 12)),), {"ids": s}, {"pooled": b, "hidden": s},
           folder / "seqfirst.onnx")
    export(Mixed(), (torch.randint(0, 50, (2, 6)), torch.randn(2, 8)), {"ids": b, "dense": b},
           {"logits": b, "h": b}, folder / "mixed.onnx")
    export(Masked(), (torch.randint(0, 30, (2, 5), dtype=torch.int32), torch.ones(2, 5, dtype=torch.bool)),
           {"ids": s, "keep": s}, {"score": b, "pooled16": b}, folder / "masked.onnx")
    hw = {0: "batch", 2: "h", 3: "w"}
    export(Image(), (torch.randn(2, 3, 16, 16),), {"x": hw}, {"map": hw, "pooled": b}, folder / "image.onnx")
    graphs(folder)
    return {"lstm": ["--stages", "3"], "seqfirst": ["--stages", "2"], "mixed": ["--stages", "3"],
            "masked": ["--stages", "3"], "image": ["--stages", "2", "--length-axis", "none"],
            "iff": ["--stages", "3", "--optimize", "none"], "oldinit": ["--stages", "3"], "echo": ["--stages", "3"]}


def feeds(name: str, rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    def one() -> dict[str, np.ndarray]:
        rows, length = int(rng.integers(1, 4)), int(rng.choice([3, 7, 12]))
        if name == "lstm":
            return {"feats": rng.standard_normal((rows, length, 16)).astype(np.float32)}
        if name == "seqfirst":
            return {"ids": rng.integers(0, 100, (rows, length))}
        if name == "mixed":
            return {"ids": rng.integers(0, 50, (rows, 6)), "dense": rng.standard_normal((rows, 8)).astype(np.float32)}
        if name == "masked":
            keep = rng.random((rows, length)) < 0.8
            keep[:, 0] = True
            return {"ids": rng.integers(0, 30, (rows, length)).astype(np.int32), "keep": keep}
        if name == "image":
            size = (rows, 3, int(rng.choice([8, 16])), int(rng.choice([8, 12])))
            return {"x": rng.standard_normal(size).astype(np.float32)}
        return {"x": rng.standard_normal((rows, 4)).astype(np.float32)}
    return [one() for _ in range(count)]


def variants(repository: Path, models: list[str], policies: list[str]) -> dict[str, str]:
    """A copy of each model under each policy (Policy I only where it kept a length axis); by
    served name, the source's name."""
    served = {name: name for name in models}
    for name in models:
        axis = Manifest.load(repository / name / "1").length_axis
        for policy in policies:
            if "input" in policy and axis is None:
                continue
            variant = f"{name}-{policy.replace('+', '_')}"
            write_variant(repository / name, repository, variant, {"policy": policy})
            served[variant] = name
    return served


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="the sources and the repository (default: a new temporary folder)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default="", help="serve a copy of each model under each of these policies too")
    parser.add_argument("--slicer-args", default="", help="more options for every slicing (e.g. --target torch)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dvabatch-heldout-"))
    sources, repository = work / "sources", work / "repository"
    sources.mkdir(parents=True, exist_ok=True)
    options = build(sources)
    for name, extra in options.items():
        command = [sys.executable, "-m", "slicer", str(sources / f"{name}.onnx"), "--out", str(repository / name),
                   *extra, *args.slicer_args.split()]
        done = subprocess.run(command, capture_output=True, text=True)
        said = [line for line in done.stdout.splitlines() if "input diversity" in line or "error" in line]
        print(f"{name}: sliced, exit {done.returncode}" + "".join(f"; {line.strip()}" for line in said), flush=True)
    sliced = [name for name in options if (repository / name / "1" / "manifest.json").is_file()]
    served = variants(repository, sliced, [p for p in args.policies.split(",") if p])
    rng = np.random.default_rng(1)
    with Server(repository, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                log=work / "tritonserver.log") as server, grpcclient.InferenceServerClient(server.grpc_url) as client:
        sessions = {source: ort.InferenceSession(str(sources / f"{source}.onnx"), providers=["CPUExecutionProvider"])
                    for source in set(served.values())}  # one per source, for all its copies and rounds
        for round_ in range(args.rounds):
            for name, source in served.items():
                session = sessions[source]
                names = [o.name for o in session.get_outputs()]
                sent = feeds(source, rng, 48)
                with ThreadPoolExecutor(8) as pool:
                    answers = list(pool.map(lambda feed, name=name: infer(client, name, feed), sent))
                worst = 0.0
                for feed, answer in zip(sent, answers):
                    for output, expected in zip(names, session.run(None, feed)):
                        got = answer[output].reshape(expected.shape)  # a per-row scalar comes back as [rows, 1]
                        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - expected))))
                print(f"round {round_ + 1}: {name}: largest difference from the source {worst:.3g}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
