"""The stage manifest: what the slicer wrote and what the backend serves.

It lives in the model's version folder as ``manifest.json`` beside the stage files. The slicer is
its only writer and the backend its only reader, so this module is the contract between them.
It is plain data with no Triton, CUDA or ONNX imports, so both sides (and tests) can use it.

Every tensor that crosses a stage boundary is batched: its first axis is the batch axis and is
left out of ``dims``, as in Triton's config.pbtxt. In ``dims`` an int is a fixed size, -1 a size
that varies, and a string a size that varies and is shared by every tensor naming it (for
example ``"sequence"`` for both ``input_ids`` and ``attention_mask``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One batched tensor: name, numpy dtype name and dims without the batch axis."""

    name: str
    dtype: str
    dims: tuple[Dim, ...]

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(name=data["name"], dtype=data["dtype"], dims=tuple(data["dims"]))


def _tensors(items: list[dict]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec.from_json(item) for item in items)


@dataclass(frozen=True)
class StageSpec:
    """One stage of the sliced model.

    ``inputs`` are what the stage's engine reads from the buffer the previous stage wrote (the
    model's inputs for the first stage); ``outputs`` are what its engine computes. ``carry`` names
    tensors an earlier stage produced that a later one still needs: the executor copies them from
    its input buffer to its output buffer untouched, so that data only ever flows between
    adjacent stages (one buffer pair per boundary, as the paper's executors expect).
    """

    index: int
    file: str
    engine: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    carry: tuple[str, ...] = ()
    nodes: int = 0

    @classmethod
    def from_json(cls, data: dict) -> StageSpec:
        return cls(
            index=data["index"],
            file=data["file"],
            engine=data["engine"],
            inputs=_tensors(data["inputs"]),
            outputs=_tensors(data["outputs"]),
            carry=tuple(data.get("carry", ())),
            nodes=data.get("nodes", 0),
        )


@dataclass(frozen=True)
class Manifest:
    """The whole sliced model: its interface, its stages in order and where it came from."""

    source_file: str
    source_sha256: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    stages: tuple[StageSpec, ...]
    format: int = field(default=FORMAT_VERSION)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"manifest format {data.get('format')!r} is not {FORMAT_VERSION}")
        return cls(
            source_file=data["source_file"],
            source_sha256=data["source_sha256"],
            max_batch_size=data["max_batch_size"],
            inputs=_tensors(data["inputs"]),
            outputs=_tensors(data["outputs"]),
            stages=tuple(StageSpec.from_json(s) for s in data["stages"]),
        )

    def save(self, version_dir: Path) -> Path:
        path = Path(version_dir) / MANIFEST_FILE
        path.write_text(self.to_json())
        return path

    @classmethod
    def load(cls, version_dir: Path) -> Manifest:
        path = Path(version_dir) / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {MANIFEST_FILE} in {version_dir}: slice the model with `python -m slicer`")
        return cls.from_json(path.read_text())
