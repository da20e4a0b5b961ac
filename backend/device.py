"""Where stage buffers live and how executors order their work on them.

The executors only talk to a ``Device``: allocate buffer tensors, move rows in and out, and
order launches across executors. On the CPU an executor's work is done when its call returns,
so streams and events are nothing. On CUDA (torch) every executor has its own stream and every
buffer its own event: after launching work that touches a buffer the executor records the
buffer's event on its stream, and the next executor to touch the buffer makes its own stream
wait on that event, so the data hand-over needs no host wait. The host does wait for each
stage's launches to finish (``finish``) before the scheduler updates the batch table, as the
paper's prototype synchronizes once per stage: otherwise the host runs ahead of the GPU, every
batch looks finished the moment it is launched, and stretch, split and the load policies
decide on a pipeline that is not the one running. Two executors overlap that wait with each
other's work.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from .buffers import Buffer


class Device(Protocol):
    name: str

    def stream(self) -> Any: ...
    def event(self) -> Any: ...
    def running_on(self, stream: Any) -> contextlib.AbstractContextManager: ...
    def after(self, event: Any, stream: Any) -> None: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def finish(self, stream: Any) -> None: ...
    def from_host(self, array: np.ndarray) -> Any: ...
    def to_host(self, tensor: Any) -> np.ndarray: ...
    def rows(self, buffer: Buffer, name: str, like: Any, capacity: int) -> Any: ...


class CpuDevice:
    """Host memory; work is finished when the call returns."""

    name = "cpu"

    def stream(self) -> None:
        return None

    def event(self) -> None:
        return None

    @contextlib.contextmanager
    def running_on(self, stream: None) -> Iterator[None]:
        yield

    def after(self, event: None, stream: None) -> None:
        pass

    def record(self, event: None, stream: None) -> None:
        pass

    def finish(self, stream: None) -> None:
        pass

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, tensor: np.ndarray) -> np.ndarray:
        return tensor

    def rows(self, buffer: Buffer, name: str, like: np.ndarray, capacity: int) -> np.ndarray:
        return _view(buffer, name, like, capacity, lambda size: np.empty(size, like.dtype))


class CudaDevice:
    """One CUDA device through torch: a stream per executor, an event per buffer."""

    def __init__(self, index: int = 0):
        try:
            import torch
        except ImportError as exc:
            raise RuntimeError("the CUDA device needs torch with CUDA (pip install torch)") from exc
        if not torch.cuda.is_available():
            raise RuntimeError("the CUDA device needs a GPU, and torch sees none")
        self._torch = torch
        self.device = torch.device("cuda", index)
        self.name = str(self.device)

    def stream(self) -> Any:
        return self._torch.cuda.Stream(device=self.device)

    def event(self) -> Any:
        return self._torch.cuda.Event()

    def running_on(self, stream: Any) -> contextlib.AbstractContextManager:
        return self._torch.cuda.stream(stream)

    def after(self, event: Any, stream: Any) -> None:
        stream.wait_event(event)  # a no-op for an event never recorded

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def finish(self, stream: Any) -> None:
        stream.synchronize()

    def from_host(self, array: np.ndarray) -> Any:
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=False)

    def to_host(self, tensor: Any) -> np.ndarray:
        self._torch.cuda.current_stream(self.device).synchronize()  # rows leave for the client here
        return tensor.cpu().numpy()

    def rows(self, buffer: Buffer, name: str, like: Any, capacity: int) -> Any:
        return _view(buffer, name, like, capacity,
                     lambda size: self._torch.empty(size, dtype=like.dtype, device=self.device))


def _view(buffer: Buffer, name: str, like: Any, capacity: int, allocate: Callable[[int], Any]) -> Any:
    """The buffer's tensor ``name``: ``capacity`` rows shaped like ``like``'s rows, a view of
    storage that only grows, so that lengths varying from batch to batch reuse one allocation
    (the largest so far) instead of allocating per batch."""
    shape = (capacity, *like.shape[1:])
    current = buffer.tensors.get(name)
    if current is not None and tuple(current.shape) == shape and current.dtype == like.dtype:
        return current
    size = math.prod(shape)
    storage = buffer.storage.get(name)
    if storage is None or storage.dtype != like.dtype or len(storage) < size:
        storage = buffer.storage[name] = allocate(size)
    buffer.tensors[name] = storage[:size].reshape(shape)
    return buffer.tensors[name]


def make_device(kind: str, index: int = 0) -> Device:
    """The device for Triton's instance kind (``CPU`` or ``GPU``)."""
    if kind.upper() in ("CPU", "KIND_CPU", "MODEL"):
        return CpuDevice()
    if kind.upper() in ("GPU", "KIND_GPU"):
        return CudaDevice(index)
    raise ValueError(f"instance kind {kind!r} is not CPU or GPU")
