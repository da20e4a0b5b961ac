"""config.pbtxt for a sliced model served by the `dvabatch` backend."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from backend.manifest import Manifest, TensorSpec

TRITON_DTYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
}


def triton_dtype(dtype: str) -> str:
    name = np.dtype(dtype).name
    if name not in TRITON_DTYPES:
        raise ValueError(f"dtype {name} has no Triton equivalent the backend supports")
    return TRITON_DTYPES[name]


def _tensor(spec: TensorSpec) -> str:
    head = f'  {{ name: "{spec.name}" data_type: {triton_dtype(spec.dtype)}'
    if not spec.dims:  # one value per row: Triton wants dims [1], reshaped away
        return head + " dims: [ 1 ] reshape: { shape: [ ] } }"
    dims = ", ".join(str(d) if isinstance(d, int) else "-1" for d in spec.dims)
    return head + f" dims: [ {dims} ] }}"


def _found(manifest: Manifest) -> str:
    report = manifest.slicing
    if report is None:
        return ""
    preferred = ", ".join(str(s.preferred_batch_size) for s in manifest.stages)
    return (
        "# Policy defaults from the slicer's profile: load diversity (always)"
        + (f", input diversity (axis '{report.length_axis}')" if report.length_axis else "")
        + (f", operator diversity (preferred batch size per stage: {preferred})" if report.operator_diversity else "")
        + ".\n"
    )


def render(name: str, manifest: Manifest, parameters: Mapping[str, str] | None = None) -> str:
    """Triton sees one model with a batch axis on every tensor; the stages are ours to run.

    TensorRT stages run on a GPU instance, ONNX Runtime stages on a CPU one. ``parameters`` are
    the backend's knobs (README, "Knobs").
    """
    inputs = ",\n".join(_tensor(s) for s in manifest.inputs)
    outputs = ",\n".join(_tensor(s) for s in manifest.outputs)
    kind = "KIND_GPU" if any(s.engine == "tensorrt" for s in manifest.stages) else "KIND_CPU"
    knobs = "".join(f'parameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
                    for key, value in (parameters or {}).items())
    return (
        f'name: "{name}"\n'
        'backend: "dvabatch"\n'
        f"max_batch_size: {manifest.max_batch_size}\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
        "dynamic_batching { }\n"
        "# One instance: it runs every stage of the pipeline, each batch on its own rows.\n"
        f"instance_group [ {{ kind: {kind} count: 1 }} ]\n"
        + (_found(manifest) + knobs if parameters else "")
    )
