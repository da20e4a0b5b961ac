"""Where stage buffers live and how executors order their work on them.

The executors only talk to a ``Device``: allocate buffer tensors, move rows in and out, and
order launches across executors. On the CPU an engine's work is done when its call returns, so
events are nothing, and a stream only holds the time until which a timed engine's simulated
work keeps it busy (``busy``), as a GPU's stream runs ahead of the host: ``finish`` waits that
out. On CUDA (torch) every executor has its own stream and every
buffer its own event: after launching work that touches a buffer the executor records the
buffer's event on its stream, and the next executor to touch the buffer makes its own stream
wait on that event, so the data hand-over needs no host wait. The host does wait for each
stage's launches to finish (``finish``) before the scheduler updates the batch table, as the
paper's prototype synchronizes once per stage: otherwise the host runs ahead of the GPU, every
batch looks finished the moment it is launched, and stretch, split and the load policies
decide on a pipeline that is not the one running. Two executors overlap that wait with each
other's work. Rows leave for the host through ``copy_out``, which does not wait: a model served
inside ``execute`` builds its responses on them while the device still computes
(``whole.WholeBatch``), what a plain model that waits for its engine first cannot do.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .nvml import NvmlError, energy_counter


class Device(Protocol):
    name: str
    gpu: str  # the GPU's name, "" on the CPU (``host.Machine``)
    # Seconds host threads have spent waiting for the device so far: CUDA spins while it waits
    # (one context on a many-core host), which a process's CPU time then counts as serving work
    # (``calibrate.host_cpu_s`` takes it out). A CPU device's waits sleep: 0.
    waited_s: float

    def stream(self) -> Any: ...
    def event(self) -> Any: ...
    def running_on(self, stream: Any) -> contextlib.AbstractContextManager: ...
    def after(self, event: Any, stream: Any) -> None: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def finish(self, stream: Any) -> None: ...
    def from_host(self, array: np.ndarray) -> Any: ...
    def copy_out(self, tensor: Any) -> np.ndarray: ...
    def to_host(self, tensor: Any) -> np.ndarray: ...
    def busy(self, seconds: float) -> None: ...
    def empty(self, size: int, like: Any) -> Any: ...
    def energy_counter(self) -> Callable[[], float]: ...


_THREAD = threading.local()  # the CPU stream each host thread runs on, whichever CpuDevice it is given


def _current() -> CpuStream:
    """The calling thread's CPU stream (one of its own until it runs on another)."""
    stream = getattr(_THREAD, "stream", None)
    if stream is None:
        stream = _THREAD.stream = CpuStream()
    return stream


class _RunningOn:
    """The calling thread runs on ``stream`` inside ``with`` (a class, not a generator: it is
    entered once per ``execute`` and per stage item, and costs a third as much)."""

    __slots__ = ("_stream", "_before")

    def __init__(self, stream: CpuStream):
        self._stream = stream

    def __enter__(self) -> None:
        self._before = getattr(_THREAD, "stream", None)
        _THREAD.stream = self._stream

    def __exit__(self, *_: object) -> None:
        _THREAD.stream = self._before


@dataclass(eq=False)
class CpuStream:
    """A host thread's stream: busy until ``due`` (``time.monotonic()``) with a timed engine's work."""

    due: float = 0.0


