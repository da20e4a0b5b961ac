"""What serving costs, in the words the other parts of ``decide`` share: the ways a batch
is served (``Mode``), the stub's CPU a batch and a request each way (``HostCosts``, measured when
the model loads and corrected while it serves), and the engines' seconds a batch read from the
stage latency tables (``device_s``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from ..manifest import LatencyTable

# A window may show a way's stub at less than loading measured (a host faster than when the model
# loaded), but it is never taken below this share of it. There is no most: what loading leaves out
# was 4-9 times plain's own cost (docs/results/served-cost-lines). A window that holds other work
# (a drain) speaks for itself alone: the next window's excess replaces its own, lines take medians
# (``ServedLine``), and a switch needs two windows in a row agreeing.
LEAST_SHARE = 0.5


class Mode(Enum):
    PIPELINE = "pipeline"
    FUSED = "fused"  # the stages as one engine, inside ``execute``
    IN_TURN = "in_turn"  # the stages one after another, inside ``execute``


@dataclass(frozen=True)
class HostCosts:
    """CPU seconds the model's stub spends serving, per batch and per request, for each way of
    serving (``pipeline``: handed to the stage executors, answered by ``send()``; ``plain``: run
    inside ``execute``, answered in its list). The stub is one Python interpreter: its work runs
    on one core's worth of time whatever the host has, which is what caps serving at engine speed.
    ``handoff_s``: the wall seconds the pipeline's hand-offs add to a lone batch beyond that CPU
    (threads woken, on other cores where the host has them): latency, which occupies nothing."""

    pipeline_batch_s: float = 0.0
    pipeline_request_s: float = 0.0
    plain_batch_s: float = 0.0
    plain_request_s: float = 0.0
    handoff_s: float = 0.0
    # What answering a plain request by a ``send()`` adds to it, as a hold does (``hold.py``): a
    # round trip to tritonserver (in ``pipeline_request_s`` already; 0 where every plain answer
    # is sent anyway: a decoupled model).
    send_s: float = 0.0
    how: str = "not measured"

    def stub_s(self, mode: Mode, requests: float) -> float:
        """The stub's seconds for one batch of ``requests`` served ``mode`` (what a request's rows
        cost beyond its first is in its request's cost: loading measures requests of one row, and
        serving a line through the windows a client sends, ``ServedLine``)."""
        if mode is Mode.PIPELINE:
            return self.pipeline_batch_s + requests * self.pipeline_request_s
        return self.plain_batch_s + requests * self.plain_request_s

    def plus(self, pipeline_s: float, plain_s: float) -> HostCosts:
        """Each way's stub seconds a request with what serving showed beyond loading's added (a
        request never below ``LEAST_SHARE`` of loading's)."""
        return replace(self, pipeline_request_s=max(self.pipeline_request_s + pipeline_s,
                                                    LEAST_SHARE * self.pipeline_request_s),
                       plain_request_s=max(self.plain_request_s + plain_s, LEAST_SHARE * self.plain_request_s))

    def served(self, mode: Mode, batch_s: float, request_s: float) -> HostCosts:
        """These costs with ``mode``'s stub costs as serving showed them (``ServedLine``)."""
        if mode is Mode.PIPELINE:
            return replace(self, pipeline_batch_s=batch_s, pipeline_request_s=request_s)
        return replace(self, plain_batch_s=batch_s, plain_request_s=request_s)

    @property
    def measured(self) -> bool:
        return self.how != HostCosts.how

    def describe(self) -> str:
        return (f"stub {self.pipeline_batch_s * 1e6:.0f} us a batch + {self.pipeline_request_s * 1e6:.0f} a request "
                f"pipelined (+ {self.handoff_s * 1e6:.0f} us of hand-offs), {self.plain_batch_s * 1e6:.0f} + "
                f"{self.plain_request_s * 1e6:.0f} plain ({self.how})")


def middle_length(tables: Sequence[LatencyTable]) -> int | None:
    lengths = tables[0].lengths
    return lengths[len(lengths) // 2] if lengths else None


def device_s(tables: Sequence[LatencyTable], mode: Mode, rows: int, length: int | None, statistic: str = "mean",
             shared_host: bool = False) -> float:
    """Seconds the engines take per batch of ``rows``: a plain model runs the stages one after
    another, a pipeline is held by its slowest stage. With ``shared_host`` (torch stages run node
    by node by one interpreter: ``interpreted``) a pipelined batch also waits for every stage's
    host time, the same at every batch size: taken as each stage's least time over its batch
    sizes, where the GPU has least to do (BERT-base's two interpreted stages on an H200: 5.4 and
    4.0 ms for one row, 5.4 and 4.4 for 16: nearly all of it the interpreter's)."""
    times = [t.predict(rows, length, statistic) / 1000 for t in tables]
    if mode is not Mode.PIPELINE:
        return sum(times)
    host = sum(min(t.predict(r, length, statistic) for r in t.batch_sizes) for t in tables) / 1000 \
        if shared_host else 0.0
    return max(max(times), host)


def way(mode: Mode) -> str:
    """How ``mode`` serves, in the log's words."""
    return "pipelined" if mode is Mode.PIPELINE else "plain"


def ms(seconds: float) -> str:
    """A predicted latency for the log: the M/D/1 wait grows without bound near capacity (a way
    100 % busy to the percent read "41442145.62 ms"), so a minute or more reads as overloaded."""
    return "overloaded" if seconds >= 60 else f"{seconds * 1000:.2f} ms"
