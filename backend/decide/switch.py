"""Pipelined or plain while serving (``ModeSwitch``), and the stub's costs each way as the
windows served show them (``ServedLine``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ..manifest import LatencyTable
from .costs import LEAST_SHARE, HostCosts, Mode, device_s, middle_length, ms, way
from .load import capacities
from .trial import Trial
from .window import (LOAD_STEP, MIN_ANSWERS, SWITCH_GAIN, Window, beyond_first, engines_off, half_octave,
                     in_model, measured_s, moved, round_trip_s)

# Answers a window needs for the stub's measured costs to be corrected by it, and for what it shows
# tritonserver's CPU cost a request to be kept: over fewer, work that is not this model's
# requests weighs in them (the metrics' export; in a server shared with other models, theirs: a
# window in which this model's load stopped and another's began once read 2,656 us a request
# pipelined, against 1,111 served plain, and kept a closed loop plain that the pipeline served
# 1.6x faster).
CORRECT_AFTER = 200
# Windows served one way whose batch sizes lie this far apart (the largest mean rows a run over the
# least) give that way's stub costs a line of their own (``ServedLine``), which replaces loading's.
LINE_SPREAD = 2.0
# A pipelined window in which more than this share of the batches ran inline (``LoneRuns``) served
# both ways: it bounds plain's stub cost from above and draws no way's line (``ModeSwitch._learn``).
MIXED_INLINE = 0.1
LINE_KEEPS = 3  # windows a line keeps of each half octave of batch sizes (the latest)
# Windows at capacity, served plain one request a call, after which a load that reads as the one
# last tried is tried again (``ModeSwitch._another_load``), doubled at each such try, up to
# RETRY_MAX: a load told from the one tried by nothing the windows show costs, where it is the
# same, a trial's two windows in RETRY_MAX at most.
RETRY_WINDOWS = 4
RETRY_MAX = 64


@dataclass(frozen=True)
class Seen:
    """What the ``ModeSwitch`` kept of a window for the next: its answers/s, the round trip it
    showed served plain (``round_trip_s``; None pipelined), and the way it found better (None: the
    one served)."""

    rate: float
    trip: float | None
    wanted: Mode | None


class Excess(NamedTuple):
    """A way's stub seconds a request beyond loading's, and the answers/s and requests a run of
    the window it is from; ``inline``: a pipelined window whose lone batches ran inline, where
    plain's figure is a bound (``ModeSwitch._learn``)."""

    seconds: float
    rate: float
    requests: float
    inline: bool = False


