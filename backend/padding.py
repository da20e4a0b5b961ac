"""Padding along the length axis: how queries of different lengths share one batch.

The model's length axis (for example ``"sequence"`` on ``input_ids`` and ``attention_mask``), a
named dim on which the slicer found that padding leaves a query's answers alike, may differ from
query to query. Queries batched together are padded at the end of that axis to the batch's size
with the input's pad value (0 unless config.pbtxt says otherwise: right for token ids and
attention masks), and each query's outputs along the same axis are cut back to its own size.
Used by the pipeline (Policy I batches) and by single-entry serving (ragged baselines) alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from .manifest import TensorSpec


def length_sizes(specs: Sequence[TensorSpec], inputs: Mapping[str, np.ndarray], axis: str) -> dict[str, int]:
    """The size of the length ``axis`` in one query's inputs (validation made them agree), by
    its name, as a batch's padding reads it. Only that axis is ever padded: the slicer
    names it only where padding a query along it leaves its answers as they were (a mean or a
    recurrence over the axis, without a mask, would read the padding), and any other named axis
    (an image's height, a sequence that cannot be padded) must agree exactly within a batch."""
    return {dim: inputs[spec.name].shape[at] for spec in specs for at, dim in spec.named if dim == axis}


def stack(arrays: Sequence[np.ndarray], spec: TensorSpec, sizes: Mapping[str, int], value: float = 0) -> np.ndarray:
    """``arrays`` one after another along the batch axis, each padded at the end of each named
    axis in ``sizes`` to that size: one array filled with ``value`` and one copy of each (padding
    each with ``np.pad`` and concatenating cost a plain model a fifth of its peak). Arrays that
    need no padding (no ``sizes``, or each already of them) are concatenated as they are."""
    first = arrays[0]
    if not sizes:
        return first if len(arrays) == 1 else np.concatenate(arrays)
    padded = list(first.shape)
    for axis, dim in spec.named:
        padded[axis] = sizes.get(dim, padded[axis])
    shape = tuple(padded[1:])
    if all(a.shape[1:] == shape for a in arrays):
        return first if len(arrays) == 1 else np.concatenate(arrays)
    rows = sum(map(len, arrays))
    # zeros (the usual pad value) come from calloc, a fill costs a pass more
    out = np.zeros((rows, *shape), first.dtype) if value == 0 else np.full((rows, *shape), value, first.dtype)
    row = 0
    if len(spec.named) == 1 and spec.named[0][0] == 1:  # text, [batch, sequence, ...]: the plainest index is fastest
        for array in arrays:
            end = row + array.shape[0]
            out[row:end, :array.shape[1]] = array
            row = end
        return out
    for array in arrays:
        out[(slice(row, row + len(array)), *map(slice, array.shape[1:]))] = array
        row += len(array)
    return out


@dataclass(frozen=True)
class Buckets:
    """The sizes a batch's named axes are padded up to before it enters the stages: the lengths
    their CUDA graphs were captured for (``engines.graph_buckets``), so every stage sees one of
    them; a size past every bucket stays as it is (those stages then run eagerly). Without
    buckets a batch is padded to its longest query only."""

    sizes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def pad(self, sizes: Mapping[str, int]) -> Mapping[str, int]:
        if not self.sizes:
            return sizes
        return {name: next((b for b in self.sizes.get(name, ()) if b >= size), size) for name, size in sizes.items()}


Layout = tuple[tuple[int, str], ...]  # a tensor's named axes, ``TensorSpec.named``


def cut(outputs: Iterable[tuple[str, Layout, np.ndarray]], own: Mapping[str, int],
        rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Each output's ``rows`` (name, layout, batch array), cut back along its named axes to a
    query's ``own`` sizes. Outputs laid out alike share one index, worked out once."""
    indexes: dict[Layout, tuple] = {}
    cut_back = {}
    for name, named, array in outputs:
        index = indexes.get(named)
        if index is None:
            index = [rows]
            for axis, dim in named:
                if dim in own:
                    index += [slice(None)] * (axis - len(index))
                    index.append(slice(own[dim]))
            index = indexes[named] = tuple(index)
        cut_back[name] = array[index]
    return cut_back
