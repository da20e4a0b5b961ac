"""What one window of serving showed (``Window``) and how the switch and the trials read it: a
closed loop's round trip in series (``round_trip_s``), a request's measured latency
(``measured_s``), and when a load moved (``moved``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# How much sooner another way of serving must predict to answer (or, both overloaded, how much
# less busy its nearest limit) for the switch.
SWITCH_GAIN = 0.15
MIN_ANSWERS = 20  # a window with fewer answers shows too little to decide on: the mode stays
# Requests in the model (``in_model``) this many times (or a this-th of) those of a load at capacity
# last tried make another load (``ModeSwitch._another_load``); a trial's window holding this many times
# the way before's is the way tried falling behind (``Trial.take``).
LOAD_STEP = 2.0


@dataclass(frozen=True)
class Window:
    """What one window of serving showed: its length, the requests answered, the stub's CPU
    seconds, tritonserver's (None where it cannot be read), each stage's busy seconds, the
    mean rows of a stage's run, the ``execute`` calls: their wall seconds, the idle before
    each (since the previous call ended) summed and the longest (0 where not counted), and the
    CPU seconds other processes spent on the cores serving has (``others_s``: a load generator
    on the server's cores, other models' stubs; 0 where not read), served pipelined, the lone
    batches run inline (``inline``) and the calls that found the pipeline empty (``lone``), and
    the mean rows a request brought (``rows_a_request``: a client may send several in one, as an
    image classifier's often does), and the answers sent from the pipeline with their seconds
    from arriving in ``execute`` in all (``piped``, ``piped_s``: what the log sets beside the
    latency predicted pipelined), and those run inside ``execute`` and returned from it, with
    their calls' seconds, once for each (``returned``, ``returned_s``; 0 where the calls are not
    counted). The engines' time goes by rows; the stub's, tritonserver's and a closed loop's
    round trip go by requests."""

    seconds: float
    answered: int
    stub_s: float
    server_s: float | None
    busy_s: tuple[float, ...]
    rows: float
    execute_s: float = 0.0
    executes: int = 0
    idle_s: float = 0.0
    longest_idle_s: float = 0.0
    others_s: float = 0.0
    inline: int = 0  # served pipelined, the lone batches that ran inside ``execute`` (``LoneRuns``)
    lone: int = 0  # ... and the calls that found the pipeline empty (inline or not; 0 where ``LoneRuns`` is off)
    rows_a_request: float = 1.0
    piped: int = 0
    piped_s: float = 0.0
    returned: int = 0
    returned_s: float = 0.0

    @property
    def paused(self) -> bool:
        """Whether a load stopped and another started within the window: an idle before one of its
        calls (``longest_idle_s``) of ``SWITCH_GAIN`` of its seconds or more, enough alone to move
        its answers/s as far as another load does (``moved``), where a closed loop's round trip
        and an open load's quiet spells take a small share. Its answers/s are neither load's: on
        one core, a trial's window held a warm-up load's end and the next held the gap and the
        measured run's start, read as a load that moved, and the trial ended where the load had
        only paused (docs/results/check-one-core-pauses). False where the idle went uncounted."""
        return self.longest_idle_s >= SWITCH_GAIN * self.seconds

    @property
    def requests(self) -> float:
        """The mean requests a run: its rows over a request's (one at least). Taken as its rows,
        a closed loop of 8 requests of 8 rows at TensorRT speed had the switch count a run of 36
        rows as 36 requests' stub work and the runs as an eighth of what they were, and serve
        plain and pipelined in turn every 2.5 s, each predicting the other sooner."""
        return max(max(self.rows, 1.0) / max(self.rows_a_request, 1.0), 1.0)

    def describe(self) -> str:
        """What the window measured, for the log (``DVABATCH_LOG_WINDOWS``): the figures the
        switch reads, a request's share of each CPU time, so that a choice can be followed back
        to what it was made from."""
        each = 1e6 / max(self.answered, 1)
        server = "not read" if self.server_s is None else f"{self.server_s * each:.0f} us a request"
        took = measured_s(self)
        return (f"{self.answered} answers in {self.seconds:.2f} s, {self.rows:.1f} rows a run"
                f"{f' ({self.requests:.1f} requests)' if self.requests < self.rows - 0.05 else ''}; "
                f"stub {self.stub_s * each:.0f} us a request, tritonserver {server}, other processes "
                f"{self.others_s * each:.0f}; stages busy {', '.join(f'{b:.2f}' for b in self.busy_s)} s; "
                f"{self.executes} calls ({self.execute_s:.2f} s, idle {self.idle_s:.2f} s, longest "
                f"{self.longest_idle_s * 1e3:.1f} ms); lone {self.lone}, inline {self.inline}; "
                f"measured {'-' if took is None else f'{took * 1e3:.2f} ms'} a request")


def round_trip_s(window: Window, delay_s: float = 0.0) -> float:
    """Served plain, the seconds each request held the next batch back beyond what arrivals that
    do not wait on the answers explain: the instance's idle time between two ``execute`` calls,
    less what an open (Poisson) load at the window's rate leaves idle (none arrived during a call
    of the mean length: ``exp(-rate took) / rate``) and what Triton's batcher may wait for more
    (its ``delay_s``, a call), spread over the requests. The longest idle of the window is left
    out: where a load stopped and another started, the gap between them is no client's round
    trip (one such gap, read as one, once had a window at the start of 16 in flight read 1.2 ms
    a request in series and send near-zero compute to the pipeline for the rest of the check:
    docs/results/lone-request-straight); in a steady loop it is one of many alike. Where the clients
    wait on their answers (a closed loop: perf_analyzer's concurrency) and every request in flight
    fits in one batch, the next batch cannot form until tritonserver has sent this one's answers
    and taken the clients' next requests: that round trip runs in series with the engines (64 in
    flight on the slower engine's two stages, served plain on a one-core server: the engines 73 %
    busy at 670 answers/s, where the pipeline, whose next batch enters while this one runs,
    answered 1,027; docs/results/check-auto-fused-plain). Under an open load it is about none."""
    if window.executes < 2 or not window.answered or window.seconds <= 0:
        return 0.0
    rate = window.answered / window.seconds
    took = window.execute_s / window.executes
    idle = max(window.idle_s - window.longest_idle_s, 0.0) / (window.executes - 1)
    return max(idle - math.exp(-rate * took) / rate - delay_s, 0.0) * window.executes / window.answered


def beyond_first(mean: float, room: int) -> float:
    """A call's requests beyond its first that random (Poisson) arrivals bring, ``mean`` arriving
    during a call, where a call holds at most ``room`` more (the largest batch less one): E[min(
    max(K - 1, 0), room)], K Poisson; ``mean + exp(-mean) - 1`` where the room never binds. A
    model that takes one request a call (``max_batch_size`` 1) shows none, queued or not."""
    if room <= 0 or mean <= 0:
        return 0.0
    total, below, log_pmf = 0.0, 0.0, -mean  # ``below``: P(K <= k), ``log_pmf``: log P(K = k)
    for k in range(room + 1):
        below += math.exp(log_pmf)
        if k:
            total += max(1.0 - below, 0.0)  # P(K >= k + 1): the call holds a k-th request beyond its first
        log_pmf += math.log(mean) - math.log(k + 1)
    return total


def measured_s(window: Window) -> float | None:
    """A request's mean seconds from Triton's queue to its answer as the window measured them,
    the hand-off to the client left out alike for both ways. Each call holds Triton's instance
    for its time and a hand-off after it (``round_trip_s``: what the idle between calls shows
    beyond what random arrivals leave); a request arriving finds the instance so held as often
    as it is, for half of that on average, then spends its time inside the model: sent from the
    pipeline, from arriving in ``execute`` to its send returning (``Window.piped_s``); run inside
    ``execute`` (served plain, a pipeline's lone batch inline), its call and the hand-off that
    returns the call's answers (``Window.returned_s``: a call counted once for each of its
    requests, so a large call weighs as its requests do). One measure for both ways and for a
    pipelined window whose lone batches ran inline: left out, the pipelined windows at
    TensorRT speed under Poisson 1,059/s, a third of their calls inline, could not be measured,
    and the pipeline was read as predicted, 1.80 ms, where it answered in 3.3-4.2
    (docs/results/switch-measured-latency). Served plain under Poisson 1,800/s, BERT-base's
    three FP16 stages read 8.4 ms where the client took 9.6; pipelined 7.3 where it took 7.6
    (docs/results/check-held-out-runs). None where the window cannot tell: its calls not counted
    (several instances, a hold), or too few of its answers timed."""
    timed = window.piped + window.returned
    if window.executes < 2 or window.seconds <= 0 or not window.answered or timed < MIN_ANSWERS:
        return None
    call = window.execute_s / window.executes
    handoff = round_trip_s(window) * window.answered / window.executes
    held = min((window.execute_s + window.executes * handoff) / window.seconds, 1.0)
    inside = (window.piped_s + window.returned_s + window.returned * handoff) / timed
    return held * (call + handoff) / 2 + inside


def engines_off(window: Window, tabled_s: float) -> float:
    """How many times their tables' seconds the engines took in a window, where the tables say
    ``tabled_s`` for the batches it ran, as far as the host's own time cannot explain it (1 where
    it can). A stage's busy seconds hold more than its engine: its Python, the waits for the
    interpreter and the cores that the stub, tritonserver and the other processes held meanwhile
    (pipelined at TensorRT speed on one core, 2.5x the tables', where the tables are exact), and
    served plain less, the responses being built while the engines run; so the measured is read
    as anywhere within the window's host CPU seconds of its engines' time. Beyond that, the tables
    are off: measured on another machine (a GPU of another speed, or one shared with another
    model), at another length than the one sent, or for a model whose queries take less than
    its tables say (an early exit). Read against tables a sixteenth of the engines' time, the
    slower engine's pipeline at 16 in flight predicted plain serving 31 % busy where it was 97 %,
    went plain, predicted the pipeline 22 % busy, went back, and answered 0.81x the forced
    pipeline (docs/results/engines-off-tables)."""
    measured = sum(window.busy_s)
    if measured <= 0 or tabled_s <= 0:  # nothing measured or nothing tabled: nothing to go by
        return 1.0
    host = window.stub_s + (window.server_s or 0.0) + window.others_s
    return min(max((measured - host) / tabled_s, 1.0), (measured + host) / tabled_s)


def moved(value: float, since: float, share: float = SWITCH_GAIN) -> bool:
    """Whether ``value`` lies more than ``share`` of ``since`` from it: a load (or a queue) that
    moved, which the trials and the switch's pairs of windows take for another."""
    return abs(value - since) > share * since


def in_model(rate: float, took_s: float | None) -> float | None:
    """The requests in the model at ``rate`` answers/s, each taking ``took_s`` (Little's law);
    None where the latency went unmeasured."""
    return None if took_s is None else rate * took_s


def load_moved(rate: float, took_s: float | None, since: float, since_s: float | None) -> bool:
    """Whether a load at ``rate`` answers/s, its requests taking ``took_s`` (``measured_s``), is
    another than one seen at ``since`` in ``since_s``: its answers/s moved, and so did the
    requests in the model (Little's law: answers/s times latency) where both were measured. A
    closed loop served sooner answers more with as many requests in the model, and an open load
    served sooner answers as many: neither is another load. (Read by answers/s alone, three 0.7 ms
    stages at 16 in flight kept returning at once from a trial at 1,591 answers/s, answered 1,888
    so, took that for another load, waited again and tried again, round after round:
    docs/results/entry-wait-kept-load.)"""
    if not moved(rate, since):
        return False
    held, held_since = in_model(rate, took_s), in_model(since, since_s)
    return held is None or held_since is None or moved(held, held_since)


def half_octave(value: float) -> int:
    """Which half octave ``value`` (at least 1) lies in: the windows of one load or batch size."""
    return round(2 * math.log2(max(value, 1.0)))
