"""One cell of ``tools.check_auto``: one load of one profile, every way's window in each round,
``auto``'s verdict against the better way and which way ``auto`` served (its ``choice``).

Apart from the command, so that a test can build a cell from windows it made and read its
verdict and choice without a server."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools.lib.harness import Measured
from tools.lib.intervals import Ratio, against_margin, across_rounds, pooled
from tools.lib.perf_analyzer import Window

PEER_OF_MODE = {"pipeline": "pipeline", "fused": "plain", "in_turn": "plain"}  # how auto served: the peer serving so
PEERS = ("plain", "pipeline")
RIGHT_SHARE = 0.9  # a choice is right (or wrong) where auto served the better way at least (at most 1 -) this share
LOOK_GROWTH = 1.5  # each look at a cell after the first comes after this many times the rounds of the one before


@dataclass(frozen=True)
class Served:
    """How ``auto`` served during one window: its seconds by mode, and of its calls made while
    pipelining, the share in which a lone batch ran inline (``decide.LoneRuns``): those ran as
    the plain path runs, so they count as served plain."""

    seconds: dict[str, float] = field(default_factory=dict)
    inline: float = 0.0

    @classmethod
    def of(cls, measured: Measured | None) -> Served:
        """From a window's counts (nothing where the window failed); its calls are split between
        the modes by their seconds."""
        if measured is None:
            return cls()
        seconds, calls = measured.served, measured.calls
        pipelined = seconds.get("pipeline", 0.0) / (sum(seconds.values()) or 1.0) * calls.get("executes", 0.0)
        return cls(seconds, min(calls.get("inline", 0.0) / pipelined, 1.0) if pipelined else 0.0)

    def as_peers(self) -> dict[str, float]:
        """The seconds served as each peer serves (plain, pipeline)."""
        peers = dict.fromkeys(PEERS, 0.0)
        for mode, spent in self.seconds.items():
            moved = spent * self.inline if mode == "pipeline" else 0.0
            peers[PEER_OF_MODE[mode]] += spent - moved
            peers["plain"] += moved
        return peers

    def __str__(self) -> str:
        text = " ".join(f"{mode}:{spent:.1f}" for mode, spent in sorted(self.seconds.items()))
        return text + (f" (lone inline {self.inline:.0%})" if self.inline else "")


def in_turn(models: tuple[str, ...], turn: int) -> tuple[str, ...]:
    """The ways in the order round ``turn`` (from 0) runs them: each round starts one further
    along (a rotation), so that every way takes every place in a round equally often and, of
    three or more, none runs twice in a row. Every other round reversed had the middle way always
    run after another, and the ways at the ends after themselves half the time: copies of one
    forced pipeline on three 0.7 ms stages at 16 in flight read the middle copy 1.05x / 1.09x
    the copy at an end in two runs of six rounds (11 of 12 rounds ahead), the places
    ``check_auto`` gives the pipeline and ``auto``. Rotated, two copies read 0.93x / 0.95x the
    model copied in one run: identical models read that far apart at six rounds here
    (docs/results/check-trt-whole-batches)."""
    start = turn % len(models)
    return models[start:] + models[:start]


def looks(first: int, last: int) -> tuple[int, ...]:
    """The round counts after which a cell's verdict is read: ``first``, then each
    ``LOOK_GROWTH`` times the one before, and ``last``. Each look must read a wider interval for
    a verdict read at any of them to be wrong no more often than one read once (Bonferroni),
    so a look after every round (23 looks from 2 to 24 rounds) widens each interval a fifth to a
    third more than these 7 looks do (Student's t at 1 - 2.5 % / 23 against 1 - 2.5 % / 7, at 20
    to 5 degrees of freedom), and a cell would need 1.4-1.7x the rounds to be resolved."""
    counts = [first]
    while counts[-1] < last:
        counts.append(min(max(counts[-1] + 1, math.ceil(counts[-1] * LOOK_GROWTH)), last))
    return tuple(counts)


def geometric_lives(ratios: Sequence[float | None], lives: Sequence[int] | None) -> list[float]:
    """One ratio a life: the geometric mean of its rounds' (``ratios``, None where a round lost
    a window), each life running from the round ``lives`` gives to the next one's; where the
    models were loaded once (``lives`` None) each round is a life of its own. A life with no
    round is left out (``Cell.by_life``, ``tools.bench_versions``)."""
    bounds = [*(range(len(ratios)) if lives is None else lives), len(ratios)]
    kept = [[r for r in ratios[a:b] if r is not None] for a, b in zip(bounds, bounds[1:])]
    return [math.exp(math.fsum(map(math.log, life)) / len(life)) for life in kept if life]


@dataclass(frozen=True)
class Cell:
    """One load of one profile: each model's window in each round (None where it failed)."""

    profile: str
    load: str
    closed: bool
    rounds: dict[str, list[Window | None]]  # by model, in the order run; grows while measured (``measure``)
    confidence: float = 0.95  # each look's interval (``looked``)
    wanted: int = 1  # rounds with both windows a verdict needs (``--rounds``); a lost window's round does not count
    served: list[Served] = field(default_factory=list)  # how auto served in each round's window
    dropped: dict[str, int] = field(default_factory=dict)  # a way no longer run: the round it was left out from
    # the round from which each life of the models ran (``by_life``); None: loaded once, each round read as a life
    lives: list[int] | None = None

    @property
    def statistic(self) -> str:
        return "throughput" if self.closed else "mean"

    def _kept(self, model: str) -> list[Window]:
        return [w for w in self.rounds[model] if w is not None]

    def _figure(self, window: Window) -> float:
        """One window's answers/s (closed) or mean ms (open)."""
        return pooled([window], self.statistic)

    @property
    def figures(self) -> dict[str, float]:
        """Each model's answers/s (closed) or mean ms (open) over its rounds' requests."""
        return {m: pooled(self._kept(m), self.statistic) for m in self.rounds}

    @property
    def best(self) -> str:
        figures = self.figures
        peers = {m: figures[m] for m in PEERS if not math.isnan(figures[m])} or {"plain": math.nan}
        return max(peers, key=peers.get) if self.closed else min(peers, key=peers.get)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.rounds)

    def paired(self, peer: str | None = None, model: str = "auto") -> list[float]:
        """``model`` over ``peer`` (by default the better way) in each round where both windows
        ran: side by side, so that what the host's load does to one round does it to both."""
        return [r for r in self._ratios(peer, model) if r is not None]

    def _ratios(self, peer: str | None, model: str) -> list[float | None]:
        """``paired``'s ratios, None for a round that lost a window."""
        pairs = zip(self.rounds[model], self.rounds[peer or self.best])
        return [self._figure(a) / self._figure(b) if a is not None and b is not None else None for a, b in pairs]

    def by_life(self, peer: str | None = None, model: str = "auto") -> list[float]:
        """``paired``'s ratios, one a life of the models (``lives``): the geometric mean of its
        rounds'. A model's process keeps a speed of its own while it lives: exact copies of one
        forced pipeline, loaded once, read 0.90x [0.88, 0.93] and 0.92x [0.86, 0.98] it over 20
        and 12 rounds, and 0.97x-1.00x loaded afresh every few rounds; so a verdict is read
        over lives, and rounds within one life do not count as independent
        (docs/results/check-process-lives). Where the models were loaded once (``lives`` None),
        each round is read as a life of its own, and their processes' own speeds go unseen."""
        return geometric_lives(self._ratios(peer, model), self.lives)

    def versus(self, peer: str | None = None) -> Ratio:
        """``auto`` over ``peer`` (by default the better way): its lives' ratios' geometric mean
        and its t interval at ``confidence`` (none from one life; NaN where no round has both)."""
        return across_rounds(self.by_life(peer), not self.closed, self.confidence)

    def spread(self) -> float:
        """How far the better way's own rounds lie apart (largest over smallest, less one): a
        verdict within the margin means little where this is larger."""
        found = [self._figure(w) for w in self._kept(self.best)]
        return max(found) / min(found) - 1 if len(found) > 1 else math.nan

    def running(self, turn: int) -> tuple[str, ...]:
        """The ways round ``turn`` runs, less those ``dropped``, in their order (``in_turn``)."""
        return in_turn(tuple(m for m in self.models if turn < self.dropped.get(m, turn + 1)), turn)

    def drop_worse(self, margin: float) -> None:
        """Leave the worse of plain and the pipeline out of the rounds still to run, once the
        other is ``clearly_better``: ``auto``'s verdict and choice read the better one alone, and
        its windows then run next to ``auto``'s, a round taking two windows where it took three."""
        better = self.clearly_better(margin)
        if better is not None:
            worse = next(p for p in PEERS if p != better)
            self.dropped.setdefault(worse, len(self.rounds["auto"]))

    def windows(self) -> list[list[str]]:
        """A line per window in the order measured: its round, model, figure, requests and
        seconds (the figure empty where the window failed; none for a way ``dropped``)."""
        lines = []
        for turn in range(len(self.rounds["auto"])):
            for model in self.running(turn):
                window = self.rounds[model][turn]
                lines.append([self.profile, self.load, str(turn + 1), model] + (
                    ["", "", ""] if window is None else
                    [f"{self._figure(window):.4g}", str(window.requests), f"{window.seconds:.3f}"])
                    + [str(self.served[turn]) if model == "auto" else ""])
        return lines

    def verdict(self, margin: float, model: str = "auto", peer: str | None = None) -> str:
        """``yes``, ``NO`` or ``unresolved``: ``model`` against ``peer`` (by default ``auto`` against
        the better way), ``intervals.against_margin`` over their lives (``by_life``);
        ``unresolved`` with fewer than the ``wanted`` rounds with both windows (a lost window's
        round does not count), or where two or more were wanted, fewer than two lives: one
        life's ratio alone would say yes or no, with no interval of its own."""
        rounds, lives = self.paired(peer, model), self.by_life(peer, model)
        if rounds and (len(rounds) < self.wanted or (self.wanted > 1 and len(lives) < 2)):
            return "unresolved"
        return against_margin(across_rounds(lives, not self.closed, self.confidence), margin)

    def served_as(self) -> dict[str, float]:
        """The seconds ``auto`` served as each peer (plain, pipeline) in its windows (``Served``)."""
        seconds = dict.fromkeys(PEERS, 0.0)
        for window in self.served:
            for peer, spent in window.as_peers().items():
                seconds[peer] += spent
        return seconds

    def clearly_better(self, margin: float) -> str | None:
        """The better way where the other is shown outside ``margin`` of it (by the test ``auto``'s
        verdict takes), else None: either way would do, or the rounds cannot tell."""
        worse = "pipeline" if self.best == "plain" else "plain"
        return self.best if self.verdict(margin, worse, self.best) == "NO" else None

    def choice(self, margin: float) -> str:
        """``right``, ``wrong`` or ``mixed``: whether ``auto`` served as the clearly better way
        (``RIGHT_SHARE`` of its time, or at most the rest); ``either`` where no way is clearly
        better; ``-`` where its serving seconds were not read."""
        seconds = self.served_as()
        if not sum(seconds.values()):
            return "-"
        better = self.clearly_better(margin)
        if better is None:
            return "either"
        share = seconds[better] / sum(seconds.values())
        return "right" if share >= RIGHT_SHARE else "wrong" if share <= 1 - RIGHT_SHARE else "mixed"

    def served_label(self) -> str:
        """How ``auto`` served while measured: each way's share of its seconds."""
        seconds = self.served_as()
        total = sum(seconds.values())
        return " / ".join(f"{way} {spent / total:.0%}" for way, spent in seconds.items() if spent) if total else "-"
