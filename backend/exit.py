"""The exit: answers leave the pipeline from threads of their own."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np

from .query import Query

ANSWERING_THREADS = 4


class Exit:
    """Answers queries off the last stage's thread, from ``ANSWERING_THREADS`` threads. A response
    sent through its response sender is a round trip to Triton's process that blocks the sending
    thread (the GIL released), often longer than a cheap stage computes: the last stage must not
    wait for it, and one thread sending one answer after another becomes a queue. Answers are
    copies, never views of buffers a later batch may overwrite."""

    def __init__(self, threads: int = ANSWERING_THREADS):
        self._answers: queue.SimpleQueue[tuple[Query, dict[str, np.ndarray]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"dvabatch-exit-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def answer(self, query: Query, outputs: dict[str, np.ndarray]) -> None:
        self._answers.put((query, {name: np.array(array) for name, array in outputs.items()}))

    def _run(self) -> None:
        while (item := self._answers.get()) is not None:
            query, outputs = item
            query.answer(outputs)

    def close(self, timeout: float) -> None:
        for _ in self._threads:
            self._answers.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0))
