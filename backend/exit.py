"""The exit: answers leave the pipeline from threads of their own."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from .query import Query

ANSWERING_THREADS = 4


class Exit:
    """Answers queries off the last stage's thread, from ``ANSWERING_THREADS`` threads. A response
    sent through its response sender is a round trip to Triton's process that blocks the sending
    thread (the GIL released), often longer than a cheap stage computes: the last stage must not
    wait for it, and one thread sending one answer after another becomes a queue (the forced
    pipeline at TensorRT speed, 16 and 64 in flight on 2 cores, ``tools.bench_cost``: 0.45x-0.54x
    the plain model's answers with one thread, 0.70x-0.90x with four, no more with eight). The
    answers handed over are the caller's to keep: never views of buffers a later batch may
    overwrite (``Runtime.leave`` copies each output once an item). ``sent`` hears each answer's
    seconds from its query's arrival in ``execute`` to its send returning: a pipelined query's
    latency inside the model, answered after its ``execute`` returned."""

    def __init__(self, sent: Callable[[float], None], threads: int = ANSWERING_THREADS):
        self._sent = sent
        self._answers: queue.SimpleQueue[tuple[Query, dict[str, np.ndarray]] | None] = queue.SimpleQueue()
        self._pending = 0  # answers handed over and not yet sent
        self._settled = threading.Condition()
        self._threads = [threading.Thread(target=self._run, name=f"dvabatch-exit-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def answer(self, query: Query, outputs: dict[str, np.ndarray]) -> None:
        with self._settled:
            self._pending += 1
        self._answers.put((query, outputs))

    @property
    def pending(self) -> int:
        return self._pending

    def wait_sent(self, timeout: float) -> bool:
        """Whether every answer handed over has been sent, waiting at most ``timeout``."""
        with self._settled:
            return self._settled.wait_for(lambda: not self._pending, timeout)

    def _run(self) -> None:
        while (item := self._answers.get()) is not None:
            query, outputs = item
            if query.answer(outputs):  # ... not where a failure beside it answered it first
                self._sent(time.monotonic() - query.arrived)
            with self._settled:
                self._pending -= 1
                if not self._pending:
                    self._settled.notify_all()

    def close(self, timeout: float) -> None:
        for _ in self._threads:
            self._answers.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
