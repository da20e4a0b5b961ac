"""What the load generator sends: one list of requests, cycled through in order.

A request holds its input tensors with the batch axis first, as a client would send them. Three
sources, as with perf_analyzer:

- synthetic data (``random`` or ``zero``) shaped by the model's config and ``--shape`` for the
  variable dimensions; integers are 0 or 1, which every embedding table and mask accepts;
- perf_analyzer's ``--input-data`` JSON: ``{"data": [{"INPUT": [...] | {"content": [...],
  "shape": [...]} | {"b64": "..."}}, ...]}``, one query per entry (``-b`` rows stack consecutive
  entries);
- real text: ``--dataset glue:TASK[:SPLIT]`` tokenized with the model's tokenizer (a
  ``tokenizer.json``), one query per example, sent unpadded (or padded to ``--pad-to``, the common
  deployment that pads every query to a fixed length).
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backend.manifest import TensorSpec
from slicer.sample import sample_inputs
from slicer.triton_config import TRITON_DTYPES

ROOT = Path(__file__).resolve().parents[2]
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
    """A served model as its config.pbtxt describes it: inputs without the batch axis."""

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
                raise WorkloadError(f"input '{tensor['name']}' has type {dtype}, which the load generator cannot fill")
            return TensorSpec(tensor["name"], NUMPY_DTYPES[dtype], tuple(int(d) for d in tensor.get("dims", ())))
        return cls(name=config["name"], max_batch_size=int(config.get("max_batch_size", 0)),
                   inputs=tuple(spec(t) for t in config.get("input", ())),
                   outputs=tuple(t["name"] for t in config.get("output", ())))


def synthetic(model: ModelInterface, rows: int, shapes: Mapping[str, Sequence[int]], zero: bool = False,
              count: int = 16, seed: int = 0) -> list[Request]:
    """``count`` requests of ``rows`` rows of random (or zero) data; ``shapes`` fixes variable dims."""
    specs = []
    for spec in model.inputs:
        dims = tuple(shapes.get(spec.name, spec.dims))
        if len(dims) != len(spec.dims) or any(d < 0 for d in dims):
            raise WorkloadError(f"input '{spec.name}' has dims {list(spec.dims)}; give its shape with "
                                f"--shape {spec.name}:" + ",".join(str(d if d >= 0 else 16) for d in spec.dims))
        specs.append(TensorSpec(spec.name, spec.dtype, dims))
    requests = []
    for i in range(count):
        feed = sample_inputs(specs, rows, seed=seed + i)
        requests.append(Request({k: np.zeros_like(v) if zero else v for k, v in feed.items()}, rows))
    return requests


def from_input_data(path: Path, model: ModelInterface, rows: int) -> list[Request]:
    """perf_analyzer's JSON input data: each entry is one query; ``rows`` entries make a request."""
    try:
        entries = json.loads(Path(path).read_text())["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WorkloadError(f"--input-data {path}: not perf_analyzer's JSON ({{\"data\": [...]}}): {exc}") from None
    queries = []
    for number, entry in enumerate(entries):
        feed = {}
        for spec in model.inputs:
            if spec.name not in entry:
                raise WorkloadError(f"--input-data {path}: entry {number} has no input '{spec.name}'")
            feed[spec.name] = _tensor(entry[spec.name], spec, f"--input-data {path}: entry {number}")
        queries.append(feed)
    if len(queries) < rows:
        raise WorkloadError(f"--input-data {path} has {len(queries)} entries, fewer than the {rows} rows of a request")
    requests = []
    for start in range(0, len(queries) - rows + 1, rows):
        group = queries[start:start + rows]
        try:
            requests.append(Request({n: np.stack([q[n] for q in group]) for n in group[0]}, rows))
        except ValueError:
            raise WorkloadError(f"--input-data {path}: entries {start}..{start + rows - 1} differ in shape and "
                                f"cannot share a request of {rows} rows") from None
    return requests


def _tensor(value, spec: TensorSpec, where: str) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if isinstance(value, Mapping) and "b64" in value:
        flat = np.frombuffer(base64.b64decode(value["b64"]), dtype)
        shape = value.get("shape", spec.dims)
    elif isinstance(value, Mapping):
        flat, shape = np.asarray(value.get("content", []), dtype), value.get("shape", spec.dims)
    else:
        flat, shape = np.asarray(value, dtype).reshape(-1), spec.dims
    if any(d < 0 for d in shape):
        raise WorkloadError(f"{where}: input '{spec.name}' needs a \"shape\" (its dims are {list(spec.dims)})")
    if flat.size != int(np.prod(shape)):
        raise WorkloadError(f"{where}: input '{spec.name}' has {flat.size} values, shape {list(shape)} needs "
                            f"{int(np.prod(shape))}")
    return flat.reshape(shape)


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


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = text.rpartition(":")
    try:
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME:D1,D2,..., got {text!r}") from None


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose what is sent (perf_analyzer's names where it has them)."""
    p.add_argument("-b", dest="rows", type=int, default=1, help="rows (batch size) per request (default 1)")
    p.add_argument("--input-data", default="random", help="random, zero, or perf_analyzer's JSON file")
    p.add_argument("--shape", type=_shape, action="append", default=[], metavar="NAME:D1,D2",
                   help="shape of an input with variable dimensions (without the batch axis)")
    p.add_argument("--dataset", help="glue:TASK[:SPLIT] (e.g. glue:RTE): real text, one query per request")
    p.add_argument("--tokenizer", type=Path, help="the model's tokenizer.json, for --dataset")
    p.add_argument("--max-length", type=int, default=128, help="--dataset: truncate queries to this many tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the random arrivals and synthetic data")


def from_arguments(args: argparse.Namespace, model: ModelInterface, pad_to: int | None = None) -> list[Request]:
    """The requests those flags describe, for ``model``; ``pad_to``: the client pads text queries."""
    if args.dataset:
        if args.rows != 1:
            raise WorkloadError("--dataset sends one query per request; -b must be 1")
        if args.tokenizer is None:
            raise WorkloadError("--dataset needs the model's tokenizer: --tokenizer path/to/tokenizer.json")
        return glue(model, args.dataset, args.tokenizer, args.max_length, pad_to)
    if args.input_data in ("random", "zero"):
        return synthetic(model, args.rows, dict(args.shape), zero=args.input_data == "zero", seed=args.seed)
    return from_input_data(Path(args.input_data), model, args.rows)
