"""Scheduling policies: the user-defined conditions of the paper's Figure 12.

The scheduler asks a policy at the entry, when the first stage is ready for more queries: until
when to wait for more (the batch window), should they *stretch* the latest batch (the table
offers it only when that is legal), and if not, which *new* batches to form from them and may
those be stretched later? After a stage finishes a whole batch: should it be *split*, into
which sizes, and do the parts run one after another? Everything else (*pass on*) is the default.

Policies here are the pass-through policy and fixed/random ones for tests and for showing the
meta operations; the paper's diversity-aware policies are in ``diversity.py``. Settings come
from config.pbtxt as ``policy.<setting>`` parameters and are typed by the dataclass fields.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .batch_table import BatchRow, Flight
from .decide import HostCosts
from .errors import ConfigError
from .manifest import Manifest
from .query import BatchShape, Query, shape_key, take_batch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outlook:
    """What the entry knows when it admits: the batches ``ahead`` in the pipeline (oldest first),
    the queries' recent arrival rate and their steady one, over many more arrivals (each 0 until
    it has enough arrivals to say; ``arrival.Arrivals``)."""

    ahead: tuple[Flight, ...] = ()
    arrivals_per_s: float = 0.0
    steady_per_s: float = 0.0


class Policy:
    """Pass-through: every admission is a new batch, nothing is stretched or split."""

    name = "pass"
    auto = False  # ``decide`` may serve the model plain or run lone batches inline (``policy: auto``)
    split_serially = False  # split parts enter the next stage as soon as it is free
    learns = False  # it hears how long each run took (``observe``): only then is it told
    max_in_flight = 0  # rows admitted and not yet answered, at most (0: no limit but the batch size)
    holds = False  # served plain, it may hold queries back for more (``hold_until``; ``hold.Hold``)
    # Where a policy says what it decided while serving (``serving.serve`` points it at the model's log).
    said: Callable[[str], None] = staticmethod(log.info)

    def bind(self, manifest: Manifest) -> None:
        """Read what the policy needs from the model (its latency tables); ConfigError if it cannot run."""

    def measured(self, costs: HostCosts, stages: int) -> None:
        """The host's serving costs, measured where the model serves (``calibrate.py``)."""

    def observe(self, stages: range, rows: int, shape: BatchShape, first: Query | None, seconds: float) -> None:
        """``stages`` computed ``rows`` of a batch of ``shape`` (``first``: one of its queries) in
        ``seconds``: a stage of the pipeline, or every stage inside ``execute`` (for policies that
        learn how long queries take: ``policy: slo``), where ``learns``. Called on the serving path: keep
        it short."""

    def may_refuse(self, queries: Sequence[Query]) -> bool:
        """Whether ``hopeless`` or ``late_together`` could refuse any of ``queries``, asked first so
        that a batch without deadlines costs a model served plain no judgement. Here: only where
        one has a deadline of its own (its request's timeout)."""
        return any(query.deadline is not None for query in queries)

    def hopeless(self, query: Query, now: float) -> bool:
        """Whether ``query`` cannot meet its deadline any more, so that the entry (or ``execute``,
        where the model serves plain) answers it with Triton's timeout error rather than compute
        it (``policy: slo``; under Triton's REJECT timeout action). Here: once it expired."""
        return query.expired(now)

    def late_together(self, queries: Sequence[Query], now: float) -> list[Query]:
        """Of ``queries``, none of them ``hopeless``, which run as one batch inside ``execute`` (a
        model served plain: each answered when the run ends), those that batch would make miss
        their deadlines and that are refused too, so that the rest can meet theirs. Here: none."""
        return []

    def window_end(self, waiting: Sequence[Query], rows: int, outlook: Outlook, now: float) -> float:
        """Until when (``time.monotonic()`` seconds) the entry may wait for more queries to batch
        with ``waiting`` (those that can share a batch with the oldest, oldest first, of which
        ``rows`` rows would enter now). Asked again whenever more arrive. Here: not at all."""
        return now

    def hold_until(self, waiting: Sequence[Query], arrivals_per_s: float, now: float) -> float:
        """Served plain (every batch inside ``execute``), until when the queries ``waiting``
        (oldest first; ``arrivals_per_s``: their steady rate) are held back for more, where
        ``holds``: asked again whenever an ``execute`` brings more. Here: not at all."""
        return now

    def joins(self, oldest: Query, query: Query) -> bool:
        """Can ``query`` share a batch with ``oldest``? The batch window waits for rows that can:
        here, rows of exactly the same shape."""
        return shape_key(query) == shape_key(oldest)

    def form(self, waiting: Sequence[Query], room: int, now: float, outlook: Outlook = Outlook()
             ) -> list[tuple[list[Query], BatchShape]]:
        """New batches from the waiting queries (oldest first), at most ``room`` rows in all, in the
        order they enter: here the oldest with every later query of the same shape, as Triton's
        dynamic batcher forms a batch."""
        batch = take_batch(waiting, room)
        return [(batch, BatchShape.of(batch))]

    def forms_alike_whole(self) -> bool:
        """Whether ``form`` runs waiting queries of one shape as one batch, up to the room: then
        a model served plain on the host's cores may run a call of such requests straight, as
        one batch from their inputs (``WholeBatch.run_straight``), without the queries ``form``
        would take. Here: yes, ``take_batch`` takes every query that stacks with the oldest."""
        return True

    def form_inline(self, queries: Sequence[Query]) -> list[list[Query]]:
        """The batches to run one after another inside one ``execute`` of a model served as a
        plain one on engines that overlap (a GPU; timed), every query answered once the last is
        done: here all of them as one batch, padded to the longest."""
        return [list(queries)]

    def stretch(self, candidate: BatchRow, queries: Sequence[Query], now: float, backlog: int = 0) -> bool:
        """Should ``queries`` join ``candidate`` (the latest batch, legal to stretch)? ``backlog``:
        the rows left waiting at the entry behind them."""
        return False

    def stretchable(self, queries: Sequence[Query], now: float) -> bool:
        """May the new batch of ``queries`` be stretched later?"""
        return True

    def split(self, batch: BatchRow, stage: int, now: float) -> Sequence[int] | None:
        """Sizes to split ``batch`` into after ``stage`` finished all of it, or None to pass it on."""
        return None


