"""Whether a model's config.pbtxt agrees with the model it serves, checked when it loads.

Triton takes config.pbtxt's ``input``, ``output`` and ``max_batch_size`` on trust from a Python
model: it admits requests by them and prunes each response to the outputs they name. Where they
disagree with what the slicer wrote (``manifest.json``) the model loads and then costs every
request: an input of the wrong type or size is refused one request at a time, and an output
named in config.pbtxt that the model does not produce is silently left out of every answer.
So the load fails instead, naming each disagreement. Stricter than the model is allowed: a
fixed size where the model's varies, a subset of its outputs. Looser is allowed where the
backend refuses per request what the model cannot take (-1 for a fixed size).

Nothing here imports Triton: ``config`` is the model configuration as Triton hands it to
``initialize`` (its JSON, parsed).
"""

from __future__ import annotations

from collections.abc import Sequence

from .manifest import Manifest, TensorSpec

# The numpy dtypes the backend serves, by the name config.pbtxt gives each.
TRITON_DTYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}


class InterfaceError(ValueError):
    """config.pbtxt disagrees with the sliced model; the message lists every disagreement."""


def check(config: dict, manifest: Manifest) -> None:
    """Raise ``InterfaceError`` where ``config`` would cost requests (see the module's doc)."""
    found = _batch_size(config, manifest.max_batch_size)
    found += _tensors("input", config.get("input", []), manifest.inputs, every=True)
    found += _tensors("output", config.get("output", []), manifest.outputs, every=False)
    if found:
        raise InterfaceError("config.pbtxt disagrees with the sliced model (manifest.json): " + "; ".join(found))


def _batch_size(config: dict, sliced: int) -> list[str]:
    batch = int(config.get("max_batch_size", 0))
    if batch > sliced:
        return [f"max_batch_size {batch} exceeds the {sliced} the model was sliced for"]
    if batch < 1:  # else it loads and refuses every request: Triton drops the batch axis from each
        return [f"max_batch_size {batch} turns batching off and takes the batch axis out of every request; "
                f"the dvabatch backend batches along it: set it from 1 to {sliced}"]
    return []


def _tensors(kind: str, listed: Sequence[dict], specs: Sequence[TensorSpec], every: bool) -> list[str]:
    """What is wrong with config.pbtxt's ``kind`` list against the model's ``specs``; with
    ``every``, each of the model's tensors must be listed (an input the model needs)."""
    found = []
    by_name = {spec.name: spec for spec in specs}
    names = [str(entry.get("name")) for entry in listed]
    for entry, name in zip(listed, names):
        spec = by_name.get(name)
        if spec is None:
            found.append(f"{kind} '{name}' is not one of the model's {kind}s ({', '.join(by_name)})")
            continue
        declared, served = entry.get("data_type"), TRITON_DTYPES.get(spec.dtype, spec.dtype)
        if declared != served:
            found.append(f"{kind} '{name}' has data_type {declared}, the model's is {served}")
        dims = _dims(entry)
        if not _fits(dims, spec.dims):
            found.append(f"{kind} '{name}' has dims {list(dims)}, the model's are "
                         f"{[d if isinstance(d, int) else -1 for d in spec.dims]} (-1: any size)")
    if every:
        missing = [name for name in by_name if name not in names]
        if missing:
            found.append(f"config.pbtxt lists no {kind} {', '.join(missing)}, which the model needs")
    return found


def _dims(entry: dict) -> tuple[int, ...]:
    """The dims a request's tensor has by the time the backend reads it: ``reshape``'s where
    config.pbtxt has one (Triton reshapes before ``execute``)."""
    reshape = entry.get("reshape")
    dims = reshape.get("shape", []) if isinstance(reshape, dict) else entry.get("dims", [])
    return tuple(int(d) for d in dims)


def _fits(dims: tuple[int, ...], model: tuple) -> bool:
    """Every size config.pbtxt admits is one the model takes, or a size -1 that the backend
    checks per request."""
    return len(dims) == len(model) and all(d == -1 or not isinstance(m, int) or m in (-1, d)
                                           for d, m in zip(dims, model))
