"""Random inputs shaped like a model's interface, at the batch sizes a model is profiled for: for
probing, verifying and timing stages, and for capturing their CUDA graphs at load."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from .manifest import TensorSpec

# The shapes named tensors take when the source model runs (rows, named axis sizes): what a
# target needs of a stage whose inputs have axes that vary with the length axis (TensorRT's
# optimization profile).
Probe = Callable[[Sequence[str], int, Mapping[str, int]], dict[str, tuple[int, ...]]]

# Size of a dynamic axis (other than the batch axis) that nobody named a size for.
DEFAULT_DIM_SIZE = 8


def batch_sizes_up_to(maximum: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``maximum``, then ``maximum`` itself."""
    sizes, size = [], 1
    while size < maximum:
        sizes.append(size)
        size *= 2
    return (*sizes, maximum)


def sizes_at(dim_sizes: Mapping[str, int], axis: str | None, length: int | None) -> dict[str, int]:
    """Named axis sizes with the length ``axis`` (if any) at ``length``."""
    return {**dim_sizes, **({axis: length} if axis else {})}


def concrete_shape(spec: TensorSpec, batch: int, sizes: Mapping[str, int], default: int) -> tuple[int, ...]:
    """The shape of ``batch`` rows, with named dynamic axes from ``sizes`` and others ``default``."""
    dims = [d if isinstance(d, int) and d >= 0 else sizes.get(str(d), default) for d in spec.dims]
    return (batch, *dims)


def sample_inputs(specs: Iterable[TensorSpec], batch: int, sizes: Mapping[str, int] | None = None,
                  default: int = DEFAULT_DIM_SIZE, seed: int = 0) -> dict[str, np.ndarray]:
    """Floats from a normal distribution; integers and booleans in {0, 1}.

    Integers stay in {0, 1} so that token ids, masks and segment ids are valid for any
    vocabulary size.
    """
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in specs:
        shape = concrete_shape(spec, batch, sizes or {}, default)
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            feed[spec.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feed[spec.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feed


def feed_at(specs: Iterable[TensorSpec], batch: int, length: int | None, axis: str | None,
            dim_sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """``batch`` rows with the length ``axis`` (if any) at ``length``: what the slicer's targets
    profile a configuration on."""
    return sample_inputs(specs, batch, sizes_at(dim_sizes, axis, length), seed=batch)
