"""The source model as the slicer takes it, and what it refuses before profiling: each refusal one
``SliceError`` line that names the input (file, tensor, node or option) and the fix.

A model is run once by ONNX Runtime (its own source, on the CPU, whatever the target) at one
and two rows, and at one row for every ``--lengths`` entry: what Triton would have to serve —
one output row per query, tensors of a type Triton has — is read from what the model does, not
from what its graph declares (exporters leave output shapes unnamed, and a constant or a sum over
the batch looks like any other output). A length the model cannot take (a position table of 64
rows) is found by bisection down to the largest one it takes, so that the message can say which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from backend.engines import ort_options
from backend.manifest import TensorSpec
from backend.padding import stack
from backend.sample import sample_inputs, sizes_at
from slicer.errors import SliceError
from backend.interface import TRITON_DTYPES


def read_source(src: Path) -> onnx.ModelProto:
    """The source graph (weights left on disk), or a SliceError saying why it is not one."""
    if not src.is_file():
        raise SliceError(f"{src} does not exist" if not src.exists() else f"{src} is not a file")
    try:
        model = onnx.load(str(src), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: not an ONNX file
        raise SliceError(f"{src} is not a readable ONNX model (truncated, or another format): {exc}") from None
    if not model.graph.node or not model.graph.input:
        raise SliceError(f"{src} holds no ONNX graph with inputs and nodes (is it an ONNX model?)")
    return model


def runtime_refused(exc: BaseException) -> bool:
    """ONNX Runtime's own errors (an op it cannot run, a graph it cannot load) are about the
    user's model; anything else is the slicer's bug and keeps its traceback."""
    return isinstance(exc, Exception) and type(exc).__module__.startswith("onnxruntime")


def first_line(exc: BaseException, src: Path) -> str:
    """The error's first line, with the slicer's scratch files named as the source they came
    from, and an ONNX Runtime kernel's failure cut to the node and what it said (not the C++
    file and condition that caught it)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from \S+ failed:)?(Fatal error: )?", "", text)
    failed = re.search(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", text)
    if failed:
        kind, node, said = failed.groups()
        text = f"node {node!r} ({kind}) failed: " + re.sub(r"^\S+:\d+ .*? was false\. ", "", said)
    return re.sub(r"/\S*?\.onnx", src.name, text)


UNKNOWN_OPERATOR = re.compile(r"is not a registered function/op|No Op registered for (\w+)")
STANDARD_ONLY = "export the model with standard ONNX operators only (the slicer runs it on ONNX Runtime's CPU kernels)"


def cannot_run(src: Path, exc: BaseException) -> SliceError:
    """ONNX Runtime's refusal of the source as one line, with the fix where it is known."""
    fix = f": {STANDARD_ONLY}" if UNKNOWN_OPERATOR.search(str(exc)) else ""
    return SliceError(f"ONNX Runtime cannot run {src}: {first_line(exc, src)}{fix}")


@dataclass(frozen=True)
class Findings:
    """What a query's answers depend on besides its own inputs, found by running the source."""

    unpadded: str = ""  # padding it along the length axis changes them (``padding_changes``)
    coupled: str = ""  # the other rows of its batch change them (``rows_couple``)


def check_source(src: Path, model: onnx.ModelProto, specs: Sequence[TensorSpec], axis: str | None,
                 lengths: Sequence[int | None], dim_sizes: Mapping[str, int], tolerance: float) -> Findings:
    """Refuse, before anything is profiled or written, a source the backend could not serve as
    asked: an input or output of a type Triton lacks, an output without one row per query (a
    constant, a sum over the batch), ``--lengths`` past what the model takes. Return what else
    its answers depend on: padding along the length ``axis``, the other rows of a batch."""
    import onnxruntime as ort

    for spec in specs:
        if spec.dtype not in TRITON_DTYPES:
            raise SliceError(f"{src.name}: input {spec.name!r} is {_kind(spec.dtype)}, which the dvabatch backend "
                             f"does not serve (it serves {', '.join(TRITON_DTYPES)}): make the model take numbers "
                             "there and convert in the client")
    options = ort_options()
    options.log_severity_level = 4  # the probe's failures are ours to report, not its log's
    try:
        session = ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        if runtime_refused(exc):
            raise cannot_run(src, exc) from None
        raise
    first = _largest_length(session, src, specs, axis, lengths, dim_sizes)
    names = [o.name for o in session.get_outputs()]
    made_by = {out: node for node in model.graph.node for out in node.output}
    constants = {t.name for t in model.graph.initializer} | {
        n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    shapes = {}
    for rows in (1, 2):
        outputs = _run(session, src, specs, rows, sizes_at(dim_sizes, axis, first))
        for name, array in zip(names, outputs):
            shapes.setdefault(name, []).append(np.shape(array))
            if rows == 1:
                _check_type(src, name, np.asarray(array).dtype, made_by.get(name))
    for name, (one, two) in shapes.items():
        if len(one) and len(two) and (one[0], two[0]) == (1, 2):
            continue
        if name in constants:
            raise SliceError(f"{src.name}: output {name!r} is a constant of the graph (shape {list(two)}, the same "
                             "for every query), where Triton needs one row per query: drop it from the graph's "
                             "outputs and keep the value in the client")
        node = made_by.get(name)
        raise SliceError(f"{src.name}: output {name!r} has no batch axis (shape {list(one)} for one query, "
                         f"{list(two)} for two{_by(node)}), where Triton needs one row per query: drop it from the "
                         "graph's outputs or export it with the batch as its first axis")
    return Findings(padding_changes(session, specs, axis, lengths, dim_sizes, tolerance) or "",
                    rows_couple(session, specs, sizes_at(dim_sizes, axis, first), tolerance) or "")


def padding_changes(session, specs: Sequence[TensorSpec], axis: str | None, lengths: Sequence[int | None],
                    dim_sizes: Mapping[str, int], tolerance: float) -> str | None:
    """Why one query, padded at the end of ``axis`` with zeros as the backend pads the shorter
    queries of a batch (``backend.padding.stack``), is answered otherwise than alone, its outputs
    cut back to its own length; None where it is answered alike within ``tolerance`` (and a
    ten-thousandth of the output's largest value: the longer sums of a masked attention round
    differently). A model that masks its padding (BERT's attention mask) is answered alike; a
    mean, a sum or a recurrence over the axis without a mask (an LSTM's last step) is not, and
    the backend must then batch only queries of one length. Integer inputs are ones (a mask that
    keeps every token; ids any vocabulary has), floats random."""
    if axis is None:
        return None
    longest = lengths[-1]
    short = lengths[0] if lengths[0] < longest else longest // 2
    if not short:
        return None
    feed = {name: np.ones_like(array) if array.dtype.kind in "iub" else array
            for name, array in sample_inputs(specs, 1, sizes_at(dim_sizes, axis, short), seed=1).items()}
    padded = {spec.name: stack([feed[spec.name]], spec, {axis: longest}) for spec in specs}
    names = [o.name for o in session.get_outputs()]
    for name, alone, long in zip(names, session.run(None, feed), session.run(None, padded)):
        alone, long = np.asarray(alone), np.asarray(long)
        if alone.ndim != long.ndim:
            return f"output {name!r} has {alone.ndim} axes unpadded and {long.ndim} padded"
        # the axes that grew with the padding are the length axis: cut back to the query's own
        cut = long[tuple(slice(n) for n in alone.shape)]
        if cut.shape != alone.shape:
            return f"output {name!r} is shaped {list(alone.shape)} unpadded and {list(long.shape)} padded"
        if alone.dtype.kind in "fc":
            worst = _off_by(alone, cut, tolerance)
            alike, how = not worst, f"largest difference {worst:.3g}"
        else:
            alike, how = np.array_equal(cut, alone), "its values differ"
        if not alike:
            return f"padding one query from {axis}={short} to {longest} with zeros changes its output {name!r} ({how})"
    return None


def rows_couple(session, specs: Sequence[TensorSpec], sizes: Mapping[str, int], tolerance: float) -> str | None:
    """Why one query batched with another is answered otherwise than alone, or None where it is
    answered alike (``_off_by``, as ``padding_changes``). A model whose rows share a computation
    (dynamic quantization's scale over the whole batch, ONNX Runtime's ``quantize_dynamic``;
    batch statistics) answers a query by the company it is batched in: Triton's own batching
    does so too, and the backend's splits and stretches change that company stage by stage. The
    other query's floats are four times as large, so that it dominates whatever the batch shares."""
    one, other = sample_inputs(specs, 1, sizes, seed=1), sample_inputs(specs, 1, sizes, seed=2)
    together = {name: np.concatenate([one[name], other[name] * 4 if one[name].dtype.kind == "f" else other[name]])
                for name in one}
    names = [o.name for o in session.get_outputs()]
    for name, alone, batched in zip(names, session.run(None, one), session.run(None, together)):
        alone, first = np.asarray(alone), np.asarray(batched)[:1]
        if alone.dtype.kind not in "fc" or alone.shape != first.shape:
            continue  # (integer answers, an argmax, are not compared: rounding may flip them alike)
        worst = _off_by(alone, first, tolerance)
        if worst:
            return (f"one query batched with another is answered otherwise than alone (output {name!r}, largest "
                    f"difference {worst:.3g}): its rows share a computation (dynamic quantization over the whole "
                    "batch does), so any batching, Triton's own too, answers a query by the others in its batch, "
                    "and the backend's splits and stretches change those stage by stage; max_batch_size 1 "
                    "answers every query alone")
    return None


def _off_by(alone: np.ndarray, other: np.ndarray, tolerance: float) -> float:
    """How far ``other`` is from ``alone`` where farther than ``tolerance`` and a ten-thousandth
    of ``alone``'s largest value (longer sums round differently), else 0."""
    worst = float(np.max(np.abs(other.astype(np.float64) - alone), initial=0.0))
    return worst if worst > tolerance + 1e-4 * float(np.max(np.abs(alone), initial=0.0)) else 0.0


def _by(node: onnx.NodeProto | None) -> str:
    return f"; node {node.name!r} ({node.op_type}) makes it" if node is not None and node.name else ""


def _kind(dtype: str) -> str:
    return "text (strings)" if np.dtype(dtype).kind in "OUS" else f"of type {dtype}"


def _check_type(src: Path, name: str, dtype: np.dtype, node: onnx.NodeProto | None) -> None:
    if dtype.name in TRITON_DTYPES:
        return
    raise SliceError(f"{src.name}: output {name!r} is {_kind(dtype.name)}{_by(node)}, which the dvabatch backend "
                     "does not serve: end the model before it (drop it from the graph's outputs) and make it in "
                     "the client")


def _run(session, src: Path, specs: Sequence[TensorSpec], rows: int, sizes: Mapping[str, int]) -> list:
    try:
        return session.run(None, sample_inputs(specs, rows, sizes))
    except Exception as exc:
        if runtime_refused(exc):
            raise SliceError(f"ONNX Runtime cannot run {src} on {rows} row(s) of random inputs at sizes "
                             f"{dict(sizes) or 'as declared'}: {first_line(exc, src)}") from None
        raise


def _runs(session, specs: Sequence[TensorSpec], sizes: Mapping[str, int]) -> str | None:
    """None where one row at ``sizes`` runs, else ONNX Runtime's reason."""
    try:
        session.run(None, sample_inputs(specs, 1, sizes))
        return None
    except Exception as exc:
        if runtime_refused(exc):
            return str(exc)
        raise


def _largest_length(session, src: Path, specs: Sequence[TensorSpec], axis: str | None,
                    lengths: Sequence[int | None], dim_sizes: Mapping[str, int]) -> int | None:
    """The first of ``lengths``, once every one of them was seen to run; else the refusal names
    the largest length the model takes (by bisection below the first that failed)."""
    if axis is None:
        return None
    good = 0
    for length in lengths:
        reason = _runs(session, specs, sizes_at(dim_sizes, axis, length))
        if reason is None:
            good = length
            continue
        low, high = good, length  # low runs (or is 0), high fails for ``reason``
        while high - low > 1:
            middle = (low + high) // 2
            failed = _runs(session, specs, sizes_at(dim_sizes, axis, middle))
            if failed is None:
                low = middle
            else:
                high, reason = middle, failed
        if low == 0:
            raise SliceError(f"ONNX Runtime cannot run {src} on one row of random inputs at any {axis!r} up to "
                             f"{length}: {first_line(RuntimeError(reason), src)}")
        asked = ",".join(str(v) for v in lengths)
        kept = ",".join(str(v) for v in [*(v for v in lengths if v < low), low])
        raise SliceError(f"--lengths {asked}: {src.name} takes at most {low} along {axis!r} (at {high}: "
                         f"{first_line(RuntimeError(reason), src)}); give --lengths up to {low}, e.g. {kept}")
    return lengths[0]