@dataclass
class FixedPolicy(Policy):
    """Always stretch when legal (if ``stretch``); split every batch after stage ``split_after``
    into parts of ``split_size`` rows (if ``split_after`` >= 0). For tests and for showing the
    meta operations."""

    name = "fixed"
    stretch_latest: bool = False
    split_after: int = -1
    split_size: int = 1

    def stretch(self, candidate: BatchRow, queries: Sequence[Query], now: float, backlog: int = 0) -> bool:
        return self.stretch_latest

    def stretchable(self, queries: Sequence[Query], now: float) -> bool:
        return self.split_after < 0

    def split(self, batch: BatchRow, stage: int, now: float) -> Sequence[int] | None:
        if stage != self.split_after or batch.bs <= self.split_size:
            return None
        whole, rest = divmod(batch.bs, self.split_size)
        return [self.split_size] * whole + ([rest] if rest else [])


@dataclass
class RandomPolicy(Policy):
    """Random new/stretch/split decisions from ``seed``: exercises every meta operation and
    interleaving under load (tests compare outputs with the unsliced model)."""

    name = "random"
    seed: int = 0
    stretch_probability: float = 0.5
    split_probability: float = 0.3
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self):
        for name in ("stretch_probability", "split_probability"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"parameter 'policy.{name}' must be between 0 and 1, got {getattr(self, name)}")
        self._rng = random.Random(self.seed)

    def stretch(self, candidate: BatchRow, queries: Sequence[Query], now: float, backlog: int = 0) -> bool:
        with self._lock:
            return self._rng.random() < self.stretch_probability

    def stretchable(self, queries: Sequence[Query], now: float) -> bool:
        with self._lock:
            return self._rng.random() >= self.split_probability

    def split(self, batch: BatchRow, stage: int, now: float) -> Sequence[int] | None:
        with self._lock:
            if batch.stretchable or batch.bs < 2 or self._rng.random() < 0.5:
                return None
            cuts = sorted(self._rng.sample(range(1, batch.bs), self._rng.randint(1, batch.bs - 1)))
        return [b - a for a, b in zip([0, *cuts], [*cuts, batch.bs])]
