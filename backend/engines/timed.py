"""The ``timed`` engine: computes nothing and keeps the stream busy as long as the stage's latency
table predicts for the batch (``Device.busy``: CUDA, a spinning kernel; CPU, the time ``finish``
waits out), so a schedule can be tested exactly and a GPU we do not have simulated; like a GPU's
work, it runs while the host goes on. Its outputs are its inputs, in order: a timed model answers
every query with its own rows.

An input named ``work`` (``work_out`` after the first stage; float32, one value a row) makes the
time input-dependent, as an early-exit model's is: a batch takes its table's time times its
largest row's ``work`` (a row that leaves early needs less; the batch runs until its slowest
row is done). The client sets it; the scheduler does not know it (``policy: slo`` learns its
distribution)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..device import CpuDevice, Device
from ..manifest import StageSpec
from .base import Tensors

WORK = ("work", "work_out")  # the input scaling a batch's time (the first stage's name, the later ones')


class TimedEngine:
    """Keeps the stream busy for the stage's tabulated latency and passes its inputs through as
    its outputs."""

    def __init__(self, stage: StageSpec, device: Device):
        if stage.latency is None:
            raise ValueError(f"stage {stage.index}: a timed stage needs a 'latency' table")
        if [(t.dtype, t.dims) for t in stage.inputs] != [(t.dtype, t.dims) for t in stage.outputs]:
            raise ValueError(f"stage {stage.index}: a timed stage's outputs must match its inputs one to one")
        self._table = stage.latency
        self._names = [(i.name, o.name) for i, o in zip(stage.inputs, stage.outputs)]
        self._length = _length_axis(stage)
        self._device = device
        # Its outputs are copies, as an engine's are its own buffers (numpy on a CPU instance, torch on a GPU),
        # made without a test per tensor: on a model served plain this engine runs once per stage and batch.
        self._copy = np.ndarray.copy if isinstance(device, CpuDevice) else _clone
        self._work = next((i.name for i in stage.inputs if i.name in WORK), None)
        device.busy(0)  # (on a GPU, its clock is measured now, not during the first batch)
        # Seconds by (rows, length), read once from the table: a simulated engine must cost the
        # host no more than the plain model's simulator, which indexes a dense table.
        self._seconds: dict[tuple[int, int | None], float] = {}

    def names(self) -> tuple[list[str], list[str]]:
        return [i for i, _ in self._names], [o for _, o in self._names]

    def run(self, inputs: Mapping[str, Any]) -> Tensors:
        first = inputs[self._names[0][0]]
        key = (first.shape[0], first.shape[self._length] if self._length is not None else None)
        seconds = self._seconds.get(key)
        if seconds is None:
            seconds = self._seconds[key] = self._table.predict(*key) / 1000
        if self._work is not None:
            seconds *= max(float(inputs[self._work].max()), 0.0)
        self._device.busy(seconds)
        copy = self._copy
        return {out: copy(inputs[src]) for src, out in self._names}


def _length_axis(stage: StageSpec) -> int | None:
    axis = stage.latency.axis
    if axis is None:
        return None
    if axis not in stage.inputs[0].dims:
        raise ValueError(f"stage {stage.index}: latency axis {axis!r} is not a dim of input '{stage.inputs[0].name}'")
    return 1 + stage.inputs[0].dims.index(axis)


def _clone(tensor: Any) -> Any:
    return tensor.clone()
