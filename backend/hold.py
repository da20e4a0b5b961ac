"""Served plain, the queries a policy holds back for more (``Policy.holds``: ``policy: smdp``
weighing power or serving a static size; ``dispatch.py``).

A model served plain runs each batch Triton hands over inside ``execute``, so Triton's batcher
dispatches, and it is work-conserving: a policy that would wait for fuller batches (the SMDP's
control limit, which saves the engines' energy) could not. With a ``Hold``, ``execute`` hands
its requests over instead (their senders answer them later) and returns, and Triton calls it
again with the next ones: each call is the SMDP's decision epoch, an arrival while the server
idles. Once the policy serves (``Policy.hold_until``), every query held runs inside that
``execute``, answered in the list it returns or, held from an earlier call, through their
senders. Where the queries it waits for do not come (the load stopped), a thread of its own runs
them once the policy's wait bound ends. Every query held runs once the policy serves (in
batches of at most the model's largest: ``batches``), also where the SMDP would serve only some
of them: Triton has handed them all over already. A ``Runtime`` holds while its mode switch
serves plain (``Runtime.run_held``); a model served by a ``WholeBatch`` alone (``auto`` stepped
aside on the host's cores) through a ``HeldBatch``. Every held answer is a ``send()``, which
costs the host more than an answer in ``execute``'s list: where the mode switch finds no room
for that at the rate queries arrive, nothing is held (``most_per_s``; ``decide.ModeSwitch.hold_rate``).

Nothing here imports Triton.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from .arrival import Arrivals
from .metrics import IN_FLIGHT, WAITING
from .policy import Policy
from .query import Code, Failure, Judged, Query, Reply, Tensors, refuse_invalid
from .whole import WholeBatch

log = logging.getLogger(__name__)


class Hold:
    """The queries held, oldest first. ``run`` runs a list of them and answers each (inside
    ``execute``, or on the hold's thread once the wait bound ended); ``arrived`` counts queries
    in the arrival rate (by when they arrived) and ``rate`` reads their steady rate, which the
    policy is solved for."""

    def __init__(self, policy: Policy, run: Callable[[list[Query]], None],
                 arrived: Callable[[Iterable[float]], None], rate: Callable[[], float]):
        self._policy, self._run, self._arrived, self._rate = policy, run, arrived, rate
        self._held: list[Query] = []
        self._until = math.inf  # when the held queries run at the latest
        # The arrival rate up to which the host has room for what holding costs it (every held
        # answer a ``send()``): the mode switch says each second (``decide.ModeSwitch.hold_rate``).
        # Faster, none is held: it is read at every ``put``, as the load rises within a second.
        self.most_per_s = math.inf
        self.sent = 0  # queries answered after the ``put`` that held them returned: through their senders
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._bound, name="dvabatch-hold", daemon=True)
        self._thread.start()
        policy.said(f"{policy.name}: served plain, the queries are held back while the policy waits for more, "
                    "and answered through their senders (backend/hold.py)")

    def __len__(self) -> int:
        return len(self._held)

    def put(self, queries: Sequence[Query]) -> None:
        """Hold ``queries`` (validated) after those held before, and run them all now where the
        policy serves that many."""
        if not queries:
            return
        self._arrived(query.arrived for query in queries)
        with self._changed:
            self._held.extend(queries)
            now = time.monotonic()
            until = self._due(now)
            if until <= now:
                self._release(len(queries))
            else:
                self._until = until
                self._changed.notify()

    def take(self) -> list[Query]:
        """Every query held, oldest first, held no longer (the model pipelines again, or its
        pipeline died)."""
        with self._changed:
            held, self._held, self._until = self._held, [], math.inf
            return held

    def close(self) -> list[Query]:
        """Stop the hold's thread; the queries still held are returned."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        self._thread.join()
        return self.take()

    def _due(self, now: float) -> float:
        """When the queries held run, as the policy says (the lock held): now where they arrive
        faster than ``most_per_s``, or the policy fails."""
        rate = self._rate()
        if rate >= self.most_per_s:
            return now
        try:
            return self._policy.hold_until(self._held, rate, now)
        except Exception:  # a policy's bug must not hold queries: they run now
            log.exception("policy %r failed to say how long to hold queries", self._policy.name)
            return now

    def _release(self, arrived: int = 0) -> None:
        """Run every query held (the lock held, so that ``execute`` and the hold's thread never
        run the engines at once); the latest ``arrived`` of them came with the ``put`` running
        them, and are answered in its ``execute``'s list."""
        held, self._held, self._until = self._held, [], math.inf
        if not held:
            return
        self.sent += len(held) - arrived
        try:
            self._run(held)
        except Exception as exc:  # whatever is left unanswered fails, not hangs
            log.exception("running the queries held failed")
            for query in held:
                if not query.answered:
                    query.answer(failure=Failure.of(exc))

    def _bound(self) -> None:
        """Once the wait bound ends, the policy is asked again, as the entry asks when its window
        ends: it counts the waits that ran out (``dispatch.SmdpPolicy``), and says when to run."""
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                if self._until > now:
                    self._changed.wait(None if math.isinf(self._until) else self._until - now)
                elif (until := self._due(now) if self._held else now) <= now:
                    self._release()
                else:
                    self._until = until


def batches(queries: Sequence[Query], largest: int) -> list[Sequence[Query]]:
    """``queries`` in order, in batches of at most ``largest`` rows (a query larger alone)."""
    formed, start = [], 0
    while start < len(queries):
        end, rows = start + 1, queries[start].rows
        while end < len(queries) and rows + queries[end].rows <= largest:
            rows += queries[end].rows
            end += 1
        formed.append(queries[start:end])
        start = end
    return formed


class HeldBatch:
    """``serving.Server`` of a model served by a ``WholeBatch`` alone whose policy holds: every
    batch is handed over, held, and run by the ``WholeBatch`` once the policy serves."""

    ready = True  # no threads to lose (the hold's only waits)

    def __init__(self, whole: WholeBatch, policy: Policy):
        self.whole = whole
        self._judged: Judged = {}
        self._arrivals = Arrivals()
        self._counted = threading.Lock()
        self.hold = Hold(policy, self._run, self._arrived, self._rate)

    def runs_inline(self, inputs: Sequence[Tensors] = ()) -> bool:
        return False

    def run(self, queries: Sequence[Query], meanwhile: Callable[[], None] | None = None) -> None:
        self.whole.run(queries, meanwhile)

    def run_straight(self, inputs: Sequence[Tensors], meanwhile: Callable[[list[Reply]], None]) -> int:
        return 0  # every query is held

    def submit(self, queries: Sequence[Query]) -> None:
        self.hold.put(refuse_invalid(self.whole.manifest, queries, self.whole.size_limits, self._judged))

    def gauges(self) -> dict:
        """The queries held: waiting, and handed over but not answered."""
        held = len(self.hold)
        return {WAITING: held, IN_FLIGHT: held}

    def close(self) -> None:
        for query in self.hold.close():
            query.answer(failure=Failure("the model is unloading", Code.UNAVAILABLE))

    def _run(self, queries: list[Query]) -> None:
        for batch in batches(queries, self.whole.manifest.max_batch_size):
            self.whole.run(batch)

    def _arrived(self, times: Iterable[float]) -> None:
        with self._counted:
            self._arrivals.add(times)

    def _rate(self) -> float:
        with self._counted:
            return self._arrivals.steady()