@dataclass
class ServedLine:
    """The stub's CPU seconds a batch and a request as the windows served one way show them: a
    least-squares line through each window's seconds a request against its batches a request
    (``1 / requests`` a run), once windows ``LINE_SPREAD`` apart in batch size are kept; each half octave
    of batch sizes counts as the median of its latest ``LINE_KEEPS`` windows (one window that
    holds other work, a drain, moves no line). Loading measures each way apart from Triton
    (``calibrate.py``): not what the stub spends receiving a call's requests and sending their
    responses, which is a cost a call as well as a request. Held from 1 to 64 in flight on one
    core, plain served three uneven timed stages at 314 us a batch and 106 a request where
    loading had measured 75 and 10, and TensorRT-speed BERT-base at 287 and 89 against 71 and 8
    (docs/results/served-cost-lines): what a window shows at one batch size says little of
    another."""

    _kept: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # half octave: (1 / requests, s each)

    def add(self, requests: float, per_request_s: float) -> None:
        kept = self._kept.setdefault(half_octave(requests), [])
        kept.append((1 / max(requests, 1.0), per_request_s))
        del kept[:-LINE_KEEPS]

    def fit(self) -> tuple[float, float] | None:
        """(seconds a batch, seconds a request), or None while the windows kept span too few batch sizes."""
        points = [sorted(kept, key=lambda point: point[1])[(len(kept) - 1) // 2] for kept in self._kept.values()]
        xs = [x for x, _ in points]
        if not points or max(xs) < LINE_SPREAD * min(xs):
            return None
        mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
        if slope <= 0:  # no cost a batch shows: all of it a request's
            return 0.0, my
        if my - slope * mx < 0:  # no cost a request shows: all of it a batch's
            return sum(x * y for x, y in points) / sum(x * x for x in xs), 0.0
        return slope, my - slope * mx


@dataclass
class ModeSwitch:
    """Serves pipelined or plain, whichever answers the load seen sooner (auto on engines that
    overlap). Each window it reads the utilisation of every limit serving has in the way it serves
    now (the stub's interpreter, the host's cores with tritonserver and the other processes on
    them, the engines: the bottleneck stage pipelined; plain, the instance: its time inside
    ``execute`` and each request's round trip in series where the clients wait on their answers,
    ``round_trip_s``), and predicts the other
    way's at the same load, scaling the stub's time by the two ways' measured costs at the batch
    size seen and reading the engines' from the tables. From each way's utilisation ``u`` it
    predicts a request's mean latency: a batch's own time through the stages and the stub
    (pipelined, with the hand-offs' latency: ``HostCosts.handoff_s``), plus the wait for the limit
    ahead of it, a queue's ``s u / (2 (1 - u))`` for a limit that serves a batch in ``s`` (the whole
    batch's time plain, the bottleneck's pipelined: the pipeline's multi-entry lets a request into
    stage 0 while another runs, or where its ``execute`` waits for stage 0, no less than that call
    with its requests' round trip: ``_entry_s``; the other way's host taken ``SWITCH_GAIN`` busier than predicted,
    the model's error; the wait taken only as often as the requests found a batch ahead, against
    random arrivals: ``_overlap``). The way served is read as its window measured it, the other as
    late against its prediction as when last served at that load, or the nearest it was served at
    (``_as_measured``). It switches
    when the other way's latency is ``SWITCH_GAIN`` below the current one's in two windows in a row at rates within
    ``SWITCH_GAIN`` of each other (a window may hold a load starting or stopping, whose rate is
    neither's). At light load both ways predict
    about a batch's own time, unless the hand-offs' latency weighs in it, and the mode stays (the
    lone batches of a pipeline run inline where ``LoneRuns`` says so). Where the way served now is
    overloaded, or served plain with the clients waiting on their answers and the instance busy
    within ``SWITCH_GAIN`` of all the time (a round trip seen), its answers per second are its
    capacity, not the load (which may be higher), so a prediction at that rate says only how the
    other way's capacity compares: overloaded, it switches where the other would be ``SWITCH_GAIN``
    less busy, as where both would be overloaded (a prediction just under capacity, within the
    model's error, once flipped the near-zero profile every 1.5 s between plain serving and a
    pipeline that carries a third less, through a load at 0.9 of the plain capacity:
    docs/results/check-auto-client-core). In such a loop it tries the other (``Trial``): the idle
    between calls that reads as one is also Triton's hand-off from one call to the next under an
    open load, whose answers no way raises (MiniLM's six FP16 stages from an H100, served plain
    98 % busy under Poisson 1,000/s, went straight to a pipeline predicted 79 % busy, which
    answered in 10.8 ms where the plain model took 7.3: docs/results/check-minilm-fp16-six).
    (Switching back to the pipeline whenever both had room once cost the next load its first second:
    the near-zero profile's pipeline carries about half of what its plain path does;
    docs/results/check-auto-2core-noslack.) A window with hardly any answers changes nothing (when a
    load stops and starts again, as a benchmark's windows do, it is served as it was). Each way's
    stub costs measured at load are corrected by what the windows served that way show against them
    (``costs``: what a request cost beyond loading's, added to it; a way not served yet is taken
    to be off by as much as the way served now), or, once its windows span batch sizes enough to
    draw a line through them, replaced by it (``ServedLine``),
    and tritonserver's cost per request is learnt for each way while it is served that way, where
    it can be read, over windows of ``CORRECT_AFTER`` answers (a pipelined request never taken to
    cost it less than a plain one: ``_server_s``).

    Where the way served is at capacity and the other is predicted less busy, but within the model's
    error, the other is tried (``Trial``); so is plain where the pipeline is within the model's
    error of capacity and plain, in the batches it would gather, is predicted less busy than the
    pipeline is and than it would be in batches as large (``_batched``). The way tried is served for
    ``TRIAL_WINDOWS`` and kept where it answered ``TRIAL_GAIN`` more (or as many, sooner as
    measured: ``Trial``), as ``EntryWait`` tries
    returning at once. At capacity the answers/s are the way's capacity, so they decide where the
    costs cannot (three uneven timed stages at 64 in flight, served plain, had the pipeline
    predicted 93 % busy against plain's 99 %, and plain stayed, at 0.84x the answers of the forced
    pipeline; the costs then carried plain's correction to the pipeline as a factor). One trial a
    load: none again until the load moves (``_another_load``); a trial whose load stops pauses,
    and runs on with the next load (``_pause``)."""

    tables: Sequence[LatencyTable]
    costs: HostCosts
    cores: float
    statistic: str = "mean"
    shared_host: bool = False
    mode: Mode = Mode.PIPELINE
    # The whole model's table where a batch served plain runs it as one engine (``Mode.FUSED``:
    # ``Manifest.fused``); without it the stages run in turn (``Mode.IN_TURN``).
    whole: LatencyTable | None = None
    batcher_delay_s: float = 0.0  # Triton's batcher's max_queue_delay (``round_trip_s``)
    # Whether a pipelined ``execute`` waits until stage 0 computed its queries (``waits``): its
    # calls then hold Triton's instance one after another as plain serving's do, each with its
    # requests' round trip in series (``_entry_s``).
    entry_waits: bool = False
    # A configured policy's pipeline (not ``auto``): the windows are read for ``host_busy`` alone
    # (``EntryWait``) and the way served never changes.
    pinned: bool = False
    last: str = "nothing seen yet"  # why the mode is what it is: for the log
    measured: HostCosts = field(init=False)  # the costs as loading measured them, which windows correct
    # tritonserver's CPU seconds per request as seen served each way, the latest at each half octave
    # of answers/s, the latest sight last (``server``; a pipelined answer is a ``send()`` of its own:
    # 2-3x what an answer in ``execute``'s list costs it under load, docs/results/send-cost-2core):
    # what the load did to the way served now's, it is taken to have done to the other's
    # (``_server_s``); a way not served yet is taken to cost what the other does
    server_at: dict[Mode, dict[int, float]] = field(init=False, default_factory=dict)
    # Each way's stub seconds a request beyond loading's at the batch size seen, the answers/s and
    # the requests a run it was seen at, as last seen served that way. Loading runs each way apart from Triton
    # (``calibrate.py``): what it leaves out is mostly the stub's work receiving a call's requests
    # and sending their responses, about as much a request whichever way serves, not a share of
    # each way's own cost (a factor a way, read from the way served and carried to the other, made
    # the pipeline of three uneven stages twice loading's where it was 1.2x, and plain's base, a
    # seventh of the pipeline's, 1.4x where it was 7x: docs/results/served-cost-lines). A way not
    # served yet is taken to be off by as much as the way served now, and one last seen at a load
    # lighter by ``SWITCH_GAIN`` by no less: a load that runs the stub beside tritonserver's
    # threads makes both ways dearer alike (the pipeline seen at one request in flight as loading
    # measured it, against plain seen under 1,017 Poisson answers/s, once sent TensorRT speed to a
    # pipeline that cost more than loading's too: docs/results/served-plain-bookkeeping). (One
    # correction for both ways, read from the way served, once had the switch flip every 1.5 s at
    # near-zero compute: each window served plain forgot how much dearer the pipeline had just
    # shown itself.) A call's own share of what loading leaves out falls on each of its requests
    # as a request's: a way last seen in runs of half as many requests or fewer is taken to be off
    # by no more than the way served now, and at a lighter load, by as much (plain, seen at one
    # request in flight 127 us a request over loading's, was predicted so at 64 in flight in runs
    # of 21, 164 % busy where it spent 37 us a request and answered 1.1x what the pipeline did:
    # docs/results/check-held-out-runs).
    excess: dict[Mode, Excess] = field(init=False, default_factory=dict)
    lines: dict[Mode, ServedLine] = field(init=False, default_factory=dict)  # each way's costs as served
    # Each way's engines as times their tables' seconds, as last seen served that way (``engines_off``;
    # 1 where the host's own time explains what they took); a way not served yet is taken to be off
    # by as much as the way served now. The way served shows its own engines' time, but the other's
    # is read from the tables: off by a factor, each way looks dearer served than the other predicted.
    engines: dict[Mode, float] = field(init=False, default_factory=dict)
    # Each way's mean latency as measured (``measured_s``) over its prediction (``_latency``), by
    # the half octave of answers/s it was seen at, the latest ``LINE_KEEPS`` windows served that
    # way there: the model leaves out what it cannot see (a pipelined request's hand-offs between
    # threads waiting for the interpreter, a plain call's queue that a request's round trip
    # overstates), so the way served is read as measured and the other as its prediction was off
    # when last served. Predictions alone once switched
    # TensorRT-speed BERT-base under Poisson 1,059/s to a pipeline predicted at 1.80 ms against
    # plain's 2.34, which answered in 3.43 ms where the plain model took 2.25, and kept it for the
    # load's four minutes, the prediction unchanged (docs/results/switch-measured-latency).
    late: dict[tuple[Mode, int], list[float]] = field(init=False, default_factory=dict)
    # Served plain, what each request last held the next batch back in series (``round_trip_s``),
    # and the answers/s it was seen at: a load served pipelined at less than ``1 - SWITCH_GAIN``
    # of that rate is taken as another one (a closed loop served faster answers no less), where
    # plain serving is predicted without it. Of two steady windows, the less (a load starting within
    # a window leaves it idle too: at 16 in flight, the first window read 8 ms a request at 97
    # answers/s); a switch needs two (``observe``), so the round trip it acted on is such a one.
    round_trip: tuple[float, float] = field(init=False, default=(0.0, 0.0))
    _seen: tuple[Mode, float] = field(init=False, default=(Mode.PIPELINE, 0.0))  # the last window's way, how busy
    _before: Seen | None = field(init=False, default=None)  # the window before, since the last switch
    trying: Trial | None = field(init=False, default=None)  # the way served now on trial, against the other
    # The answers/s, rows a run and requests in the model (None where the latency went unmeasured)
    # at which the last trial began, or a kept one ended; a pause keeps it, and clears it after a
    # trial cut as its load moved (``_another_load``).
    _tried_at: tuple[float, float, float | None] | None = field(init=False, default=None)
    # The last trial ended as its load moved within it: its load is free to be tried again after a
    # pause (a load that stopped), not while it goes on (``_trial``).
    _cut: bool = field(init=False, default=False)
    # How the trial's last window moved from its load (``Trial.ended``): it ends unless the load
    # stopped, which pauses it (``_pause``).
    _moving: str = field(init=False, default="")
    # Windows at capacity since the last trial, at its load as far as they show (the requests in the
    # model unread), and how many of them try its load again (``_another_load``).
    _unread: int = field(init=False, default=0)
    _retry: int = field(init=False, default=RETRY_WINDOWS)

    def __post_init__(self):
        self.measured = self.costs

    @property
    def _room(self) -> int:
        """The requests a call may hold beyond its first (the largest batch tabled, less one)."""
        return int(self.tables[0].batch_sizes[-1]) - 1

    @property
    def _full(self) -> bool:
        """Whether served plain, one request a call (``max_batch_size`` 1): then its
        calls show no queue (``_overlap``), Triton's holds the rest out of the stub's sight, and
        the latency it measures leaves them out (``measured_s``). So four 2 ms stages at 16 in
        flight, served plain 96 % busy at 117 answers/s, read as a lone request's loop answered
        in 12 ms, and kept plain where the pipeline answered 403/s; a trial of it read 16 requests
        in the model to plain's 1.4, falling behind, and was refused. (Calls of a larger largest
        batch show a queue up to it, and measure the latency of one that fits in a call.)"""
        return self.mode is not Mode.PIPELINE and not self._room

    @property
    def plain(self) -> Mode:
        """How a batch served plain runs."""
        return Mode.IN_TURN if self.whole is None else Mode.FUSED

    def begin(self) -> Mode:
        """The way to serve before any window has shown a load, by loading's costs and the
        tables: plain where it answers a lone request sooner (``_latency`` at no load) and
        carries more at capacity (``capacities``), each by ``SWITCH_GAIN``; else pipelined, the
        paper's multi-entry, and where the two ends disagree the windows decide. Started
        pipelined whatever the costs, a fresh server served a load's first windows so until two
        agreed and a trial of plain ran: BERT-base's two FP16 stages as CUDA graphs on an H100,
        whose pipelined batch costs the stub 1,227 us against 539 plain, answered 0.71x the
        plain model at 16 in flight (docs/results/h100-graphs-served); loaded afresh and measured
        from its first second, near-zero compute on this project's 2-core host read 0.91x /
        0.93x / 0.94x the plain model at 1 / 16 / 64 in flight, and beginning plain 0.97x /
        1.05x / 1.02x (docs/results/begin-plain)."""
        lone = {mode: self._latency(mode, busy=0.0, rows=1.0, requests=1.0, series=0.0)
                for mode in (Mode.PIPELINE, self.plain)}
        most = capacities(self.tables, self.costs, self.cores, self.statistic, self.shared_host)
        if (lone[self.plain] < (1 - SWITCH_GAIN) * lone[Mode.PIPELINE]
                and most["pipeline"] < (1 - SWITCH_GAIN) * most["plain"]):
            self.mode = self.plain
        self.last = (f"begins {way(self.mode)}: a lone request {ms(lone[Mode.PIPELINE])} pipelined, "
                     f"{ms(lone[self.plain])} plain; at most {most['pipeline']:.0f} answers/s pipelined, "
                     f"{most['plain']:.0f} plain (by loading's costs)")
        return self.mode

    def observe(self, window: Window, trial: bool = False) -> Mode | None:
        """Take a window served ``self.mode``; the mode to serve where it switches or keeps a
        trial (``Trial``), else None.
        ``trial``: a window of ``EntryWait``'s trial of returning at once, which serves the
        pipeline as it may not go on serving: its costs are learnt, but it decides nothing,
        nor pairs with the window after it (three uneven timed stages at 64 in flight went
        plain on a trial's two windows, batches of 9.3 rows where waiting for stage 0 forms
        17, and answered 0.84x the forced pipeline)."""
        if window.seconds <= 0:
            return None
        if window.answered < MIN_ANSWERS:  # nothing to go by: the load that comes next is likely the last one's
            self._before = None  # ... but not the same one: no window across a pause agrees with one before it
            if self.trying is not None:
                self._pause()
            elif self._cut:
                self._tried_at, self._cut = None, False
            return None
        rows, requests = max(window.rows, 1.0), window.requests
        rate = window.answered / window.seconds
        took = None if self._full else measured_s(window)
        # A window in which a trial's load moved holds two loads, neither the trial's, as does the
        # one after it where the load went on: it teaches nothing.
        moved_now = self.trying is not None and not self._moving and self.trying.moved(rate, took)
        ending = moved_now or bool(self._moving) or (self.trying is not None and window.paused)
        tabled = window.answered / requests * self._tabled_s(Mode.IN_TURN if self.mode is Mode.PIPELINE else self.mode,
                                                             rows)
        if not ending:
            self.engines[self.mode] = engines_off(window, tabled)
        # Over enough answers that the stub's per-second work, the metrics' export, weighs little in them.
        learns = not ending and window.answered >= CORRECT_AFTER
        if learns:
            inline = min(window.inline * requests / window.answered, 1.0)  # the share of its runs inline
            self._learn(window.stub_s / window.answered, requests, rate, inline)
        if learns and window.server_s is not None:
            seen, load = self.server_at.setdefault(self.mode, {}), half_octave(rate)
            seen.pop(load, None)
            seen[load] = window.server_s / window.answered
        if trial or self.pinned:
            self._before = None
            return None
        before = self._before
        steady = before is not None and not moved(rate, before.rate)
        trip = round_trip_s(window, self.batcher_delay_s) if self.mode is not Mode.PIPELINE and window.executes \
            else None
        if trip is not None:
            self.round_trip = (min(trip, before.trip) if steady and before.trip is not None else trip, rate)
        series = self._series_s(rate)
        plain = self.plain
        other = self._other
        engines, host = self._predicted(other, window, series)
        busy = {self.mode: self._utilisation(self.mode, window, series), other: max(engines, host)}
        self._seen = (self.mode, busy[self.mode])
        # The way served now shows how busy it is; the other's host is a prediction, weighed as busier
        # by the model's error: near capacity a few points decide the wait (a near-zero model, plain
        # 100 % busy, switched to a pipeline predicted 98 %, which could not carry the load).
        overlap = self._overlap(window, rows, requests)
        load = half_octave(rate)
        latency, measured = self._as_measured({
            self.mode: self._latency(self.mode, busy[self.mode], rows, requests, series, overlap),
            other: self._latency(other, max(engines, host * (1 + SWITCH_GAIN)), rows, requests, series, overlap)},
            took if window.answered >= CORRECT_AFTER and busy[self.mode] < 1 - SWITCH_GAIN else None, load)
        self.last = (f"{rate:.0f} answers/s, {rows:.1f} rows a run"
                     f"{f' ({requests:.1f} requests)' if requests < rows - 0.05 else ''}"
                     f"{f', requests overlapping {overlap:.0%} as often as at random' if overlap < 0.995 else ''}: "
                     f"{ms(latency[Mode.PIPELINE])} pipelined ({busy[Mode.PIPELINE]:.0%} busy"
                     f"{self._late_text(Mode.PIPELINE, load, measured)}), "
                     f"{ms(latency[plain])} plain ({busy[plain]:.0%}, {series * 1e6:.0f} us a request's round trip "
                     f"in series{self._late_text(plain, load, measured)}) ({self.costs.describe()}, tritonserver "
                     f"{self._server_text()}{self._engines_text()})")
        # Its answers are its capacity, not the load, where it is overloaded, and where the clients
        # wait on their answers (a round trip in series) and keep the instance busy within the
        # model's error of all the time: weigh capacities. So too where a call holds one request,
        # which shows no queue behind it (``_full``).
        looped = (series > 0 or self._full) and self.mode is not Mode.PIPELINE and busy[self.mode] >= 1 - SWITCH_GAIN
        if self.trying is not None:
            self._before = None
            return self._trial(rate, rows, took, moved_now, window)
        overloaded = math.isinf(latency[self.mode])
        capped = looped or overloaded
        if capped:  # ... and a loop is a guess at the load's kind, which only a trial's answers confirm (``Trial``)
            better = overloaded and busy[other] < busy[self.mode] * (1 - SWITCH_GAIN)
        else:
            better = latency[other] < latency[self.mode] * (1 - SWITCH_GAIN)
        # Pipelined within the model's error of capacity, plain is tried where its batches would carry more.
        near = capped or (self.mode is Mode.PIPELINE and busy[self.mode] >= 1 - SWITCH_GAIN)
        at_capacity = near and (busy[other] < busy[self.mode] or (
            other is not Mode.PIPELINE and self._batched(window, series, busy[self.mode])))
        bounded = not capped and self._bounded(other, latency)
        tries = (at_capacity or bounded) and not better and self._another_load(rate, rows, took)
        self._before = Seen(rate, trip, other if better or tries else None)
        if not (better or tries) or not steady or before.wanted is not other:
            return None  # a window may hold a load starting or stopping: the one before must agree
        if not better:
            self.trying = Trial((before.rate + rate) / 2, took, capped=capped)
            self._tried_at = (self.trying.baseline, rows, in_model(self.trying.baseline, took))
            self._cut, self._unread = False, 0
            why = f"{way(self.mode)} at capacity" if at_capacity else "plain not yet served, within the model's error"
            self.last = f"a trial, {why}: {self.last}"
        return self._switch(other)

    def _bounded(self, other: Mode, latency: dict[Mode, float]) -> bool:
        """Whether ``other`` is plain, not yet served (no window has taught its costs: ``lines``),
        and predicted within the model's error of the pipeline (no more than ``SWITCH_GAIN``
        later), where that prediction rests on an upper bound of its costs: tritonserver's a
        request taken as the pipeline's (``_server_s``; a pipelined answer is a ``send()`` of its
        own, which costs it more), or the stub's as windows whose lone batches ran inline bound it
        (``_learn``): a trial then says which is sooner. A prediction that comes that close
        from above may well be sooner: TensorRT-speed BERT-base over HTTP under Poisson 1,530/s,
        the server on one core, pipelined in 2.1-3.1 ms a request, predicted plain at 2.5-3.0 ms
        and stayed pipelined until two windows' noise crossed the gain, 35 s into a life; served
        plain, it answered in 1.4-1.5 ms, the stub and tritonserver at 115-130 and 158-182 us a
        request where 154-180 and 229 were taken (docs/results/http-clients). The pipeline not yet
        served is predicted from lower bounds (tritonserver's cost as plain's): one that still
        does not come out sooner is not tried."""
        if other is Mode.PIPELINE or other in self.lines:
            return False
        carried = other not in self.server_at and Mode.PIPELINE in self.server_at
        inline = other in self.excess and self.excess[other].inline
        return (carried or inline) and latency[other] < (1 + SWITCH_GAIN) * latency[Mode.PIPELINE]

    def _as_measured(self, predicted: dict[Mode, float], took: float | None,
                     load: int) -> tuple[dict[Mode, float], bool]:
        """Each way's mean latency at ``load`` (a half octave of answers/s), and whether the way
        served now's was measured: that way's as its window measured it (``took``; None where it
        cannot, or where the window answered too few, or was within the model's error of
        capacity, where the predicted queue grows without bound and the answers say the way's
        capacity, not the load's latency: then as predicted), the other's predicted times its
        ``late`` at this load, or where it was not served there, as near it as it was (``_late_key``)."""
        now = self.mode
        if took is not None:
            kept = self.late.setdefault((now, load), [])
            kept.append(took / predicted[now])
            del kept[:-LINE_KEEPS]
        return {mode: took if mode is now and took is not None else seconds * self._late(mode, load)
                for mode, seconds in predicted.items()}, took is not None

    def _late(self, mode: Mode, load: int) -> float:
        """How many times its predicted latency ``mode``'s was measured served at ``load`` (a
        half octave of answers/s), the median of its latest windows there (``_late_key``); 1
        where no way was seen served there or so. The way not served now, seen only at loads more
        than a half octave away, is taken no sooner than its model: what the model leaves out
        changes with the load (the queue's share of a request's latency grows with it), and a
        pipeline answered in 0.66x its model at 2,900 answers/s in runs of 12.8 rows would put it
        at 0.92 ms at 1,026/s, against plain's measured 1.59 (TensorRT speed over HTTP under
        Poisson 1,608/s, served plain in 1.45 and 1.37 ms, predicted the pipeline, last served at
        4,128 answers/s, at 1.22 and then 0.88 ms, and switched to it, where the forced pipeline
        answered in 3.43 ms: docs/results/http-clients). Later than its model, it is taken so: a
        switch away from the way served then needs more. (Tried rather than switched to, such a
        way was left again as the load moved within the trial: under bursts of 1,000 and
        4,000 Poisson requests/s, trials of plain begun in the light phase ended in the heavy one,
        back on a pipeline that could not carry it, 2.0x the plain model's mean where switching
        outright read 0.59x: docs/results/trial-in-model.) So is a way never seen, which borrows the
        way served now's lateness (``_late_key``): plain's error is its own, and plain at 0.42x
        its model at 1,535 answers/s put a pipeline served only at capacity at 0.75 ms against
        plain's measured 1.36, where it then answered in 3.09 and 2.47 ms (TensorRT speed over
        HTTP, Poisson at 0.3 of capacity: docs/results/trial-in-model/check-trt-borrowed.txt)."""
        key = self._late_key(mode, load)
        if key is None:
            return 1.0
        kept = sorted(self.late[key])
        late = kept[(len(kept) - 1) // 2]
        own = key[0] is mode and abs(key[1] - load) <= 1
        return late if mode is self.mode or own else max(late, 1.0)

    def _late_key(self, mode: Mode, load: int) -> tuple[Mode, int] | None:
        """Whose lateness stands for ``mode``'s at ``load``: its own there; a way not seen at that
        load, its own at the nearest load it was seen at (what the model leaves out belongs to
        the way: a pipeline's hand-offs, a plain call's queue); a way never seen, the way served
        now at that load (where that is late, the two predictions then decide, as before any
        measure; where it is early, ``_late`` keeps the other at its model); None where none was.
        Taken as late as the pipeline, which answered in 2.9 ms under a load that plain had not
        served, plain was predicted at 3.0 ms, where its own lateness, a half octave up, put it at
        0.8 (docs/results/switch-mixed-windows)."""
        seen = [at for way, at in self.late if way is mode]
        if seen:
            return mode, min(seen, key=lambda at: (abs(at - load), at))
        return (self.mode, load) if (self.mode, load) in self.late else None

    def _late_text(self, mode: Mode, load: int, measured: bool) -> str:
        """For the log: the latency measured, or how far a prediction was taken off its model."""
        if mode is self.mode:
            return ", measured" if measured else ""
        key = self._late_key(mode, load)
        if key is None or key[0] is not mode:
            return ""
        at = "this load" if key[1] == load else f"{2 ** (key[1] / 2):.0f} answers/s"
        return f", {self._late(mode, load):.2g}x its model as measured served so at {at}"

    def _batched(self, window: Window, series: float, busy: float) -> bool:
        """Whether plain serving, carrying a pipelined window's answers in batches as large as
        the tables go, would be less busy than the pipeline is (``busy``) and than it would be in
        batches as large: what plain's capacity allows, where a trial says whether the load lets
        it gather them (a closed loop of fewer requests cannot). A pipeline's stage 0 gathers what
        arrives during one stage, a plain call what arrives during the whole model, so a pipeline
        near capacity predicts plain at its own rows a run, busier than plain would be: six stages
        of 0.7-1 ms (BERT-base in FP16 on an H100) at 64 in flight on a one-core server pipelined
        at 17.6 rows a run, 99 % busy at 2,200 answers/s, predicted plain 90-103 % busy at those
        rows and stayed, at 0.82x the plain model, which ran 48 rows a call
        (docs/results/trial-plain-batches). But a pipeline is busy in small batches under an open
        load well below its capacity too, and its batches grow with the load as plain's do: where
        it is predicted less busy in batches as large, plain carries less whatever the load (the
        slower engine's two stages under Poisson 420/s, 2.3 rows a run and 88 % busy, tried plain,
        predicted 53 % busy in its largest batches where the pipeline would be 34 %, after every
        pause, each trial two windows of an overloaded plain: 1.08x the forced pipeline's mean,
        docs/results/check-held-out-four)."""
        rows = max(float(self.tables[0].batch_sizes[-1]), window.rows)
        plain = max(self._predicted(self.plain, window, series, rows=rows))
        return plain < busy and plain < max(self._predicted(Mode.PIPELINE, window, series, rows=rows))

    def _another_load(self, rate: float, rows: float, took_s: float | None) -> bool:
        """Whether a load at capacity is another than the one last tried (``Trial``): none tried, or
        the last trial's load moved within it and a pause followed (``_trial``), or its answers/s
        moved by ``SWITCH_GAIN``, or the requests in the model (Little's law: answers/s times their
        measured latency, ``took_s``) by ``LOAD_STEP`` times, or where either latency went
        unmeasured its rows a run by twice ``SWITCH_GAIN``. At capacity the answers/s stay where the
        load grows, and the requests in the model show it: ResNet-50's stages from an H200 on a
        one-core server, served plain at capacity, tried the pipeline at 16 in flight (12 rows a
        run) and that load ended within the trial; at 64 in flight (16 rows a run) plain answered
        930/s again and the pipeline was not tried, at 0.87x the forced pipeline's answers
        (docs/results/trial-another-load). Rows a run alone move with the host's speed where an open
        load keeps plain busy: TensorRT speed under Poisson 2,208/s, plain 94-98 % busy in runs of
        3.2 to 4.8 rows, each answered in 2.1-3.3 ms, tried the pipeline five times in six rounds,
        each time refused, 8 ms a request pipelined (docs/results/calibration-whole-batches). A
        trial that ran its course is a verdict on its load, which a pause does not undo: the same
        load after it is not tried again (MiniLM's one stage from an H100 under Poisson 3,216/s,
        plain 100 % busy in calls of 20.6 rows that take as long as one row's, tried the pipeline
        after every pause between a check's rounds, each time refused, each time two windows served
        the later way: docs/results/check-held-out-rest). Served plain one request a call, a load
        at the same answers/s may still be another, the requests in the model unread (16 in
        flight reads as one in flight does, ``_full``): it is tried again after ``_retry`` such
        windows, each time twice as many, up to ``RETRY_MAX``."""
        if self._tried_at is None:
            return True
        at, rows_at, held_at = self._tried_at
        if moved(rate, at):
            return True
        held = in_model(rate, took_s)
        if held is not None and held_at is not None:
            return max(held, held_at) > LOAD_STEP * min(held, held_at)
        rows_moved = moved(rows, rows_at, 2 * SWITCH_GAIN)
        if rows_moved or self._room:
            return rows_moved
        self._unread += 1
        if self._unread < self._retry:
            return False
        self._unread, self._retry, self._tried_at = 0, min(2 * self._retry, RETRY_MAX), None
        return True

    def _learn(self, per_request_s: float, requests: float, rate: float, inline: float = 0.0) -> None:
        """The stub's seconds a request served as now at ``requests`` a run and ``rate`` answers/s,
        against what loading measured: each way's costs from its own line where it has one
        (``ServedLine``), else loading's and the excess a request last seen served that way (no
        less than the way served now's where that was at a load lighter by ``SWITCH_GAIN``, no
        more where it was in runs of half as many requests or fewer, the way served now's where
        both), or, not served yet, the way served now's.

        A pipelined window whose runs ran ``inline`` (their share) beyond ``MIXED_INLINE`` served
        both ways, and bounds plain's excess: a pipelined request costs the stub no less beyond
        loading's than a plain one (its answer is a ``send()`` of its own), so what such a window
        shows beyond loading's costs of the two in those shares is plain's excess at most. Plain
        keeps what it was taken to cost up to that, as seen at that window's load; the pipeline's
        stays as it was, and no line is drawn through the window. Teaching nothing, such windows
        once left plain the excess of a model's first two windows for its life: TensorRT-speed
        BERT-base on one core under Poisson 2,268/s, 278 us a request from windows of 824
        answers/s (346 us a request), where the later ones, 36-80 % of their runs inline, showed
        97-132 us a request in all, and plain, never served, read 109-143 % busy
        (docs/results/one-core-knee-served-lean). Taken as both ways' excess, what such a window
        shows put plain at what the pipeline's lone batches cost inline: near-zero compute at one
        request in flight, 145-166 us a request where plain, served, spent 104-132, and plain,
        predicted within ``SWITCH_GAIN`` of the pipeline, was not served for whole lives that
        answered 0.84x-0.90x the plain model (docs/results/mixed-windows-teach)."""

        def taken(mode: Mode) -> float:  # a request's excess in the costs as they stand
            return (self.costs.stub_s(mode, requests) - self.measured.stub_s(mode, requests)) / requests

        if inline > MIXED_INLINE:
            predicted = ((1 - inline) * self.measured.stub_s(Mode.PIPELINE, requests)
                         + inline * self.measured.stub_s(self.plain, requests)) / requests
            bound = max(per_request_s - predicted, -(1 - LEAST_SHARE) * predicted)
            self.excess[self.plain] = Excess(min(taken(self.plain), bound), rate, requests, inline=True)
            now = taken(Mode.PIPELINE)
        else:
            predicted = self.measured.stub_s(self.mode, requests) / requests
            now = max(per_request_s - predicted, -(1 - LEAST_SHARE) * predicted)
            self.excess[self.mode] = Excess(now, rate, requests)
            self.lines.setdefault(self.mode, ServedLine()).add(requests, per_request_s)

        def excess(mode: Mode) -> float:
            seen, at, runs_of, _ = self.excess.get(mode, Excess(now, rate, requests))
            lighter, fewer = at < (1 - SWITCH_GAIN) * rate, runs_of * LINE_SPREAD <= requests
            if fewer:  # its excess held a call's costs spread over fewer requests: at most as much now
                return now if lighter else min(seen, now)
            return max(seen, now) if lighter else seen

        costs = self.measured.plus(excess(Mode.PIPELINE), excess(self.plain))
        lined = []
        for mode, line in self.lines.items():
            if (fit := line.fit()) is not None:
                costs = costs.served(mode, *fit)
                lined.append(mode)
        self.costs = replace(costs, how=self._corrected(lined))

    def _corrected(self, lined: list[Mode]) -> str:
        """What the costs are read from, for the log: loading's, a request's corrected by the
        windows each way was last seen served at (a way not seen, as far off as the way served now),
        or each way's line as served (``ServedLine``). A figure learnt from one window holds until
        another window of that way teaches: TensorRT-speed BERT-base on one core under Poisson
        2,268/s, a model's first two windows after loading answered 1,132 and 824/s, its stub 316
        and 346 us a request, and left 278 us more on each request of both ways for the rest of its
        life (its later windows, 36-80 % of their runs inline, then taught nothing: ``_learn``), and
        the log said "measured at load" of them (docs/results/one-core-knee-served-lean). Now it
        says which window a figure is from, and where plain's is a bound from a window that served
        both ways (lone batches inline)."""
        seen = [f"{way(mode)}{' bounded' if inline else ''} at {at:.0f} answers/s in runs of {runs_of:.1f} requests"
                f"{' (lone batches inline)' if inline else ''}"
                for mode, (_, at, runs_of, inline) in self.excess.items() if mode not in lined]
        for mode, other in ((Mode.PIPELINE, self.plain), (self.plain, Mode.PIPELINE)):
            if mode in self.excess or mode in lined:
                continue
            # the way served with no figure of its own carries the other's, unless that is only a bound
            if mode is not self.mode or (other in self.excess and not self.excess[other].inline):
                seen.append(f"{way(mode)} taken as far off as {way(other)}")
        said = [f"a request's cost over it as last served: {', '.join(seen)}"] if seen else []
        if lined:
            said.append(f"{' and '.join(map(way, lined))} as served (decide.ServedLine)")
        return "; ".join([self.measured.how, *said])

    def _trial(self, rate: float, rows: float, took_s: float | None, moved_now: bool, window: Window) -> Mode | None:
        """A window of a trial, with its requests' measured latency (``measured_s``): after
        ``TRIAL_WINDOWS``, the way tried is kept (returned, as a switch to it) or left. A way kept
        runs its own rows a run at the load tried, which ``_another_load`` must not take for
        another load (kept plain at 48 rows where the pipeline had run 17, the pipeline was tried
        straight back). A window whose load moved from the trial's (``Trial.moved``) says nothing
        of either way: where the next still answers, the load moved, and the trial ends, its load
        tried again once a pause shows it stopped, not while it goes on (a window's answers and
        latency can read as a load that fell where the way tried carried less: TensorRT speed at
        64 in flight on this project's 2-core host, plain at 3,696 answers/s in 17.43 ms a
        request, 64 in the model, then pipelined 2,780/s in 15.14 ms, 42 in the model as
        measured: the rest waited on the host's cores for the pipelined answers' sends; tried
        again every 4 s: docs/results/calibration-whole-batches); where the next answers too few,
        the load stopped, and the trial pauses (``_pause``), as where a window holds a load stopping
        and another starting (``Window.paused``): its windows then start again with the next.
        ``moved_now``: this window's load moved (``observe``)."""
        trial = self.trying
        if window.paused:
            self._pause(f"an idle of {ms(window.longest_idle_s)} in a window of {window.seconds:.2f} s, "
                        f"{rate:.0f} answers/s")
            return None
        if self._moving:  # the window after one that moved still answers: the load moved, not stopped
            self._cut = True
            return self._end_trial(f"a trial {way(self.mode)} ended with its load: {self._moving}")
        if moved_now:
            self._moving = trial.ended(rate, took_s)
            trial.restart()
            return None
        kept = trial.take(rate, took_s)
        if kept is None:
            return None
        said = trial.said(f"a trial {way(self.mode)}", way(self._other))
        if kept:
            self.trying, self.last, self._retry = None, f"{said}: kept", RETRY_WINDOWS
            self._tried_at = (trial.answered, rows, in_model(trial.answered, trial.took))
            return self.mode
        return self._end_trial(f"{said}: {trial.refused}")

    def _pause(self, why: str = "") -> None:
        """The trial's load stopped (after a window that saw it move, or within a window): go on
        serving the way tried, and run the trial's windows again from the next load on, against
        the same baseline. Ended instead, a trial of loads shorter than it takes to start and run
        one never ends: TensorRT-speed BERT-base on one core, loaded afresh and run at 16 in
        flight for 2 s then again for 4, tried plain 2 s in, the trial cut by the first run's end,
        and served its next run's first seconds pipelined again, at 0.95x the plain model where
        the lives that had switched outright read 1.07x (docs/results/check-one-core-pauses). The
        trial's windows start again after the next load's first: ``serving.Watch`` starts that
        window with the load, but the idle before its first call is counted as that call ends,
        within it (``Window.paused``), as where a load stops and another starts within a window
        (``why`` says so, where that paused it)."""
        self.trying.restart()
        why = why or self._moving
        self._moving = ""
        self.last = f"a trial {way(self.mode)} paused with its load{f': {why}' if why else ''}, until the next one"

    @property
    def _other(self) -> Mode:
        return self.plain if self.mode is Mode.PIPELINE else Mode.PIPELINE

    def _end_trial(self, why: str) -> Mode | None:
        """Back to the way served before the trial."""
        self.trying, self._moving, self.last = None, "", why
        return self._switch(self._other)

    @property
    def leaning(self) -> bool:
        """Whether the last window found the other way better, or worth a trial: the next window
        may switch (``observe`` needs two in a row). Until it has, nothing else is tried on the
        way served now (``serving.Watch``: ``EntryWait``)."""
        return self._before is not None and self._before.wanted is not None

    def host_busy(self, window: Window) -> float | None:
        """The host's utilisation as a window ``observe`` took showed it, served as now (``_host``:
        the stub's interpreter, or the cores with tritonserver and the other processes on them),
        for ``EntryWait``; None where the window answered too few to go by."""
        if window.seconds <= 0 or window.answered < MIN_ANSWERS:
            return None
        return self._host(window.stub_s, window, self.mode)

    def hold_rate(self, window: Window, held: bool) -> float | None:
        """The arrival rate up to which a hold (``hold.py``) may hold queries back, from a window
        served plain with answers enough (None from any other: the rate stays as it was): the
        capacity it shows, its rate over its nearest limit's utilisation. That is exact at
        capacity and less below it, wherever the host has costs that do not grow with the load
        (tritonserver's and the stub's own threads): no margin for the model's error on top (with
        0.85 of it, at 0.5 of the plain peak at TensorRT speed, the hold mostly held nothing and
        read 1.01x the best benchmark's objective; without, 0.72x).
        A held answer is a ``send()``, which costs the stub a round trip and
        tritonserver more than an answer in ``execute``'s list (204-250 against 88 us a request:
        docs/results/send-cost-2core), so a window that sent few answers (``held`` false) is
        taken to carry as much less as the costs predict (``_sent_share``). Held for the SMDP's
        control limit at 0.9 of the plain peak at TensorRT speed on this project's 2-core host,
        with no such bound, the mean went from 112 to 324 ms
        (docs/results/smdp-power-weight-plain-hold)."""
        mode, busy = self._seen
        if mode is Mode.PIPELINE or window.answered < CORRECT_AFTER or busy <= 0:
            return None
        capacity = window.answered / window.seconds / busy
        return capacity * (1.0 if held else self._sent_share(window.requests))

    def _sent_share(self, requests: float) -> float:
        """What the host carries with every answer sent, as a share of what it carries with
        every answer in ``execute``'s list, by the costs: a ``send()`` is a round trip
        (``HostCosts.send_s``) of the stub's, and about as much again of tritonserver's."""
        stub, server = self.costs.stub_s(self.plain, requests) / requests, self._server_s(self.plain)
        listed = max(stub, (stub + server) / self.cores)
        sent = max(stub + self.costs.send_s, (stub + server + 2 * self.costs.send_s) / self.cores)
        return listed / sent if sent > 0 else 1.0

    def _latency(self, mode: Mode, busy: float, rows: float, requests: float, series: float,
                 overlap: float = 1.0) -> float:
        """A request's mean seconds served ``mode`` with its nearest limit ``busy``, in runs of
        ``rows`` from ``requests``: its batch's own time, and the wait for the batch ahead at that
        limit (M/D/1: plain, the batch's time and its requests' round trip in series, ``series``
        each; ``overlap`` of it where requests find a batch ahead less often than random arrivals
        would, ``_overlap``); infinite at or past capacity."""
        if busy >= 1:
            return math.inf
        stub = self.costs.stub_s(mode, requests)
        if mode is not Mode.PIPELINE:
            own = self._device_s(mode, rows) + stub
            return own + overlap * (own + requests * series) * busy / (2 * (1 - busy))
        own = self._device_s(Mode.IN_TURN, rows, way=mode) + stub  # its stages, one after another
        ahead = max(self._device_s(mode, rows), stub, self._entry_s(rows, requests, series))
        return own + self.costs.handoff_s + overlap * ahead * busy / (2 * (1 - busy))

    def _overlap(self, window: Window, rows: float, requests: float) -> float:
        """How often a window's requests found a batch ahead of them, as a share of how often random
        arrivals would have (at most 1). Served pipelined: the share of its requests that came in no
        lone call (``Window.lone``: the calls that found the pipeline empty; the rest found a batch
        in it or waiting at its entry; counted by requests, as Triton gathers those that arrive
        during a call into one), over the share of the time stage 0 would have been busy had every
        batch run through it (by the tables at the window's rows; random arrivals find it busy that
        often, and the pipeline busy at least as often). Served plain: a call's requests beyond its
        first (they arrived while the call before ran), over what random arrivals would bring at the
        window's rate and calls, ``rate took + exp(-rate took) - 1`` (simulated, Poisson arrivals
        read 0.99 of it from 100 to 2,000 a second; Triton's hand-off between calls adds more,
        capped). A closed loop of one request in flight never finds a batch ahead, whichever way
        serves it: counted as random arrivals, TensorRT-speed BERT-base's requests of 8 rows at
        500/s had plain serving predicted to wait 0.6 ms a request behind another, and the model
        kept pipelining (its lone batches inline), its stub 100 us a request dearer than the plain
        model's, at 0.91x-0.97x its answers/s; counted one way and not the other, the two ways could
        each predict the other sooner. 1 where the window cannot tell: its calls not counted
        (several instances, a hold), or, pipelined, its lone batches, or, plain, a call that holds
        one request (``beyond_first``: random arrivals bring none beyond it either)."""
        if not window.executes or window.seconds <= 0:
            return 1.0
        if self.mode is not Mode.PIPELINE:
            rate, took = window.answered / window.seconds, window.execute_s / window.executes
            beyond = beyond_first(rate * took, self._room)
            return min(max(window.answered / window.executes - 1, 0.0) / beyond, 1.0) if beyond > 0 else 1.0
        stage0 = window.answered / requests * self._device_s(Mode.IN_TURN, rows, self.tables[:1], Mode.PIPELINE) \
            / window.seconds
        found = 1 - min(window.lone, window.answered) / window.answered
        return min(found / stage0, 1.0) if stage0 > 0 else 1.0

    def _switch(self, mode: Mode) -> Mode | None:
        if mode is self.mode:
            return None
        self.mode, self._before = mode, None
        return mode

    def _utilisation(self, mode: Mode, window: Window, series: float) -> float:
        """The nearest limit's utilisation as the window showed it: served plain, the instance's
        too (its time inside ``execute`` and its requests' round trip in series)."""
        busy = window.busy_s or (0.0,)
        engines = (max(busy) if mode is Mode.PIPELINE else sum(busy)) / window.seconds
        if mode is not Mode.PIPELINE and window.executes:
            engines = max(engines, (window.execute_s + window.answered * series) / window.seconds)
        return max(engines, self._host(window.stub_s, window, mode))

    def _predicted(self, mode: Mode, window: Window, series: float, rows: float | None = None) -> tuple[float, float]:
        """The engines' and the host's utilisation had the window's load been served ``mode``
        (the engines' read from their tables; the host's scaled from costs measured elsewhere).
        Served plain, the engines' is the instance's: each batch runs inside ``execute``, the stub's
        work and the engines' one after another, and its requests' round trip in series. A
        pipeline overlaps that round trip with the engines but does not shorten it: in a closed
        loop of ``n`` it still answers at most ``n`` a round trip, so its share of the window is a
        limit too (near-zero compute at 64 in flight, served plain on a one-core server: the
        instance 98 % busy at 1,752 answers/s, 89 % of it the round trip, where the pipeline,
        predicted 72 % busy by its stub costs alone, answered 1,200). ``rows``: runs of these rows
        in place of the window's (``_batched``)."""
        if rows is not None:
            window = replace(window, rows=rows)
        rows, requests = max(window.rows, 1.0), window.requests
        batches = window.answered / requests
        stub = batches * self.costs.stub_s(mode, requests)
        engines = batches * self._device_s(mode, rows)
        if mode is not Mode.PIPELINE:
            engines += stub + window.answered * series
        else:  # each request's round trip is its own, whoever serves it: a pipeline overlaps it with the engines
            engines = max(engines, window.answered * series, batches * self._entry_s(rows, requests, series))
        return engines / window.seconds, self._host(stub, window, mode)

    def _entry_s(self, rows: float, requests: float, series: float) -> float:
        """The seconds a pipelined call of ``rows`` from ``requests`` holds Triton's instance where ``execute`` waits
        for stage 0 (``entry_waits``; else none): stage 0's time, and its requests' round trip in
        series, as a call served plain has it. What the round trip reads under an open load is
        mostly Triton's hand-off from one call to the next, which a waiting entry pays as plain
        serving does: counted for plain alone, 242 us a request at 908 Poisson answers/s at
        TensorRT speed (1.7 rows a call) sent the model to a pipeline predicted at 1.56 ms against
        2.03, which answered in 3.1 ms where plain had in 2.3."""
        if not self.entry_waits:
            return 0.0
        return self._device_s(Mode.IN_TURN, rows, self.tables[:1], Mode.PIPELINE) + requests * series

    def _series_s(self, rate: float) -> float:
        """A plain request's round trip in series (``round_trip``) at a load of ``rate`` answers/s."""
        seconds, seen_at = self.round_trip
        return seconds if rate >= (1 - SWITCH_GAIN) * seen_at else 0.0

    def _device_s(self, mode: Mode, rows: float, tables: Sequence[LatencyTable] | None = None,
                  way: Mode | None = None) -> float:
        """The engines' seconds for a batch of the ``rows`` seen, served ``mode`` (through the
        whole model's table where it runs fused, else the stages', else those ``tables``), as far
        off their tables as the engines of ``way`` (``mode``'s by default) were seen to be
        (``engines``)."""
        return self._tabled_s(mode, rows, tables) * self.off(way or mode)

    def off(self, mode: Mode) -> float:
        """How many times their tables' seconds the engines of ``mode`` take (``engines``; a way not
        served yet as far off as the way served now; 1 before any window)."""
        return self.engines.get(mode, self.engines.get(self.mode, 1.0))

    def _tabled_s(self, mode: Mode, rows: float, tables: Sequence[LatencyTable] | None = None) -> float:
        """``_device_s`` as the tables say it."""
        if tables is None:
            tables = [self.whole] if mode is Mode.FUSED and self.whole is not None else self.tables
        bs = max(1, min(round(rows), self.tables[0].batch_sizes[-1]))
        return device_s(tables, mode, bs, middle_length(self.tables), self.statistic, self.shared_host)

    def _host(self, stub_s: float, window: Window, mode: Mode) -> float:
        """The host's utilisation: the stub's one interpreter, or the cores with tritonserver
        and the other processes on them (``Window.others_s``: at the window's load they take the
        same whichever way serves it; left out, a check on one core with its clients there read
        a pipeline 78 % busy against plain's 99 % at 16 in flight, switched to it, and answered
        0.86x the plain model: docs/results/check-auto-poisson-peak)."""
        server = window.answered * self._server_s(mode)
        return max(stub_s, (stub_s + server + window.others_s) / self.cores) / window.seconds

    def _server_s(self, mode: Mode) -> float:
        """tritonserver's CPU seconds a request served ``mode``: as last seen served that way,
        scaled as the way served now's changed since that load where it was seen there too (a
        call's own cost spreads over the requests a call brings: at TensorRT speed, requests of 8
        rows, the pipeline cost it 652 us a request at 1 in flight and 406 at 8, and seen at 1, it
        was predicted overloaded at 8, where it was 70 % busy), but never less pipelined than what
        serving plain shows now, nor more plain than what pipelining shows now. A pipelined answer
        is a ``send()`` of its own where a plain one goes back in ``execute``'s list, so it costs
        tritonserver as much or more; a sight of the other way taken at another load must not say
        otherwise. (The pipeline seen at 234 us a request in a first, light second, against 348
        served plain, once sent an overloaded near-zero model to a pipeline that carried less:
        docs/results/check-auto-client-core's rerun.)"""
        server = self.server
        now = server.get(self.mode)
        seen = server.get(mode, now)
        if seen is None:
            return 0.0
        if now is None or mode is self.mode:
            return seen
        loads = self.server_at.get(mode)
        then = self.server_at.get(self.mode, {}).get(next(reversed(loads))) if loads else None
        if then:
            seen *= now / then
        return max(seen, now) if mode is Mode.PIPELINE else min(seen, now)

    @property
    def server(self) -> dict[Mode, float]:
        """tritonserver's CPU seconds a request as last seen served each way."""
        return {mode: next(reversed(seen.values())) for mode, seen in self.server_at.items()}

    def _engines_text(self) -> str:
        """Each way's engines against their tables where they were seen off them (``engines``)."""
        off = [f"{way(mode)} {scale:.2g}x" for mode, scale in self.engines.items() if scale != 1.0]
        return f"; the engines {' and '.join(off)} their tables' time (decide.engines_off)" if off else ""

    def _server_text(self) -> str:
        """Each way's tritonserver cost a request as the switch takes it now (``_server_s``)."""
        return ", ".join(f"{self._server_s(m) * 1e6:.0f} us a request {'pipelined' if m is Mode.PIPELINE else 'plain'}"
                         for m in self.server_at) or "not seen"
