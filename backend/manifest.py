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

import dataclasses
import functools
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

    @functools.cached_property
    def named(self) -> tuple[tuple[int, str], ...]:
        """(axis, name) of each named dim, axes counted with the batch axis (0): what padding
        reads for every batch, worked out once."""
        return tuple((axis, dim) for axis, dim in enumerate(self.dims, start=1) if isinstance(dim, str))

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(name=data["name"], dtype=data["dtype"], dims=tuple(data["dims"]))


@dataclass(frozen=True)
class LatencyTable:
    """How long a stage takes, in milliseconds, per batch size (and optionally per padded length).

    In ``manifest.json`` (a stage's ``"latency"``)::

        {"unit": "ms", "batch_sizes": [1, 2, 4, 8], "mean": [5.0, 6.1, 8.0, 12.5]}
        {"unit": "ms", "batch_sizes": [1, 2], "axis": "sequence", "lengths": [16, 64],
         "mean": [[5.0, 6.0], [9.0, 12.0]]}

    Without ``axis`` ``mean`` (and the optional ``p99``) has one entry per batch size; with it,
    one row per length, each with one entry per batch size. ``axis`` is a named dim of the
    stage's inputs. A lookup rounds the batch size and the length up to the next tabulated one,
    as a batch padded to that size would run; a prediction (``predict``) reads between the
    tabulated lengths instead, because an engine runs a batch at its own longest length, not
    at the next tabulated one. The timed engine sleeps for the predicted ``mean``; the
    scheduling policies read the same predictions.
    """

    batch_sizes: tuple[int, ...]
    mean: tuple
    p99: tuple | None = None
    axis: str | None = None
    lengths: tuple[int, ...] | None = None
    unit: str = "ms"
    # The engine runs a batch at the next tabulated length (CUDA graphs captured at these lengths,
    # the batch padded up to one): ``predict`` then rounds the length up as ``lookup`` does.
    padded: bool = False

    def __post_init__(self):
        if self.unit != "ms":
            raise ValueError(f"latency unit {self.unit!r} is not 'ms'")
        if list(self.batch_sizes) != sorted(set(self.batch_sizes)) or not self.batch_sizes:
            raise ValueError(f"latency batch_sizes {list(self.batch_sizes)} must be increasing")
        if (self.axis is None) != (self.lengths is None):
            raise ValueError("latency needs both 'axis' and 'lengths', or neither")
        rows = [self.mean] if self.lengths is None else list(self.mean)
        if self.lengths is not None and len(rows) != len(self.lengths):
            raise ValueError(f"latency has {len(rows)} rows of 'mean' for {len(self.lengths)} lengths")
        if any(len(row) != len(self.batch_sizes) for row in rows):
            raise ValueError(f"latency 'mean' needs one entry per batch size {list(self.batch_sizes)}")

    @classmethod
    def from_json(cls, data: dict) -> LatencyTable:
        freeze = lambda v: tuple(freeze(x) for x in v) if isinstance(v, list) else v  # noqa: E731
        return cls(**{key: freeze(value) for key, value in data.items()})

    def row(self, length: int | None = None, statistic: str = "mean") -> tuple[float, ...]:
        """``mean`` (or ``p99``) per batch size for ``length`` rounded up along ``axis``."""
        values = getattr(self, statistic)
        if values is None:
            raise ValueError(f"latency table has no {statistic!r}")
        if self.lengths is None:
            return tuple(values)
        if length is None:
            raise ValueError(f"latency table is per '{self.axis}' length; none given")
        return tuple(values[_round_up(self.lengths, length, f"'{self.axis}' length")])

    def lookup(self, batch: int, length: int | None = None) -> float:
        """Mean milliseconds for ``batch`` rows padded to ``length`` along ``axis``."""
        return float(self.row(length)[_round_up(self.batch_sizes, batch, "batch size")])

    def predict(self, batch: int, length: int | None = None, statistic: str = "mean") -> float:
        """Milliseconds ``batch`` rows of ``length`` are expected to take: the table's entry for
        the batch size rounded up, linear between the tabulated lengths around ``length`` (the
        first length's entry below it), and beyond the largest batch or length proportionally
        more (rounded up to the next length where the engine pads to it, ``padded``); ``p99``
        falls back to ``mean`` where the table has none. A table without ``axis`` ignores
        ``length``. Reading between lengths matters where time grows with the length (a CPU): a
        query of 70 tokens costs about half one of 128, and rounding it up to 128 made Policy I
        pad such queries together at twice their cost."""
        statistic = statistic if getattr(self, statistic) is not None else "mean"
        scale = 1.0
        if batch > self.batch_sizes[-1]:
            scale, batch = batch / self.batch_sizes[-1], self.batch_sizes[-1]
        column = _round_up(self.batch_sizes, batch, "batch size")
        if self.lengths is None:
            return scale * float(self.row(None, statistic)[column])
        length = max(length or 0, self.lengths[0])
        if length >= self.lengths[-1]:
            return scale * length / self.lengths[-1] * float(self.row(self.lengths[-1], statistic)[column])
        upper = _round_up(self.lengths, length, f"'{self.axis}' length")
        high = float(self.row(self.lengths[upper], statistic)[column])
        if self.lengths[upper] == length or self.padded:
            return scale * high
        below, above = self.lengths[upper - 1], self.lengths[upper]
        low = float(self.row(below, statistic)[column])
        return scale * (low + (high - low) * (length - below) / (above - below))

    @classmethod
    def total(cls, tables: list[LatencyTable]) -> LatencyTable:
        """The stages one after another: on the first table's batch sizes and lengths, each entry
        the sum of every table's prediction there (``p99`` only where every table has one)."""
        first = tables[0]
        lengths = first.lengths or (None,)

        def summed(statistic: str) -> tuple | None:
            if any(getattr(t, statistic) is None for t in tables):
                return None
            rows = tuple(tuple(round(sum(t.predict(b, n, statistic) for t in tables), 4) for b in first.batch_sizes)
                         for n in lengths)
            return rows if first.lengths else rows[0]

        return cls(first.batch_sizes, summed("mean"), summed("p99"), first.axis, first.lengths,
                   padded=first.padded)


