"""Buffers between stages and the legitimacy rule that keeps them hazard-free (paper, section 6.1).

Executor ``i`` writes its outputs into one buffer of boundary ``i`` and executor ``i+1`` reads
them from there, so a buffer is the output half of executor ``i``'s buffer pair and the input half
of executor ``i+1``'s. A boundary has as many buffers as the model has buffer pairs.

A buffer is in one of four states:

- ``AVAILABLE``: no executor uses it and nothing in it is still needed; the producer may write it.
- ``INWRITING``: the producer is writing a batch's rows into it.
- ``INREADING``: the consumer is reading rows from it.
- ``INVALID``: it holds rows that must not be overwritten: rows queued for the consumer, rows a
  batch keeps there while its late (stretched) queries catch up, or rows the consumer has read
  but not yet released. It cannot be claimed as a fresh output buffer.

A pair is *legitimate* for a batch when its input buffer holds that batch's finished rows
(``INVALID``, not being written) and its output buffer is ``AVAILABLE``, or is the buffer where the
same batch already keeps rows at this boundary (a stretch merge writes the late rows beside them).

Rows read by the consumer become ``AVAILABLE`` only when the consumer *releases* its input
boundary, which it does when it re-enters the active state (it holds a legitimate output buffer
again). With one buffer pair that makes a batch travel the whole pipeline before the first
stage may start the next one (the serial manner); with two or more, stages overlap (the
parallel manner). That ordering is the point of the paper's Figure 11.

On a GPU each buffer also carries the device event recorded after the last launch that touched
it; whoever touches it next makes its own stream wait on that event (see ``device.py``).
This module is pure bookkeeping: no Triton, no CUDA.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class BufferState(Enum):
    AVAILABLE = "available"
    INVALID = "invalid"
    INREADING = "inreading"
    INWRITING = "inwriting"


@dataclass(eq=False)
class Buffer:
    """One buffer: its state, how many batch queue items (or held batches) still need its rows,
    its device tensors (``max_batch_size`` rows each, views of ``storage``), its device event,
    and when it last became available (``freed``, a boundary-wide count)."""

    index: int
    state: BufferState = BufferState.AVAILABLE
    claims: int = 0
    tensors: dict[str, Any] = field(default_factory=dict)
    storage: dict[str, Any] = field(default_factory=dict)  # flat, grown to the largest shape so far
    event: Any = None
    freed: int = 0

    def rows(self, name: str, like: Any, capacity: int, empty: Callable[[int, Any], Any]) -> Any:
        """The tensor ``name``: ``capacity`` rows shaped like ``like``'s rows, a view of storage
        that only grows (``empty(size, like)`` makes it: ``Device.empty``), so that lengths
        varying from batch to batch reuse one allocation (the largest so far) instead of
        allocating per batch."""
        shape = (capacity, *like.shape[1:])
        current = self.tensors.get(name)
        if current is not None and tuple(current.shape) == shape and current.dtype == like.dtype:
            return current
        size = math.prod(shape)
        storage = self.storage.get(name)
        if storage is None or storage.dtype != like.dtype or len(storage) < size:
            storage = self.storage[name] = empty(size, like)
        self.tensors[name] = storage[:size].reshape(shape)
        return self.tensors[name]


class Boundary:
    """The buffers between executor ``producer`` and executor ``producer + 1``."""

    def __init__(self, producer: int, buffer_pairs: int, event_factory=lambda: None):
        if buffer_pairs < 1:
            raise ValueError(f"buffer_pairs must be at least 1, got {buffer_pairs}")
        self.producer = producer
        self.buffers = [Buffer(i, event=event_factory()) for i in range(buffer_pairs)]
        self._changed = threading.Condition()
        self._closed = False
        self._frees = 0

    def states(self) -> list[BufferState]:
        with self._changed:
            return [b.state for b in self.buffers]

    def has_available(self) -> bool:
        with self._changed:
            return any(b.state is BufferState.AVAILABLE for b in self.buffers)

    def wait_available(self) -> bool:
        """Block until some buffer is available (the producer may go active); False once closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or any(
                b.state is BufferState.AVAILABLE for b in self.buffers))
            return not self._closed

    def claim_output(self, keep: int | None) -> Buffer:
        """The producer's output buffer for a batch: ``keep`` (where the batch already keeps rows
        at this boundary) or an available one. Raises if the pair would not be legitimate."""
        with self._changed:
            if keep is not None:
                buffer = self.buffers[keep]
                if buffer.state is not BufferState.INVALID or buffer.claims < 1:
                    raise RuntimeError(f"buffer {keep} of boundary {self.producer} keeps no rows ({buffer.state})")
            else:
                # The one available longest: on a GPU the host frees a buffer when the reads are
                # launched, and its event is likelier done the longer ago that was.
                available = [b for b in self.buffers if b.state is BufferState.AVAILABLE]
                if not available:
                    raise RuntimeError(f"no available buffer at boundary {self.producer}")
                buffer = min(available, key=lambda b: b.freed)
            buffer.state = BufferState.INWRITING
            return buffer

    def written(self, buffer: Buffer, claims: int) -> None:
        """The producer launched its writes; ``claims`` more items will read them (several for the
        parts of a split, one for rows held while late rows catch up, none for late rows written
        beside held ones)."""
        with self._changed:
            self._expect(buffer, BufferState.INWRITING)
            buffer.claims += claims
            buffer.state = BufferState.INVALID

    def start_reading(self, index: int) -> Buffer:
        with self._changed:
            buffer = self.buffers[index]
            self._expect(buffer, BufferState.INVALID)
            if buffer.claims < 1:
                raise RuntimeError(f"buffer {index} of boundary {self.producer} has no rows to read")
            buffer.state = BufferState.INREADING
            return buffer

    def done_reading(self, buffer: Buffer) -> None:
        """The consumer launched its reads. The buffer stays invalid until ``release``."""
        with self._changed:
            self._expect(buffer, BufferState.INREADING)
            buffer.claims -= 1
            buffer.state = BufferState.INVALID

    def drop(self, index: int) -> None:
        """Rows queued or kept in buffer ``index`` will never be read (their batch failed): one
        claim fewer. A buffer nobody needs any more is available at once (the consumer never
        read those rows, so no release of its is due); one being written or read keeps its
        state, and ``abandon`` or ``done_reading`` settles it."""
        with self._changed:
            buffer = self.buffers[index]
            if buffer.claims < 1:
                raise RuntimeError(f"buffer {index} of boundary {self.producer} has no claim to drop")
            buffer.claims -= 1
            if buffer.claims == 0 and buffer.state is BufferState.INVALID:
                self._free(buffer)
            self._changed.notify_all()

    def abandon(self, buffer: Buffer) -> None:
        """The producer will not finish writing ``buffer``: back to what it was (rows kept there
        for late ones stay kept)."""
        with self._changed:
            self._expect(buffer, BufferState.INWRITING)
            if buffer.claims > 0:
                buffer.state = BufferState.INVALID
            else:
                self._free(buffer)
            self._changed.notify_all()

    def release(self) -> None:
        """The consumer re-entered active: buffers whose rows nobody needs become available."""
        with self._changed:
            for buffer in self.buffers:
                if buffer.state is BufferState.INVALID and buffer.claims == 0:
                    self._free(buffer)
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _free(self, buffer: Buffer) -> None:
        self._frees += 1
        buffer.state, buffer.freed = BufferState.AVAILABLE, self._frees

    def _expect(self, buffer: Buffer, state: BufferState) -> None:
        if buffer.state is not state:
            raise RuntimeError(f"buffer {buffer.index} of boundary {self.producer} is {buffer.state.value}, "
                               f"expected {state.value}")