class CpuDevice:
    """Host memory; an engine's work is finished when its call returns, a timed engine's when
    its stream's ``due`` has passed."""

    name = "cpu"
    gpu = ""  # (``host.Machine``)
    waited_s = 0.0

    def stream(self) -> CpuStream:
        return CpuStream()

    def event(self) -> None:
        return None

    def running_on(self, stream: CpuStream) -> _RunningOn:
        return _RunningOn(stream)

    def after(self, event: None, stream: CpuStream) -> None:
        pass

    def record(self, event: None, stream: CpuStream) -> None:
        pass

    def finish(self, stream: CpuStream) -> None:
        left = stream.due - time.monotonic()
        if left > 0:
            time.sleep(left)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def copy_out(self, tensor: np.ndarray) -> np.ndarray:
        """The rows, in host memory already (complete once the current stream is finished)."""
        return tensor

    def to_host(self, tensor: np.ndarray) -> np.ndarray:
        """The rows, once the current stream's work is done."""
        self.finish(_current())
        return tensor

    def busy(self, seconds: float) -> None:
        """Keep the current stream busy ``seconds`` after the work already on it (a timed
        engine's simulated compute; the host goes on meanwhile)."""
        stream = _current()
        stream.due = max(time.monotonic(), stream.due) + seconds

    def empty(self, size: int, like: np.ndarray) -> np.ndarray:
        """``size`` elements of ``like``'s type (a buffer's storage, ``Buffer.rows``)."""
        return np.empty(size, like.dtype)

    def energy_counter(self) -> Callable[[], float]:
        """The energy used so far, in joules (``nvml.py``): a CPU instance has no counter."""
        raise NvmlError("a CPU instance has no energy counter")


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
        self.gpu = torch.cuda.get_device_name(self.device)  # what its stages' times hold for (``host.Machine``)
        self._cycles_per_second: float | None = None
        self.waited_s = 0.0
        self._waits = threading.Lock()

    def _waited(self, since: float) -> None:
        took = time.perf_counter() - since
        with self._waits:
            self.waited_s += took

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
        began = time.perf_counter()
        stream.synchronize()
        self._waited(began)

    def from_host(self, array: np.ndarray) -> Any:
        """The rows on the device: staged through pinned memory (torch's caching host allocator,
        which reuses a block only once the copy that read it is done) and copied on the current
        stream without the host waiting; a pageable copy would wait for the stream's work first."""
        torch = self._torch
        host = torch.from_numpy(np.ascontiguousarray(array))
        staged = torch.empty(host.shape, dtype=host.dtype, pin_memory=True)
        staged.copy_(host)
        return staged.to(self.device, non_blocking=True)

    def copy_out(self, tensor: Any) -> np.ndarray:
        """A host array that holds ``tensor`` once the current stream is finished: a copy
        queued into pinned memory (torch's caching host allocator reuses it), so the host need
        not wait for the work before it."""
        host = self._torch.empty(tuple(tensor.shape), dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        return host.numpy()

    def to_host(self, tensor: Any) -> np.ndarray:
        """The rows, once the current stream's work is done (they leave for the client here)."""
        host = self.copy_out(tensor)
        began = time.perf_counter()
        self._torch.cuda.current_stream(self.device).synchronize()
        self._waited(began)
        return host

    def busy(self, seconds: float) -> None:
        """Keep the current stream busy for ``seconds`` without the host waiting (a timed
        engine's simulated compute): a spinning kernel, its clock rate measured once."""
        if self._cycles_per_second is None:
            torch = self._torch
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cycles = 10_000_000
            torch.cuda._sleep(cycles)  # an idle GPU clocks down (345 against 1980 MHz on an H200): wake it first
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            self._cycles_per_second = cycles / (start.elapsed_time(end) / 1000)
        self._torch.cuda._sleep(int(seconds * self._cycles_per_second))

    def empty(self, size: int, like: Any) -> Any:
        """``size`` elements of ``like``'s type on the device (a buffer's storage, ``Buffer.rows``)."""
        return self._torch.empty(size, dtype=like.dtype, device=self.device)

    def energy_counter(self) -> Callable[[], float]:
        """The energy this GPU has used so far, in joules, from NVML (``nvml.py``)."""
        return energy_counter(str(self._torch.cuda.get_device_properties(self.device).uuid))


def make_device(kind: str, index: int = 0) -> Device:
    """The device for Triton's instance kind (``CPU`` or ``GPU``)."""
    if kind.upper() in ("CPU", "KIND_CPU", "MODEL"):
        return CpuDevice()
    if kind.upper() in ("GPU", "KIND_GPU"):
        return CudaDevice(index)
    raise ValueError(f"instance kind {kind!r} is not CPU or GPU")