def _round_up(table: tuple[int, ...], value: int, what: str) -> int:
    for index, entry in enumerate(table):
        if entry >= value:
            return index
    raise ValueError(f"{what} {value} is beyond the latency table's largest, {table[-1]}")


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
    latency: LatencyTable | None = None
    node_range: tuple[str, str] | None = None  # first and last node of the optimised source graph
    preferred_batch_size: int | None = None  # from ``latency``: time per query stops improving beyond it
    buffer_bytes: int | None = None  # what the stage writes (outputs + carry) at the max batch size
    precision: str = "fp32"  # torch stages: fp32 (TF32 off), tf32 or fp16 (``onnx_torch.TorchGraph``)

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
            latency=LatencyTable.from_json(data["latency"]) if data.get("latency") else None,
            node_range=tuple(data["node_range"]) if data.get("node_range") else None,
            preferred_batch_size=data.get("preferred_batch_size"),
            buffer_bytes=data.get("buffer_bytes"),
            precision=data.get("precision", "fp32"),
        )


@dataclass(frozen=True)
class SlicingReport:
    """How the slicer chose the stages: what it balanced and which diversities it found.

    ``balance`` is the slowest stage's measured mean over the mean stage at ``balance_batch_size``
    (and ``balance_length``); 1.0 is perfectly even. ``length_axis`` names the input axis whose
    padded length varies (input diversity); load diversity is assumed for every service, and
    operator diversity is ``Manifest.operator_diversity``.
    """

    target: str
    optimization: str
    balance_batch_size: int
    balance_length: int | None
    balance: float
    length_axis: str | None
    profile_seconds: float
    stages_chosen: str = ""  # with ``--stages auto``: why this many
    calibration: tuple[dict, ...] = ()  # per round: cuts, predicted and measured slowest stage (ms)
    warning: str = ""  # the legal cuts cannot balance the stages, and what blocks better ones
    device: str = "cpu"  # where the stages were profiled, and so where they serve: cpu or cuda
    unpadded: str = ""  # why the inputs' named axis is no length axis: padding a query along it changes its answers
    coupled: str = ""  # a query's answers depend on the other rows of its batch: how the source showed it
    machine: dict | None = None  # what the stages' tables were measured on (``host.Machine``'s fields)

    @classmethod
    def from_json(cls, data: dict) -> SlicingReport:
        return cls(**{**data, "calibration": tuple(data.get("calibration", ()))})


