"""What a load sends: one list of queries, written as perf_analyzer's ``--input-data`` JSON.

A query holds its input tensors with the batch axis first, as a client sends them. Two sources:

- real text: ``--dataset glue:TASK[:SPLIT]`` tokenized with the model's ``tokenizer.json``, one
  query per example, sent unpadded (each its own length) or padded by the client to ``--pad-to``;
- synthetic data (``random`` or ``zero``) shaped by the model's dims, ``--shape`` for the variable
  ones and ``--lengths`` to give the variable dims of successive queries different sizes;
  integers are 0 or 1, which every embedding table and mask accepts.

perf_analyzer sends the entries of ``{"data": [...]}`` in turn, one per request at ``-b 1``; each
entry gives every input its ``content`` and its own ``shape`` (without the batch axis).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from backend.manifest import Manifest, TensorSpec
from backend.sample import sample_inputs
from slicer.slicing import VERSION
from tools.lib.paths import ROOT
from slicer.triton_config import TRITON_DTYPES

GLUE_DIR = Path(os.environ.get("DVABATCH_GLUE", ROOT.parent / "shared" / "data" / "glue"))
NUMPY_DTYPES = {triton: numpy for numpy, triton in TRITON_DTYPES.items()}

# The text columns of each GLUE task's TSV files (by header; CoLA's train and dev files have none).
GLUE_TEXT = {
    "RTE": ("sentence1", "sentence2"), "WNLI": ("sentence1", "sentence2"), "STS-B": ("sentence1", "sentence2"),
    "MRPC": ("#1 String", "#2 String"), "QNLI": ("question", "sentence"), "SST-2": ("sentence",),
    "CoLA": ("sentence",),
}
TOKEN_INPUTS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


class WorkloadError(ValueError):
    """The workload cannot be built; the message says what to give."""


@dataclass(frozen=True)
class Request:
    """One request: input tensors (rows first), its rows, and its length along the token axis
    before any client padding (None for inputs without one)."""

    inputs: dict[str, np.ndarray]
    rows: int
    length: int | None = None


@dataclass(frozen=True)
class ModelInterface:
    """A served model's inputs (without the batch axis) and outputs."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[str, ...]

    @classmethod
    def from_config(cls, config: Mapping) -> ModelInterface:
        """From Triton's model config as JSON (gRPC ``as_json`` or HTTP)."""
        def spec(tensor: Mapping) -> TensorSpec:
            dtype = tensor.get("data_type", "TYPE_FP32")
            if dtype not in NUMPY_DTYPES:
                raise WorkloadError(f"input '{tensor['name']}' has type {dtype}, which no workload here can fill")
            return TensorSpec(tensor["name"], NUMPY_DTYPES[dtype], tuple(int(d) for d in tensor.get("dims", ())))
        return cls(name=config["name"], max_batch_size=int(config.get("max_batch_size", 0)),
                   inputs=tuple(spec(t) for t in config.get("input", ())),
                   outputs=tuple(t["name"] for t in config.get("output", ())))

    @classmethod
    def from_server(cls, url: str, model: str) -> ModelInterface:
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(url) as client:
            return cls.from_config(client.get_model_config(model, as_json=True)["config"])


def synthetic(model: ModelInterface, rows: int, shapes: Mapping[str, Sequence[int]], zero: bool = False,
              count: int = 16, seed: int = 0, lengths: Sequence[int] = (),
              fill: Mapping[str, float] | None = None) -> list[Request]:
    """``count`` requests of ``rows`` rows of random (or zero) data. ``shapes`` fixes variable
    dims; with ``lengths``, request i gives every variable dim ``lengths[i % len(lengths)]``;
    ``fill`` gives an input one value throughout."""
    fill = fill or {}
    unknown = sorted(set(fill) - {spec.name for spec in model.inputs})
    if unknown:
        raise WorkloadError(f"--fill names {', '.join(map(repr, unknown))}, which {model.name} does not take "
                            f"(its inputs: {', '.join(spec.name for spec in model.inputs)})")
    requests = []
    for i in range(count):
        specs = []
        for spec in model.inputs:
            dims = tuple(shapes.get(spec.name, spec.dims))
            if lengths:
                dims = tuple(lengths[i % len(lengths)] if d < 0 else d for d in dims)
            if len(dims) != len(spec.dims) or any(d < 0 for d in dims):
                raise WorkloadError(f"input '{spec.name}' has dims {list(spec.dims)}; give its shape with "
                                    f"--shape {spec.name}:" + ",".join(str(d if d >= 0 else 16) for d in spec.dims)
                                    + " or the variable dims' sizes with --lengths")
            specs.append(TensorSpec(spec.name, spec.dtype, dims))
        feed = sample_inputs(specs, rows, seed=seed + i)
        feed.update({name: np.full_like(feed[name], value) for name, value in fill.items()})
        requests.append(Request({k: np.zeros_like(v) if zero else v for k, v in feed.items()}, rows,
                                lengths[i % len(lengths)] if lengths else None))
    return requests


