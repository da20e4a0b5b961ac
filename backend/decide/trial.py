"""Trials while serving: a way served for a few windows and kept where it answers more
(``Trial``), and whether a pipeline's ``execute`` waits for stage 0, tried again from the
windows served pipelined (``EntryWait``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .costs import ms
from .window import LOAD_STEP, SWITCH_GAIN, in_model, load_moved, moved

# A pipelined ``execute`` that returns at once starts waiting for stage 0 once the host is this
# busy in two windows in a row: its CPU then caps the pipeline (``EntryWait``).
HOST_SATURATED = 0.95
TRIAL_WINDOWS = 2  # windows a trial runs (``EntryWait``: of returning at once; ``ModeSwitch``: of the other way)
TRIAL_GAIN = 0.05  # and how many more answers/s than the way before it must show to be kept


@dataclass
class Trial:
    """A trial of another way of serving against the answers/s the way before it served at
    (``baseline``): ``TRIAL_WINDOWS`` windows at rates within ``SWITCH_GAIN`` of each other, the
    way tried kept where they answered ``TRIAL_GAIN`` more (``EntryWait``, ``ModeSwitch``), or,
    where both ways' latency was measured (``baseline_s``, ``measured_s``), answered as many
    within ``TRIAL_GAIN`` in ``TRIAL_GAIN`` less time: under an open load each way answers what
    arrives, and only the time says which serves it sooner (BERT-base's three FP16 stages from
    an H100 under Poisson 1,800/s, served plain 100 % busy in calls whose time barely grows with
    their rows, read as a loop at capacity; the pipeline tried answered as many and was left,
    at 1.10x its forced mean: docs/results/check-held-out-runs)."""

    baseline: float
    baseline_s: float | None = None
    # The way before served at its capacity (a loop or an overload, ``ModeSwitch``): its answers/s
    # were not the load's, and a window of the way tried that answers ``TRIAL_GAIN`` more is that
    # way carrying more, not a load that moved (one request a call, four 2 ms stages under Poisson
    # 200/s: plain answered its 117/s; the pipeline tried answered Triton's queue and then the load).
    capped: bool = False
    rates: list[float] = field(default_factory=list)
    took_s: list[float | None] = field(default_factory=list)

    def moved(self, rate: float, took_s: float | None = None) -> bool:
        """Whether a window's answers/s moved from the window before: a load that stopped or
        changed says nothing of either way, and the trial ends. But answers/s that rose while
        the requests' measured latency (``took_s``) fell ``TRIAL_GAIN`` below the way before's are
        the way tried taking hold: a closed loop answered sooner sends more (Little's law), where
        an open load that grows is answered later, not sooner (at 64 in flight on tables 16x too
        fast, returning at once answered 1,425-1,458/s, each request in 43-44 ms, where waiting
        answered 1,118-1,210 in 51-56 ms; four of eleven such trials ended "with their load", a
        first window still taking hold: docs/results/entry-wait-configured).
        A first window is read against the way before: answers/s ``SWITCH_GAIN`` short of it
        while its requests were answered ``TRIAL_GAIN`` sooner are fewer requests in the model
        (Little's law: answers/s times latency), a load that fell or stopped, not the way tried
        carrying less (a closed loop given a worse way answers less, each request later; an
        open load as much). Taken for the way tried, a round of 64 in flight ending within
        the window (938 against 1,186 answers/s, in 42 ms a request against 53) refused
        returning at once for the rest of the load, which answered 1,457/s in the next trial
        (docs/results/entry-wait-configured). A later window whose answers/s fell while the
        requests in the model did not is the way tried falling behind, which ``take`` judges, not
        a load that moved (a load that falls leaves fewer in the model): TensorRT speed over
        HTTP under Poisson 3,120/s tried the pipeline from plain, whose windows answered 3,235/s
        in 11.4 ms a request, then 2,614/s in 16.0 ms (37, then 42 in the model); read as a load
        that moved, the trial ran a window more and "ended with its load", free to run again
        after the next pause (docs/results/http-clients)."""
        if self.capped and rate >= (1 + TRIAL_GAIN) * self.baseline:
            return False
        # This window's requests against the way before's (``sooner`` weighs the trial's windows together).
        quick = took_s is not None and self.baseline_s is not None and took_s <= (1 - TRIAL_GAIN) * self.baseline_s
        if not self.rates:
            return rate < (1 - SWITCH_GAIN) * self.baseline and quick
        before, before_s = self.rates[-1], self.took_s[-1]
        held, held_before = in_model(rate, took_s), in_model(before, before_s)
        behind = rate < before and held is not None and held_before is not None and held >= held_before
        return moved(rate, before) and not (rate > before and quick) and not behind

    def take(self, rate: float, took_s: float | None = None) -> bool | None:
        """A window's answers/s and its requests' measured latency (``measured_s``): None while
        the trial runs, else whether the way tried is kept.
        A window ``SWITCH_GAIN`` short of the baseline ends it at once: the way tried carries
        less, or the load fell, and either way a second window would cost as much again
        (TensorRT speed under a Poisson load at 0.6 of plain's peak, 1,836/s, tried a pipeline that
        answered 1,203/s for two windows, the requests it left queued by then some 1,300). So does
        one answered ``SWITCH_GAIN`` later than the way before, as measured, at no ``TRIAL_GAIN``
        more answers/s: an open load's rate is the same either way, and there only the time
        shows the way tried carrying less (a closed loop answered later answers fewer, the rule
        before). To be kept, the trial's second window would have to answer sooner than the way
        before did (``slower``, ``sooner``: the two windows' mean latency decides).
        A window that held ``LOAD_STEP`` times the requests in the model the way before did
        (Little's law) ends it too, whatever it answered: a closed loop holds no more than its
        clients send, so an open load is queueing on the way tried, and the answers a window
        reads beyond the load's rate are that queue's catching up (TensorRT speed over HTTP
        under Poisson 3,120/s tried the pipeline from plain, at 3,102 answers/s in 2.67 ms a
        request, 8 in the model; its first window answered 3,590/s in 29.8 ms, 107 in the
        model, and the trial ran two windows more: docs/results/trial-in-model)."""
        self.rates.append(rate)
        self.took_s.append(took_s)
        later = took_s is not None and self.baseline_s is not None and took_s >= (1 + SWITCH_GAIN) * self.baseline_s
        if rate < (1 - SWITCH_GAIN) * self.baseline or (later and rate < (1 + TRIAL_GAIN) * self.baseline) \
                or self.crowded:
            return False
        if len(self.rates) < TRIAL_WINDOWS:
            return None
        return (self.answered >= (1 + TRIAL_GAIN) * self.baseline and not self.slower) or self.sooner

    def restart(self) -> None:
        """Forget the trial's windows, not its baseline: a trial's windows run together, and a
        pause between them breaks the run."""
        self.rates.clear()
        self.took_s.clear()

    @property
    def answered(self) -> float:
        return sum(self.rates) / len(self.rates)

    @property
    def took(self) -> float | None:
        """The mean measured latency of the way tried; None where a window could not measure it."""
        took = [t for t in self.took_s if t is not None]
        return sum(took) / len(took) if took and len(took) == len(self.took_s) else None

    @property
    def took_share(self) -> float | None:
        """The way tried's measured latency over the way before's; None where either went unmeasured."""
        took = self.took
        return None if took is None or self.baseline_s is None else took / self.baseline_s

    @property
    def sooner(self) -> bool:
        """Whether the way tried carried the load the way before did and answered it sooner."""
        share = self.took_share
        return share is not None and share <= 1 - TRIAL_GAIN and self.answered >= (1 - TRIAL_GAIN) * self.baseline

    @property
    def slower(self) -> bool:
        """Whether the way tried answered ``TRIAL_GAIN`` later than the way before, as measured:
        then answers/s that read more are an open load's noise (a closed loop answered more
        is answered sooner), as 1,861/s returning at once against 1,764 waiting for stage 0
        under Poisson 1,800/s, each request 8.2 ms where waiting took 7.4."""
        share = self.took_share
        return share is not None and share >= 1 + TRIAL_GAIN

    @property
    def crowded(self) -> bool:
        """Whether the trial's last window held ``LOAD_STEP`` times the requests in the model
        (Little's law) the way before did (``take``); False where either went unmeasured."""
        held, held_before = in_model(self.rates[-1], self.took_s[-1]), in_model(self.baseline, self.baseline_s)
        return held is not None and held_before is not None and held >= LOAD_STEP * held_before

    @property
    def refused(self) -> str:
        """Why the way tried was not kept, for the log."""
        if self.crowded:
            return f"{LOAD_STEP:g}x the requests in the model or more: falling behind"
        return f"{TRIAL_GAIN:.0%} later or more" if self.slower else f"not {TRIAL_GAIN:.0%} more"

    def ended(self, rate: float, took_s: float | None) -> str:
        """How a window's load moved (``moved``), against the trial's window before or, for its
        first, the way before, for the log."""
        since, since_s = (self.rates[-1], self.took_s[-1]) if self.rates else (self.baseline, self.baseline_s)

        def at(answers: float, seconds: float | None) -> str:
            return f"{answers:.0f}/s" + ("" if seconds is None else f" in {ms(seconds)} a request")
        return f"{at(rate, took_s)} after {at(since, since_s)}"

    def said(self, tried: str, before: str) -> str:
        said = f"{tried} answered {self.answered:.0f}/s where {before} answered {self.baseline:.0f}"
        if self.took_share is None:
            return said
        return f"{said}, in {ms(self.took)} a request where {before} took {ms(self.baseline_s)} (measured_s)"


@dataclass
class EntryWait:
    """Whether a pipelined ``execute`` waits until stage 0 computed its queries, decided again
    from every window served pipelined (on engines that overlap, ``execute_waits: auto``, under
    ``auto`` or a configured policy). At load ``waits`` can only weigh the engines' capacity at their best batch, which
    a lighter load may never reach: there, on three 0.7 ms stages at 16 in flight, waiting held
    the model to 1,630 answers/s where returning at once answered 1,834, the host 70 % busy
    waiting and 83 % at once (stage 0 idles while Triton hands the next call over). But under an
    open load at 0.6 of the pipeline's peak, waiting answered in 7.3 ms where returning at once
    took 7.8-9.3 (what Triton batches during a call saves the stages' fixed cost), and where the
    host's CPU caps the pipeline waiting is what keeps up (fewer, fuller calls; near-zero compute
    at 16 in flight: 3,346 answers/s waiting against 2,462 at once, the host saturated either way).
    No reading of the host tells those apart, so it is tried: where waiting leaves the host clear
    room (under ``1 - SWITCH_GAIN`` busy), the entry returns at once for ``TRIAL_WINDOWS``, and
    keeps doing so only where that answered ``TRIAL_GAIN`` more than waiting did (clients that
    wait on their answers send more when answered sooner; an open load's rate is the same either
    way), or, as many within ``TRIAL_GAIN``, in ``TRIAL_GAIN`` less time, as measured
    (``measured_s``; none kept that took ``TRIAL_GAIN`` more, ``Trial.slower``), else it waits
    again and tries no more until the load moves by ``SWITCH_GAIN``. Returning
    at once, it waits again once the host is ``HOST_SATURATED`` busy, and tries no more at that
    load or a heavier one; and where a trial kept returning at once, once the load moves by more
    than ``SWITCH_GAIN`` from the trial's (``load_moved``: its answers/s and the requests in the
    model), in two windows at one rate: a trial speaks for its load alone (six timed 1 ms
    stages kept returning at once from a trial at 1 in flight, 145 answers/s against 136, and at
    16 in flight, the host unsaturated, answered 0.87x the forced pipeline, which waited). A
    change needs two windows in a row agreeing (a window may hold a
    load starting or stopping), and a trial two at rates within ``SWITCH_GAIN`` of each other
    (where a load started, a first window's answers once made the trial's 657/s look like more
    than waiting's 381 under an open load of 700/s); a trial whose load moves (its windows'
    rates apart by more, and the window after still answering) is abandoned, waiting again,
    free to try again. A trial whose load stops (a window with too few answers, after one that
    moved or not) is paused: the entry goes on returning at once, and the trial's windows start
    again against the same baseline once the load is back, its first window (a load starting)
    skipped. Abandoned instead, a trial of loads shorter than it takes to start and run one
    never ends: three 0.7 ms stages at 16 in flight in rounds of 3.5 s, waiting from loading,
    tried returning at once 2 s into each round and was cut by the round's end each time,
    0.86x-0.95x the forced pipeline for the model's life (docs/results/check-process-lives).
    ``host``: the
    host's utilisation as ``ModeSwitch.host_busy`` reads it, ``rate`` the window's answers/s,
    ``took_s`` its requests' latency as measured (``measured_s``; None where it cannot be); None
    for a window not served pipelined or with too few answers to go by."""

    waits: bool
    last: str = ""  # why the entry does what it does now: for the log
    _wanted: tuple[bool, float] | None = field(default=None, init=False)  # the window before: its wish, its rate
    _saturated_at: float = field(default=math.inf, init=False)  # answers/s at which returning at once saturated
    _refused_at: float = field(default=-math.inf, init=False)  # answers/s a trial at once did not raise
    _trial: Trial | None = field(default=None, init=False)  # of returning at once, against waiting
    # The answers/s and measured latency of the trial that kept returning at once (``load_moved``).
    _kept_at: tuple[float, float | None] | None = field(default=None, init=False)
    _cut: str = field(default="", init=False)  # how the trial's last window moved: abandoned unless the load stops
    _paused: bool = field(default=False, init=False)  # the trial's load stopped: it resumes with the next one

    def observe(self, host: float | None, rate: float = 0.0, took_s: float | None = None,
                paused: bool = False) -> bool | None:
        """Take a window; whether the entry waits from now on where that changes or a trial
        ends, else None. ``paused``: a load stopped and another started within the window
        (``Window.paused``), which a trial takes as neither load: its windows start again with
        the next."""
        if host is None:
            self._wanted = None
            if self._trial is not None and not self._paused:
                self._pause()
            return None
        if self._trial is not None and host < HOST_SATURATED:
            return self._take(rate, took_s, paused)
        self._cut, self._paused = "", False
        if self.waits:
            wanted = not (host < 1 - SWITCH_GAIN and rate < (1 - SWITCH_GAIN) * self._saturated_at
                           and moved(rate, self._refused_at))
        else:
            kept = self._kept_at
            wanted = host >= HOST_SATURATED or (kept is not None and load_moved(rate, took_s, *kept))
        before, self._wanted = self._wanted, (wanted, rate)
        if wanted is self.waits or before is None or before[0] is not wanted:
            return None
        if moved(rate, before[1]) and not (wanted and host >= HOST_SATURATED):
            # A trial compares with waiting at a steady load, and a load that moved from a kept
            # trial's is read at one too: not one starting or stopping (after a pause between two
            # rounds of 64 in flight on tables 16x too fast, the windows of the load starting again
            # read 895/s against the trial's 1,443, and the forced pipeline waited for the round).
            return None
        self.waits, self._wanted, self._trial = wanted, None, None
        if wanted and host >= HOST_SATURATED:
            self._saturated_at, self._kept_at = rate, None
            self.last = (f"the host {host:.0%} busy returning at once at {rate:.0f} answers/s, at or past "
                         f"{HOST_SATURATED:.0%}")
        elif wanted:
            self.last = (f"returning at once was kept at {self._kept_at[0]:.0f} answers/s and the load moved to "
                         f"{rate:.0f}: a trial speaks for its load alone")
            self._kept_at = None
        else:
            self._trial = Trial((before[1] + rate) / 2, took_s)
            self.last = (f"a trial: the host {host:.0%} busy waiting for stage 0 at {rate:.0f} answers/s, under "
                         f"{1 - SWITCH_GAIN:.0%}")
        return wanted

    @property
    def trying(self) -> bool:
        """Whether the entry returns at once on trial now (``ModeSwitch.observe``'s ``trial``)."""
        return self._trial is not None

    def _take(self, rate: float, took_s: float | None, paused: bool) -> bool | None:
        """A window of a trial at once: after ``TRIAL_WINDOWS``, keep it (False) or wait again (True)."""
        trial = self._trial
        if paused:
            self._pause(again_at=rate)
            return None
        if self._paused:  # the load back after a pause: its first window holds it starting
            self._paused = False
            return None
        if self._cut:  # the window after one that moved still answers: the load moved, not stopped
            return self._abandon(self._cut)
        if trial.moved(rate, took_s):
            self._cut = trial.ended(rate, took_s)
            trial.restart()
            return None
        kept = trial.take(rate, took_s)
        if kept is None:
            return None
        self._trial, self._wanted = None, None
        self.last = trial.said("returning at once", "waiting for stage 0")
        if kept:
            self._kept_at = (trial.answered, trial.took)
            return False
        self.waits, self._refused_at = True, trial.baseline
        self.last += f": {trial.refused}"
        return True

    def _pause(self, again_at: float | None = None) -> None:
        """The trial's load stopped (after ``_cut``, where a window saw it end): go on returning at
        once, and run the trial's windows again once the load is back, skipping its first window;
        where it started again within the window (at ``again_at`` answers/s), from the next."""
        self._trial.restart()
        ended = f": {self._cut}" if self._cut else ""
        self._cut, self._paused = "", again_at is None
        how = f" with its load{ended}, until the next one" if again_at is None else \
            f": its load stopped and started again at {again_at:.0f}/s"
        self.last = f"a trial of returning at once paused{how}"

    def _abandon(self, why: str) -> bool:
        """A trial whose load moved (``why``) says nothing: wait again, free to try once more."""
        self.waits, self._trial, self._wanted, self._cut, self._paused = True, None, None, "", False
        self.last = f"a trial of returning at once ended with its load: {why}"
        return True
