"""When the requests of an ``execute`` call reached Triton, as far as the model can tell.

A deadline counts from when its request reached the server, but the Python backend is not told
when that was: ``execute`` sees a request once Triton's dynamic batcher hands it over, after it
waited in Triton's queue for as long as the model's instance was busy (a model served plain,
whose ``execute`` runs every batch; a pipeline's ``execute`` waiting on stage 0). Counted from
``execute``, a request that waited 150 ms of its 160 ms timeout looks fresh, and one that cannot
be answered in time is computed anyway (late) while the queue behind it grows.

What the calls show bounds it. Triton hands requests over in the order they came, and at once
to an idle instance (after its batcher's own delay): a call that begins well after the previous
one ended got requests that arrived within that delay. While the instance is busy the requests
wait: a call that took fewer rows than the largest batch left Triton's queue empty, so the next
call's requests all arrived after it began; a full one did not, and the next call's arrived
after its own. Within those bounds the requests are taken to have arrived evenly spread, in
order (their expected times under Poisson arrivals). Under a load the instance cannot keep up
with, full calls take the oldest requests and the spread reaches past them: the waits are
underestimated there, never invented (``TritonQueue``). From those times, the rate at which
queries arrive, which a policy's batch window and the SMDP read (``Arrivals``).

Nothing here imports Triton.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


# A call beginning within this of the previous one's end is taken to have had requests waiting:
# an upper bound on Triton's hand-off from one call to the next (0.5-2 ms, median 1.6, on this
# project's 2-core host at 0.9 load; less on a faster one). Beyond it the instance was idle. Too
# low a bound takes most busy calls for idle ones (1 ms did here: 16 % of the calls were within
# it); too high one takes a request that came just after a call ended for one that waited.
IDLE_S = 0.005
RATE_SAMPLES = 8  # arrivals before a policy trusts its estimate of the arrival rate
RECENT = 32  # the recent rate is over this many latest arrivals
# The steady rate is over this many: Triton hands requests over in batches (one ``execute``),
# whose queries arrive within microseconds, so a few dozen arrivals span two or three batches
# and read twice the offered rate or more (2,700 queries/s offered read as 5,000-20,000).
STEADY = 512
# ... and no older than this: at a low rate 512 arrivals span seconds, and where the load paused
# (between two of a benchmark's windows) the pause read as a load of 7-9 queries/s offered 128
# (docs/results/smdp-power-weight-2core).
STEADY_S = 2.0


@dataclass
class TritonQueue:
    max_rows: int  # the largest batch Triton forms (config.pbtxt's max_batch_size)
    delay_s: float = 0.0  # the batcher's max_queue_delay
    _since: float | None = field(default=None, init=False)  # the next call's requests arrived after this
    _ended: float | None = field(default=None, init=False)  # when the last call ended

    def spread(self, count: int, rows: int, now: float) -> tuple[float, float]:
        """``(since, step)``: the i-th of the ``count`` requests (``rows`` rows in all, in the order
        Triton handed them over) of a call beginning ``now`` is taken to have reached Triton at
        ``since + step * (i + 0.5)``. Two numbers, not a list: a call whose requests have no
        deadline reads neither, and a model served plain pays this on every ``execute``."""
        since = now - self.delay_s
        if self._since is not None and self._ended is not None and now - self._ended < IDLE_S:
            since = min(since, self._since)  # the instance was busy: they waited since then
        step = (now - since) / count
        self._since = now if rows < self.max_rows else since + step * (count - 0.5)
        return since, step

    def called(self, count: int, rows: int, now: float) -> None:
        """A call beginning ``now`` whose requests have no deadline, so nothing reads ``spread``'s
        figures: only what the next call's ``spread`` reads is kept. A call of fewer rows than a
        full batch took every request waiting, so the next call's arrived after it began (a
        model served plain pays this on every ``execute``: at near-zero compute under Poisson
        loads, ``spread`` and counting the rows cost the stub 3.5-4 us a request)."""
        if rows < self.max_rows:
            self._since = now
        else:
            self.spread(count, rows, now)

    def ended(self, began: float, now: float) -> float:
        """The call that began at ``began`` ended at ``now``; the seconds the instance was idle
        before it (since the previous call ended; 0 for the first)."""
        idle = began - self._ended if self._ended is not None else 0.0
        self._ended = now
        return idle


class Arrivals:
    """When the latest queries arrived (``Query.arrived``, in order): the rates a policy reads.
    Not locked: its owner's lock guards it."""

    def __init__(self):
        self._times: deque[float] = deque(maxlen=STEADY)

    def add(self, times: Iterable[float]) -> None:
        """Arrival times (``Query.arrived``), in order."""
        self._times.extend(times)

    def rate(self, over: int = RECENT, within: float = math.inf) -> float:
        """Queries per second over the latest ``over`` arrivals, those no more than ``within``
        seconds before the latest (0 until there are ``RATE_SAMPLES``: two queries that happen
        to come close together are not a load)."""
        count = min(over, len(self._times))
        if count < RATE_SAMPLES:
            return 0.0
        arrivals, latest = self._times, self._times[-1]
        if latest - arrivals[-count] > within:  # (in arrival order: a bisection, on stage 0's path)
            count = len(arrivals) - bisect.bisect_left(arrivals, latest - within, len(arrivals) - count)
            if count < RATE_SAMPLES:
                return 0.0
        span = latest - arrivals[-count]
        return (count - 1) / span if span > 0 else 0.0

    def steady(self) -> float:
        """The rate over the latest ``STEADY`` arrivals, none more than ``STEADY_S`` before the
        latest."""
        return self.rate(STEADY, STEADY_S)
