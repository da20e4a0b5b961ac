"""The entry: queries waiting for the first stage, admitted when it asks for work.

It holds the batch window, the policy's bound on rows in flight, Triton's queue policy (a full
queue refuses, an expired timeout is answered) and cancellation of waiting queries, and it is
where the backend's ``execute`` waits (``wait_ready``) until stage 0 has computed what it handed
over: the back-pressure that keeps Triton's batcher forming batches in front of the pipeline.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

from .arrival import Arrivals
from .batch_table import BatchItem
from .config import QueuePolicy
from .policy import Outlook
from .query import BatchShape, Code, Failure, Query, refuse_hopeless
from .scheduler import Scheduler

log = logging.getLogger(__name__)
SCAN = 64  # waiting queries an admission looks at, from the oldest
CANCEL_AFTER_S = 0.02  # a waiting query is asked whether it was cancelled once it has waited this long
CANCELLED = Failure("the request was cancelled", Code.CANCELLED)


class Entry:
    """Queries waiting for the first stage; the first stage's batch queue (paper: BatchQueue_1).

    When stage 0 asks for work, the entry waits out the batch window if there is one (a fixed
    ``window_s``, else the policy's, which knows whether the pipeline is busy and how fast queries
    arrive) and the room the policy leaves for rows in flight, then lets the scheduler admit.
    Batches the policy formed beyond the first enter on the next requests, without waiting. The
    backend's ``execute`` waits on the entry too (``wait_ready``) where the CPU caps the
    pipeline (``decide.waits``): that back-pressure is what keeps Triton's own batching alive
    in front of it."""

    def __init__(self, scheduler: Scheduler, max_batch_size: int, window_s: float | None,
                 queue: QueuePolicy | None = None):
        self._scheduler = scheduler
        self._max = max_batch_size
        self._window = window_s
        self._queue = queue or QueuePolicy()
        self._waiting: deque[Query] = deque()
        self._formed: deque[tuple[list[Query], BatchShape]] = deque()
        self._arrivals = Arrivals()
        self._counting = True  # whether queries put count in the arrival rate (``unseen``)
        self._changed = threading.Condition()
        self._closed = False
        self._ready = True  # stage 0 is done with its item, or waits here: it takes queries next
        self._computed = 0  # items stage 0 has computed
        self._admitted_at = 0  # ``_computed`` when stage 0 last took waiting queries
        self._windowing = False  # stage 0 waits in its batch window for more queries

    def put(self, queries: Sequence[Query], whole: bool = False) -> None:
        """Queue the queries; those beyond ``max_queue`` are refused at once, as Triton's queue
        policy refuses them. ``whole``: they enter as one batch, not as the policy would form them
        (the calibration's, which times a batch of one and one of many: ``calibrate.measure``)."""
        with self._changed:
            limit = self._queue.max_queue_size
            room = limit - len(self._waiting) if limit > 0 else len(queries)
            accepted, refused = queries[:max(room, 0)], queries[max(room, 0):]
            if whole and accepted:
                self._formed.append((list(accepted), BatchShape.of(accepted)))
            else:
                self._waiting.extend(accepted)
            if self._counting:
                self._arrivals.add(query.arrived for query in accepted)
            self._changed.notify_all()
        for query in refused:
            query.answer(failure=Failure(f"Exceeds maximum queue size ({limit} queries waiting)", Code.UNAVAILABLE))

    def arrived(self, times: Iterable[float]) -> None:
        """Queries that ran without waiting here (a lone batch run inline, ``decide.LoneRuns``),
        by when they arrived, still count in the arrival rate the policy's window reads, as do the
        queries a hold takes (``hold.py``). (Otherwise, while the mode switch serves the model
        plain, nothing reads it and ``Runtime.run`` does not call this.)"""
        if self._counting:
            with self._changed:
                self._arrivals.add(times)

    def steady_rate(self) -> float:
        """The arrivals' steady rate (``Arrivals.steady``), which the policy is solved for."""
        with self._changed:
            return self._arrivals.steady()

    @contextlib.contextmanager
    def unseen(self) -> Iterator[None]:
        """Queries put meanwhile count in no arrival rate: the calibration's, when the model
        loads (``calibrate.py``). Read as a load, its bursts had ``policy: smdp`` solve for them
        on the stub's own cores while the serving cost was measured: five times what serving
        costs, after which the SMDP took the pipeline for one a fifth as fast and ``execute``
        held Triton's next requests back (docs/results/smdp-dispatch-2core)."""
        self._counting = False
        try:
            yield
        finally:
            self._counting = True

    def _head(self) -> list[Query]:
        """The oldest ``SCAN`` waiting queries, taken off the queue, less those whose client
        cancelled them or whose timeout expired, or which the policy finds cannot meet it any
        more (``Policy.hopeless``; with Triton's REJECT timeout action), which are answered.
        Admission only looks this far, so its cost does not grow with the queue.
        Asking Triton whether a request was cancelled is a round trip to its process, so only
        the oldest batch's worth is asked, and only once it has waited ``CANCEL_AFTER_S``."""
        head = [self._waiting.popleft() for _ in range(min(SCAN, len(self._waiting)))]
        now, kept = time.monotonic(), []
        for position, query in enumerate(head):
            if position < self._max and query.gave_up(now, CANCEL_AFTER_S):
                query.answer(failure=CANCELLED)
            else:
                kept.append(query)
        policy = self._scheduler.policy
        return refuse_hopeless(kept, policy.hopeless) if self._queue.reject and policy.may_refuse(kept) else kept

    def wake(self) -> None:
        """Rows left the pipeline or moved on in it: there may be room for more, or a window to
        decide again. Only for queries waiting: with none, stage 0 waits for one to come and
        ``wait_ready`` for stage 0, and neither would find anything changed (a futile wake of
        stage 0's thread per later stage and batch, each a thread switch)."""
        with self._changed:
            if self._waiting:
                self._changed.notify_all()

    def ready(self) -> None:
        """Stage 0 finished computing its item: it takes queries next, once it has an output buffer."""
        with self._changed:
            self._ready = True
            self._computed += 1
            self._changed.notify_all()

    def wait_ready(self, timeout: float) -> None:
        """Back-pressure for Triton's batcher, in the backend's ``execute``: return once stage 0
        took every waiting query and finished computing the first batch it formed of them (it
        takes queries next), or waits in its batch window for more, or the entry closed; at most
        after ``timeout``. Meanwhile Triton gathers the requests that arrive into its next batch:
        one ``execute`` and one admission for many, as a plain model batches. Returning when stage
        0 finished computing, not when it asks (after it got an output buffer), lets that batch
        travel from Triton while stage 0 waits for the next stage; and not when its queries were
        taken, so that Triton's next batch holds everything that arrived meanwhile, not a few
        stragglers (of the three moments, this one kept the stages busiest). Not after every
        batch the policy formed of them either (Policy I cuts a crowd into several): the requests
        arriving meanwhile would wait unseen in Triton's queue while stage 0 worked through them
        (RTE on two slow stages, 64 in flight: stages 81 % busy that way, 89 % this way)."""
        with self._changed:
            self._changed.wait_for(lambda: (not self._waiting and (self._ready or self._computed > self._admitted_at))
                                   or self._windowing or self._closed, timeout)

    def _hand(self, item: BatchItem) -> BatchItem:
        self._ready = False
        return item

    def get(self) -> BatchItem | None:
        """The next item for stage 0, or None once closed and drained."""
        with self._changed:
            while True:
                if not self._ready:
                    self._ready = True
                    self._changed.notify_all()
                self._changed.wait_for(lambda: self._waiting or self._formed or self._closed)
                if self._formed:
                    return self._hand(self._scheduler.new(*self._formed.popleft()))
                if not self._waiting:
                    return None
                room = self._room()
                if room < self._waiting[0].rows:
                    self._changed.wait()
                    continue
                while True:
                    outlook = Outlook(tuple(self._scheduler.table.flights()), self._arrivals.rate(),
                                      self._arrivals.steady())
                    now = time.monotonic()
                    if self._closed or (left := self._window_end(room, outlook, now) - now) <= 0:
                        break
                    self._windowing = True
                    self._changed.notify_all()
                    self._changed.wait(left)
                self._windowing = False
                head = self._head()
                if not head:  # all answered here: ``wait_ready`` may have nothing left to wait for
                    self._changed.notify_all()
                    continue
                try:
                    taken, item, formed = self._scheduler.admit(head, self._room(), outlook)
                except BaseException:
                    self._waiting.extendleft(reversed(head))
                    raise
                self._admitted_at = self._computed
                gone = {id(q) for q in taken}
                self._waiting.extendleft(reversed([q for q in head if id(q) not in gone]))
                self._formed.extend(formed)
                return self._hand(item)

    def _window_bound(self) -> float:
        """When the window must close at the latest, for the queries it would batch (the oldest
        ``SCAN``): halfway from each one's arrival to its deadline, so that it never outlasts a
        deadline and leaves every query at least half its time to be computed in."""
        return min((q.arrived + (q.deadline - q.arrived) / 2 for q in itertools.islice(self._waiting, SCAN)
                    if q.deadline is not None), default=float("inf"))

    def _window_end(self, room: int, outlook: Outlook, now: float) -> float:
        """Until when to wait for more queries to batch with the oldest: never once ``room``
        rows that can join it are waiting; else the fixed window after the oldest arrived, or
        the policy's (asked again whenever more arrive: the pipeline's state and the rows
        waiting decide it), and never past the bound the deadlines set (``_window_bound``)."""
        joining = self._joining()
        rows = sum(q.rows for q in joining)
        if rows >= room:
            return now
        if self._window is not None:
            end = self._waiting[0].arrived + self._window
        else:
            policy = self._scheduler.policy
            try:
                end = policy.window_end(joining, rows, outlook, now)
            except Exception:  # a policy's bug must not stop admission: no window then
                log.exception("policy %r failed to give a batch window", policy.name)
                end = now
        return min(end, self._window_bound()) if end > now else end

    def _joining(self) -> list[Query]:
        """Queries among the oldest ``SCAN`` that can share a batch with the oldest: what the
        window waits for (rows of another shape would not fill the batch it closes for)."""
        oldest, policy = self._waiting[0], self._scheduler.policy
        head = list(itertools.islice(self._waiting, SCAN))
        try:
            return [q for q in head if policy.joins(oldest, q)]
        except Exception:  # a policy's bug must not stop admission: count every query
            log.exception("policy %r failed to say which queries batch together", policy.name)
            return head

    def _room(self) -> int:
        """Rows the policy lets in now; a full batch when nothing is in flight, so that a query
        larger than the bound still runs."""
        limit, in_flight = self._scheduler.policy.max_in_flight, self._scheduler.table.rows_in_flight()
        return min(self._max, limit - in_flight) if limit > 0 and in_flight else self._max

    def __len__(self) -> int:
        with self._changed:
            return len(self._waiting) + sum(len(queries) for queries, _ in self._formed)

    def close(self) -> list[Query]:
        """Stop waiting for more; the queries not yet admitted are returned."""
        with self._changed:
            self._closed = True
            left = [*self._waiting, *(q for queries, _ in self._formed for q in queries)]
            self._waiting, self._formed = deque(), deque()
            self._changed.notify_all()
            return left
