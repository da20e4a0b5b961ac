"""config.pbtxt for a sliced model served by the `dvabatch` backend: its interface, its instance
kind, and ``policy: auto`` with a comment naming the diversities the profile found."""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from backend.interface import TRITON_DTYPES
from backend.manifest import Manifest, TensorSpec


# One line of config.pbtxt ``parameters`` as ``render`` writes it: (key, value).
PARAMETER = re.compile(r'^parameters:\s*\{\s*key:\s*"([^"]+)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"\s*\}\s*\}\s*$')


def parameters_of(config_text: str) -> dict[str, str]:
    """The backend's knobs in a config.pbtxt written with one parameter per line."""
    return dict(m.groups() for line in config_text.splitlines() if (m := PARAMETER.match(line.strip())))


def triton_dtype(dtype: str) -> str:
    name = np.dtype(dtype).name
    if name not in TRITON_DTYPES:
        raise ValueError(f"dtype {name} has no Triton equivalent the backend supports")
    return TRITON_DTYPES[name]


def tensor_line(spec: TensorSpec, ragged: bool = False) -> str:
    """One tensor of config.pbtxt's ``input`` or ``output`` list (named and -1 dims vary)."""
    head = f'  {{ name: "{spec.name}" data_type: {triton_dtype(spec.dtype)}'
    if not spec.dims:  # one value per row: Triton wants dims [1], reshaped away
        return head + " dims: [ 1 ] reshape: { shape: [ ] } }"
    dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in spec.dims)
    return head + f" dims: [ {dims} ]" + (" allow_ragged_batch: true" if ragged else "") + " }"


def _found(manifest: Manifest) -> str:
    report = manifest.slicing
    if report is None:
        return ""
    preferred = ", ".join(str(s.preferred_batch_size) for s in manifest.stages)
    return (
        "# policy auto, from the slicer's profile: load diversity (always)"
        + (f", input diversity (axis '{report.length_axis}')" if report.length_axis else "")
        + (f", operator diversity (preferred batch size per stage: {preferred})" if manifest.operator_diversity else "")
        + ".\n"
        + (f"# {report.unpadded[0].upper()}{report.unpadded[1:]}.\n" if report.unpadded else "")
        + (f"# Batching changes answers: {report.coupled}.\n" if report.coupled else "")
    )


def on_gpu(manifest: Manifest) -> bool:
    """Whether the stages compute on a GPU (TensorRT engines, torch stages sliced on CUDA), so
    that the model's instances are GPU ones."""
    return any(s.engine == "tensorrt" for s in manifest.stages) or (
        manifest.slicing is not None and manifest.slicing.device == "cuda")


def render(name: str, manifest: Manifest, parameters: Mapping[str, str] | None = None,
           queue_delay_us: int | None = None, comment: str | None = None) -> str:
    """Triton sees one model with a batch axis on every tensor; the stages are ours to run.

    TensorRT stages run on a GPU instance, ONNX Runtime stages on a CPU one, torch stages where
    they were profiled. ``parameters`` are
    the backend's knobs (README, "Knobs"). ``queue_delay_us`` sets the dynamic batcher's delay.
    Inputs along the model's length axis may differ in length within one of Triton's batches
    (``allow_ragged_batch``): the backend batches them itself (Policy I clusters and pads them; a
    model served as a plain one pads each batch to its longest), and ``execute`` waits for stage
    0 (back-pressure), so a batcher that kept lengths apart would hand over one length per
    ``execute``, a fraction of a plain model's throughput on real text. ``comment`` replaces the
    note on what the slicer found.
    """
    axis = manifest.length_axis
    inputs = ",\n".join(tensor_line(s, axis is not None and axis in s.dims) for s in manifest.inputs)
    outputs = ",\n".join(tensor_line(s) for s in manifest.outputs)
    kind = "KIND_GPU" if on_gpu(manifest) else "KIND_CPU"
    knobs = "".join(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
                    for key, value in (parameters or {}).items())
    batcher = f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}" \
        if queue_delay_us is not None else "dynamic_batching { }"
    note = comment if comment is not None else (_found(manifest) if parameters else "")
    return (
        f'name: "{name}"\n'
        'backend: "dvabatch"\n'
        f"max_batch_size: {manifest.max_batch_size}\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
        f"{batcher}\n"
        "# One instance: the backend runs every stage of the model itself.\n"
        f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"
        + note + knobs
    )


def policy_parameters() -> dict[str, str]:
    """config.pbtxt parameters the slicer writes: ``policy: auto``, which takes the paper's
    policies for the diversities the manifest records (``backend/diversity.py``) and decides
    every meta operation from the stage latency tables at run time."""
    return {"policy": "auto"}