@dataclass(frozen=True)
class Manifest:
    """The whole sliced model: its interface, its stages in order and where it came from."""

    source_file: str
    source_sha256: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    stages: tuple[StageSpec, ...]
    slicing: SlicingReport | None = None
    # The unsliced model's own table where it was measured apart (a simulated profile's ``whole``):
    # what the stages take fused, which may differ from their tables summed.
    whole: LatencyTable | None = None
    graphs: bool = False  # served as CUDA graphs (set at load, ``as_graphs``; never written by the slicer)
    format: int = field(default=FORMAT_VERSION)

    @property
    def length_axis(self) -> str | None:
        """The input axis whose padded length varies (input diversity): the slicer's, else (a
        hand-written or simulated model) the axis of the stage latency tables or the first named
        dim of the inputs."""
        if self.slicing is not None:
            return self.slicing.length_axis
        tabulated = next((s.latency.axis for s in self.stages if s.latency is not None and s.latency.axis), None)
        named = (d for spec in self.inputs for d in spec.dims if isinstance(d, str))
        return tabulated or next(named, None)

    @property
    def size_limits(self) -> dict[str, int]:
        """The largest size of each named axis the model was profiled (and verified) for: the
        longest length of the first stage's latency table. Longer inputs may run far slower
        than predicted, or exhaust memory; config.pbtxt may raise the limit."""
        table = self.stages[0].latency if self.stages else None
        return {table.axis: table.lengths[-1]} if table is not None and table.axis else {}

    @property
    def operator_diversity(self) -> bool:
        """The stages prefer different batch sizes."""
        return len({s.preferred_batch_size for s in self.stages if s.preferred_batch_size}) > 1

    def as_graphs(self) -> Manifest:
        """The model as served where its torch stages replay CUDA graphs: their host time is a
        graph's launch, not the interpreter's (``diversity.interpreted``), and where a batch is
        padded up to a tabulated length before it enters (the graphs' length buckets), every
        table predicts the length rounded up."""
        def padded(table: LatencyTable | None) -> LatencyTable | None:
            return dataclasses.replace(table, padded=True) if table is not None and table.lengths else table
        return dataclasses.replace(self, graphs=True, whole=padded(self.whole), stages=tuple(
            dataclasses.replace(s, latency=padded(s.latency)) for s in self.stages))

    def fused(self) -> Manifest:
        """The model as one stage running every stage in turn (its latency ``whole``, else the
        tables summed): what the runtime serves when the pipeline cannot pay (``decide.choose``)."""
        tables = [s.latency for s in self.stages]
        stage = StageSpec(index=0, file="", engine=self.stages[0].engine, inputs=self.inputs, outputs=self.outputs,
                          nodes=sum(s.nodes for s in self.stages), precision=self.stages[0].precision,
                          latency=self.whole or (LatencyTable.total(tables) if all(tables) else None))
        return dataclasses.replace(self, stages=(stage,))

    def to_json(self) -> str:
        data = asdict(self)
        # How it is served (``as_graphs``), not what the slicer made: never written.
        del data["graphs"]
        for table in [data["whole"], *(stage["latency"] for stage in data["stages"])]:
            if table is not None:
                del table["padded"]
        return json.dumps(data, indent=2) + "\n"

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
            slicing=SlicingReport.from_json(data["slicing"]) if data.get("slicing") else None,
            whole=LatencyTable.from_json(data["whole"]) if data.get("whole") else None,
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
        try:
            return cls.from_json(path.read_text())
        except (ValueError, KeyError, TypeError) as exc:  # (json's errors are ValueErrors)
            what = f"has no {exc}" if isinstance(exc, KeyError) else f"cannot be read: {exc}"
            raise ValueError(f"{path} {what}; re-run the slicer (`python -m slicer`)") from exc