def glue_texts(task: str, split: str = "dev", folder: Path = GLUE_DIR) -> list[tuple[str, ...]]:
    """The text fields of every example of a GLUE task's split."""
    if task not in GLUE_TEXT:
        raise WorkloadError(f"GLUE task {task!r} is not one of {', '.join(GLUE_TEXT)}")
    path = folder / task / f"{split}.tsv"
    if not path.is_file():
        raise WorkloadError(f"{path} does not exist (set DVABATCH_GLUE to the folder holding the GLUE tasks)")
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    columns = GLUE_TEXT[task]
    if all(c in rows[0] for c in columns):
        indices = [rows[0].index(c) for c in columns]
        rows = rows[1:]
    elif task == "CoLA":  # no header: source, label, original label, sentence
        indices = [3]
    else:
        raise WorkloadError(f"{path}: expected columns {list(columns)} in its header")
    return [tuple(row[i] for i in indices) for row in rows if len(row) > max(indices)]


def glue(model: ModelInterface, dataset: str, tokenizer: Path, max_length: int = 128,
         pad_to: int | None = None, folder: Path = GLUE_DIR) -> list[Request]:
    """``dataset`` is ``glue:TASK`` or ``glue:TASK:SPLIT``; one query per example, tokenized with
    ``tokenizer`` (truncated to ``max_length`` tokens) and unpadded unless ``pad_to``."""
    kind, _, rest = dataset.partition(":")
    task, _, split = rest.partition(":")
    if kind != "glue" or not task:
        raise WorkloadError(f"--dataset {dataset!r}: expected glue:TASK or glue:TASK:SPLIT, e.g. glue:RTE")
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(tokenizer))
    except Exception as exc:  # noqa: BLE001 - the tokenizers library raises its own kinds
        raise WorkloadError(f"--tokenizer {tokenizer}: cannot load it as a tokenizer.json ({exc})") from None
    tok.no_padding()
    tok.enable_truncation(max_length)
    unknown = [s.name for s in model.inputs if s.name not in TOKEN_INPUTS]
    if unknown:
        raise WorkloadError(f"model '{model.name}' has inputs {unknown} that a tokenizer does not give; "
                            f"it gives {list(TOKEN_INPUTS)}")
    requests = []
    for texts in glue_texts(task, split or "dev", folder):
        encoding = tok.encode(*texts)
        length = len(encoding.ids)
        width = max(pad_to or 0, length)
        feed = {}
        for spec in model.inputs:
            row = np.zeros((1, width), np.dtype(spec.dtype))
            row[0, :length] = getattr(encoding, TOKEN_INPUTS[spec.name])
            feed[spec.name] = row
        requests.append(Request(feed, 1, length))
    return requests


def input_data(requests: Sequence[Request]) -> dict:
    """perf_analyzer's ``--input-data`` JSON: one entry per row, each input with its own shape."""
    entries = []
    for request in requests:
        for row in range(request.rows):
            entries.append({name: {"content": tensor[row].reshape(-1).tolist(), "shape": list(tensor.shape[1:])}
                            for name, tensor in request.inputs.items()})
    return {"data": entries}


def write_input_data(requests: Sequence[Request], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(input_data(requests), separators=(",", ":")))
    return path


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.rpartition(":")
    try:
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME:D1,D2,..., got {text!r}") from None


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes such as 16,64,128, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive, got {text!r}")
    return sizes


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose what is sent (perf_analyzer's names where it has them)."""
    p.add_argument("--input-data", default="random", help="random, zero, or a perf_analyzer JSON file to send as is")
    p.add_argument("--shape", type=_shape, action="append", default=[], metavar="NAME:D1,D2",
                   help="synthetic data: shape of an input with variable dims (without the batch axis)")
    p.add_argument("--lengths", type=_sizes, default=(), metavar="L1,L2,...",
                   help="synthetic data: successive queries give every variable dim these sizes in turn")
    p.add_argument("--count", type=int, default=64, help="synthetic data: distinct queries (default 64)")
    p.add_argument("--dataset", help="glue:TASK[:SPLIT] (e.g. glue:RTE): real text, one query per request")
    p.add_argument("--tokenizer", type=Path, help="the model's tokenizer.json, for --dataset")
    p.add_argument("--max-length", type=int, default=128, help="--dataset: truncate queries to this many tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")


def from_arguments(args: argparse.Namespace, model: ModelInterface, pad_to: int | None = None) -> list[Request]:
    """The queries those flags describe, for ``model`` (not for a JSON file, sent as is);
    ``pad_to``: the client pads text queries."""
    if args.dataset:
        if args.tokenizer is None:
            raise WorkloadError("--dataset needs the model's tokenizer: --tokenizer path/to/tokenizer.json")
        return glue(model, args.dataset, args.tokenizer, args.max_length, pad_to)
    if args.input_data not in ("random", "zero"):
        raise WorkloadError(f"--input-data {args.input_data} is a file: it is sent as it is")
    return synthetic(model, 1, dict(args.shape), zero=args.input_data == "zero", count=args.count, seed=args.seed,
                     lengths=args.lengths)


def interface_of(model_dir: Path) -> ModelInterface:
    """A sliced model's interface as Triton serves it (named dims are variable: -1)."""
    manifest = Manifest.load(model_dir / VERSION)
    inputs = tuple(replace(s, dims=tuple(d if isinstance(d, int) else -1 for d in s.dims)) for s in manifest.inputs)
    return ModelInterface(model_dir.name, manifest.max_batch_size, inputs, tuple(s.name for s in manifest.outputs))

