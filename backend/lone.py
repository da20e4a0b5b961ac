"""Whether a batch that finds the pipeline empty runs through every stage inside ``execute``.

Alone in the pipeline, a query pays for what overlapping batches would hide: the hand-offs
between the executor threads and a ``send()`` of its answer (two slow stages on RTE text, one
query in flight: 10.8 ms against 9.9 inline, docs/results/sim-slow-rte-lone). Run inside
``execute`` instead, it goes back in the list ``execute`` returns, as a plain model answers. But
meanwhile ``execute`` holds Triton's instance: a request that arrives during the run waits
unseen in Triton's queue until it ends, where the pipeline would have let it into stage 0 as
soon as that was free (two clients in a closed loop with every lone batch inline: 107 against
185 answers/s). So a lone batch runs inline only while such arrivals are rare, which is what
one client in a closed loop and a trickle of requests look like.

Only the pipeline shows whether a request arrived during a lone batch: the next ``execute``
finds it still busy. Inline, nothing tells (traced on this project's 2-core host, the gap
between an ``execute`` returning and the next one beginning was 0.25-1 ms whether the next
request had waited in Triton's queue or came after a client's round trip). So while lone
batches run inline, one now and then still enters the pipeline, to look. Nothing here imports
Triton, so the rule can be tested directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoneRuns:
    """The share of lone batches in the pipeline during which another request arrived (an
    exponential average), and the rule: a lone batch runs inline while that share is at most
    ``most``, except that after some inline runs the next one enters the pipeline to look: after
    ``every`` at first, twice as many after each look that saw nothing (up to ``longest``), and
    ``every`` again once one saw an arrival.

    ``most``: a request arriving during an inline run waits for the stages after the first
    (about half the run on two stages) for nothing; a lone batch run inline saves the hand-offs
    and a ``send()`` (about 1 ms on the slow profile, more than that wait costs at 0.2).
    ``weight``: a look's weight in the share (one arrival seen is enough to stop running inline;
    it takes one look without to start again). ``longest``: a look costs a pass through the
    pipeline, on fast engines more than the whole run inline (TensorRT speed, one client: 0.83x
    the plain model looking after every 4, 0.91x with the looks doubling up to 16,
    docs/results/cost-lone-looks); but until the next look, requests that begin to arrive during
    lone batches (a second client) wait for each other."""

    most: float = 0.2
    weight: float = 0.25
    every: int = 4
    longest: int = 16
    share: float = 0.0
    _interval: int = field(default=0, init=False)  # inline runs between two looks now
    _inline_runs: int = field(default=0, init=False)  # inline since the last lone batch entered the pipeline
    _looking: bool = field(default=False, init=False)  # a lone batch entered the pipeline, no ``execute`` since
    _due: bool = field(default=False, init=False)  # ... because the interval was up (not because of the share)

    def __post_init__(self) -> None:
        self._interval = self.every

    def inline(self, idle: bool) -> bool:
        """At the start of ``execute`` (``idle``: nothing waits at the entry and no batch is in
        the pipeline): whether this batch runs inside it."""
        if self._looking:
            arrived = not idle
            self.share += self.weight * (arrived - self.share)
            if arrived:
                self._interval = self.every
            elif self._due:
                self._interval = min(2 * self._interval, self.longest)
            self._looking = False
        if not idle:
            return False
        calm = self.share <= self.most
        if calm and self._inline_runs < self._interval:
            self._inline_runs += 1
            return True
        self._inline_runs, self._looking, self._due = 0, True, calm
        return False
