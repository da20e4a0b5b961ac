"""Padding along named axes: how queries of different lengths share one batch.

A named dim (for example ``"sequence"`` on ``input_ids`` and ``attention_mask``) may differ from
query to query. Queries batched together are padded at the end of that axis to the batch's size
with the input's pad value (0 unless config.pbtxt says otherwise: right for token ids and
attention masks), and each query's outputs along the same axis are cut back to its own size.
Used by the pipeline (Policy I batches) and by single-entry serving (ragged baselines) alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .manifest import TensorSpec


def named_sizes(specs: Sequence[TensorSpec], inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The size of every named axis in one query's inputs (validation made them agree)."""
    return {dim: inputs[spec.name].shape[axis] for spec in specs
            for axis, dim in enumerate(spec.dims, start=1) if isinstance(dim, str)}


def pad(array: np.ndarray, spec: TensorSpec, sizes: Mapping[str, int], value: float = 0) -> np.ndarray:
    """``array`` padded at the end of each named axis in ``sizes`` to that size; itself when
    nothing is missing."""
    widths = [(0, 0)] + [(0, sizes[dim] - size) if isinstance(dim, str) and dim in sizes else (0, 0)
                         for dim, size in zip(spec.dims, array.shape[1:])]
    return np.pad(array, widths, constant_values=value) if any(after for _, after in widths) else array


def cut(array: np.ndarray, spec: TensorSpec, own: Mapping[str, int]) -> np.ndarray:
    """``array`` cut back along each named axis to a query's ``own`` sizes."""
    if not any(isinstance(dim, str) and dim in own for dim in spec.dims):
        return array
    index = (slice(None),) + tuple(slice(0, own[dim]) if isinstance(dim, str) and dim in own else slice(None)
                                   for dim in spec.dims)
    return array[index]
